"""ShardedReplay on a Ray cluster of two nodes (``ray.cluster_utils.Cluster``: two raylets on
this machine, each a node with its own id): shards run on the nodes ``nodes`` names, their
env runners write there, and the learner samples the union. A module of its own because it
needs its own Ray session (tests/integrations/test_ray.py keeps one ``ray.init`` for its module)."""
from __future__ import annotations

import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from diskreplay import DiskReplay
from diskreplay.ray import ShardedReplay

FIELDS = {"states": ((2,), "int64"), "actions": ((), "int64"), "rewards": ((), "float32"), "dones": ((), "bool")}


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    try:
        yield [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    finally:
        ray.shutdown()
        cluster.shutdown()


@ray.remote(num_cpus=0)
def runner(writer, ids):
    """An env runner on the shard's node: where it ran and the shard's seen_size after its adds."""
    ids = np.asarray(ids, np.int64)
    states = np.stack([ids, ids], axis=1)
    seen = ray.get(writer.add_many.remote(states, ids, ids.astype(np.float32), states + 1, np.zeros(len(ids), bool)))
    return ray.get_runtime_context().get_node_id(), seen


def test_shards_run_on_the_nodes_given_and_sample_the_union(two_nodes, tmp_path):
    assert len(two_nodes) == 2
    placement = [two_nodes[1], two_nodes[0]]  # the reverse of Ray's listing, so pinning is what puts them there
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    with ShardedReplay.create(paths, 100, nodes=placement, fields=FIELDS, seed=3) as sharded:
        assert sharded.nodes == placement
        pids = [ray.get(sharded.writer(i).pid.remote()) for i in range(2)]
        assert pids[0] != pids[1]
        ran = ray.get([runner.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                       .remote(sharded.writer(i), range(100 * i, 100 * i + 40)) for i, node in enumerate(placement)])
        assert ran == [(placement[0], 40), (placement[1], 40)]
        batch = sharded.sample(512)
        assert set(batch["actions"].tolist()) == set(range(40)) | set(range(100, 140))
        assert ((batch["actions"] >= 100) == (batch["shards"] == 1)).all()
    # each store is a plain local store once its actor is gone
    for i, path in enumerate(paths):
        with DiskReplay.open(path, mode="r") as buf:
            assert buf.size == 40 and set(buf.get(np.arange(40))["actions"].tolist()) == set(range(100 * i, 100 * i + 40))
