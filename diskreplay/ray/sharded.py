"""``ShardedReplay``: one replay memory over stores on several nodes, each behind a Ray actor.

Writers stay on their node: ``writer(i)`` is shard ``i``'s actor handle, which env runners
on that node call directly (Ray sends their rows worker to worker; the driver never sees
them). The learner's ``sample`` asks each shard for its size, splits the batch
(``split.split_batch``) and gathers every shard's share with several requests in flight.
A shard that does not answer is left out, with a ``ShardUnavailableWarning``, until Ray
has restarted it and it answers again.
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..errors import (DuplicateShardError, EmptyStoreError, InvalidArgumentError, ShardMismatchError,
                      ShardUnavailableError, ShardUnavailableWarning, StoreClosedError, UnknownNodeError)
from ..core.prefetch import Prefetcher
from ..core.schema import check_count
from .shard import shard_actor
from .split import chunk_counts, split_batch

__all__ = ["ShardedReplay"]

# A shard that has not answered (its size, or its rows) within this many seconds is left out of that batch.
PROBE_TIMEOUT = 2.0
_DOWN = (RayActorError, GetTimeoutError)  # ActorDiedError and ActorUnavailableError derive from RayActorError


class ShardedReplay:
    """A replay memory whose transitions live in one local store per shard (a Ray actor each)."""

    @classmethod
    def create(cls, paths, max_size, *, nodes=None, max_restarts: int = -1, requests_per_shard: int = 4,
               seed: int | None = None, **create_kwargs) -> "ShardedReplay":
        """One shard actor per path, each creating (or resuming, if the store exists) a
        ``DiskReplay`` of ``max_size`` slots with ``create_kwargs`` (as ``DiskReplay.create``).
        ``nodes[i]`` pins shard ``i`` to a Ray node id (None: anywhere). On bad input nothing
        is left half-created: stores this call created are removed and its actors killed."""
        max_size = check_count("max_size", max_size)
        if create_kwargs.get("prioritized"):
            raise InvalidArgumentError(UNIFORM_ONLY)
        return cls._start(paths, max_size, "r+", nodes, max_restarts, requests_per_shard, seed, create_kwargs)

    @classmethod
    def open(cls, paths, *, mode: str = "r+", nodes=None, max_restarts: int = -1, requests_per_shard: int = 4,
             seed: int | None = None) -> "ShardedReplay":
        """Attach to existing stores: ``mode="r+"`` writes through the actors; ``mode="r"``
        reads beside an in-process ``DiskReplay`` writing on the shard's node."""
        if mode not in ("r", "r+"):
            raise InvalidArgumentError(f"mode must be 'r' or 'r+', got {mode!r}")
        return cls._start(paths, None, mode, nodes, max_restarts, requests_per_shard, seed, {})

    @classmethod
    def _start(cls, paths, max_size, mode, nodes, max_restarts, requests_per_shard, seed, create_kwargs):
        if not ray.is_initialized():
            raise InvalidArgumentError("ShardedReplay needs a Ray cluster: call ray.init() first")
        paths, nodes = _check_placement(paths, nodes)
        requests_per_shard = check_count("requests_per_shard", requests_per_shard)
        if not isinstance(max_restarts, int) or max_restarts < -1:
            raise InvalidArgumentError(f"max_restarts must be an integer >= -1 (-1: always), got {max_restarts!r}")
        actor_class = shard_actor(max_restarts, concurrency=requests_per_shard + 2)
        actors = []
        for path, node in zip(paths, nodes):
            options = {} if node is None else {
                "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}
            actors.append(actor_class.options(**options).remote(path, max_size, mode, create_kwargs))
        starts = [actor.start.remote() for actor in actors]
        infos, failure = [], None
        for ref in starts:
            try:
                infos.append(ray.get(ref))
            except Exception as exc:  # the first failure is raised once every shard is undone
                infos.append(None)
                failure = failure or _unwrap(exc)
        if failure is None:
            failure = _check_compatible(infos)
        if failure is not None:
            ray.get([a.destroy.remote() for a, info in zip(actors, infos) if info is not None])
            for actor in actors:
                ray.kill(actor, no_restart=True)
            raise failure
        return cls(actors, infos, requests_per_shard, seed, mode)

    def __init__(self, actors, infos, requests_per_shard: int, seed, mode: str = "r+"):
        """Bind to started shard actors (use :meth:`create` or :meth:`open`)."""
        self._actors = list(actors)
        self.paths = [info["path"] for info in infos]
        self.nodes = [info["node"] for info in infos]
        self.num_envs = infos[0]["num_envs"]
        self.max_sizes = [info["max_size"] for info in infos]
        self.requests_per_shard = requests_per_shard
        # A remote call costs about 0.7 ms on a loaded 2-core machine (docs/scale-out.md), so a
        # shard's share goes in several requests only when each carries this many rows or more.
        self.rows_per_request = 256
        self.unavailable: set[int] = set()  # shards left out of the last sample or sizes()
        self.batch_idxs: np.ndarray | None = None
        self.batch_shards: np.ndarray | None = None
        self._rng = np.random.default_rng(seed)
        self._closed = False
        self._mode = mode
        # Shards known to be full: a full shard written only through its actor (mode r+; the
        # actor has no reset) keeps size == max_size, so once all are, no batch needs a probe.
        self._full: set[int] = set()

    @property
    def num_shards(self) -> int:
        return len(self._actors)

    def writer(self, i: int):
        """Shard ``i``'s actor handle: ``add.remote(...)``, ``add_many.remote(...)`` (leading
        step axis on every argument) and ``flush.remote()``, each returning ``seen_size``."""
        self._check_open()
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < self.num_shards:
            raise InvalidArgumentError(f"shard index must be in [0, {self.num_shards}), got {i!r}")
        return self._actors[int(i)]

    # ------------------------------------------------------------------ sizes and health
    def sizes(self) -> list[int | None]:
        """Each shard's size; None for a shard that did not answer (dead or restarting)."""
        self._check_open()
        return self._probe()

    def __len__(self) -> int:
        return sum(s for s in self.sizes() if s is not None)

    def _probe(self) -> list[int | None]:
        refs = [actor.size.remote() for actor in self._actors]
        ray.wait(refs, num_returns=len(refs), timeout=PROBE_TIMEOUT)
        sizes = []
        for i, ref in enumerate(refs):
            try:
                sizes.append(ray.get(ref, timeout=0))
            except _DOWN:
                sizes.append(None)
        self._report([i for i, s in enumerate(sizes) if s is None])
        return sizes

    def _report(self, down) -> None:
        newly = sorted(set(down) - self.unavailable)
        if newly:
            warnings.warn(f"shards {newly} ({', '.join(self.paths[i] for i in newly)}) did not answer; "
                          "left out of sampling until Ray restarts them", ShardUnavailableWarning, stacklevel=3)
        self.unavailable = set(down)

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int) -> dict:
        """``batch_size`` transitions drawn uniformly from the union of the answering shards,
        as one dict (``DiskReplay.sample``'s keys) plus ``shards`` and ``batch_idxs``: each
        row's shard index and slot. Raises ``EmptyStoreError`` when every answering shard is
        empty, ``ShardUnavailableError`` when none answers."""
        self._check_open()
        batch_size = check_count("batch_size", batch_size)
        for _ in range(self.num_shards + 1):
            sizes = self._sizes_for_split()
            live = [0 if s is None else s for s in sizes]
            if all(s is None for s in sizes):
                raise ShardUnavailableError(f"none of the {self.num_shards} shards answered within "
                                            f"{PROBE_TIMEOUT} s; wait for Ray to restart them")
            if sum(live) == 0:
                raise EmptyStoreError(f"cannot sample: every answering shard is empty ({self.paths}); "
                                      "add transitions first")
            batch = self._gather(split_batch(self._rng, batch_size, live))
            if batch is not None:
                return batch
        raise ShardUnavailableError("shards kept failing during the gather; wait for Ray to restart them")

    def _sizes_for_split(self) -> list[int | None]:
        if self._mode == "r+" and len(self._full) == self.num_shards:
            return list(self.max_sizes)
        sizes = self._probe()
        self._full = {i for i, size in enumerate(sizes) if size == self.max_sizes[i]}
        return sizes

    def _gather(self, counts) -> dict | None:
        """Rows of every shard's share, or None if a shard failed mid-way (the caller re-splits)."""
        requests = []
        for i, k in enumerate(counts):
            for part in chunk_counts(int(k), self.requests_per_shard, min_rows=self.rows_per_request):
                seed = int(self._rng.integers(2 ** 63))
                requests.append((i, self._actors[i].sample_rows.remote(part, seed)))
        ray.wait([ref for _, ref in requests], num_returns=len(requests), timeout=PROBE_TIMEOUT)
        parts, failed = [], []
        for i, ref in requests:
            try:
                parts.append((i, *ray.get(ref, timeout=0)))
            except _DOWN:
                failed.append(i)
        if failed:
            self._full -= set(failed)  # probed again before the next split
            self._report(sorted(self.unavailable | set(failed)))
            return None
        shards = np.concatenate([np.full(len(idxs), i, np.int64) for i, _, idxs, _ in parts])
        idxs = np.concatenate([idxs for _, _, idxs, _ in parts]).astype(np.int64)
        order = self._rng.permutation(len(idxs))  # independent draws, not grouped by shard
        keys = next(rows for _, _, _, rows in parts if rows).keys()
        batch = {key: np.concatenate([rows[key] for _, _, _, rows in parts if rows])[order] for key in keys}
        self.batch_shards, self.batch_idxs = shards[order], idxs[order]
        batch["shards"], batch["batch_idxs"] = self.batch_shards, self.batch_idxs
        return batch

    def batches(self, batch_size: int, *, prefetch: int = 2, count: int | None = None):
        """An iterator of ``sample(batch_size)`` batches prepared ``prefetch`` ahead in a
        background thread, as ``DiskReplay.batches``; use it as a context manager or close it."""
        self._check_open()
        batch_size = check_count("batch_size", batch_size)
        return Prefetcher(lambda: self.sample(batch_size), prefetch=prefetch, count=count)

    # ------------------------------------------------------------------ durability and closing
    def flush(self) -> list[int]:
        """Flush every shard (each survives a power cut up to here); returns their ``seen_size``."""
        self._check_open()
        return ray.get([actor.flush.remote() for actor in self._actors])

    def close(self) -> None:
        """Close every shard's store and end its actor. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            for ref in [actor.close.remote() for actor in self._actors]:
                try:
                    ray.get(ref)
                except RayActorError:
                    pass  # a dead shard's store was closed by its death; its next open recovers it
        finally:
            for actor in self._actors:
                ray.kill(actor, no_restart=True)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the sharded replay over {self.paths} is closed")

    def __enter__(self) -> "ShardedReplay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_placement(paths, nodes) -> tuple[list[str], list]:
    if isinstance(paths, (str, bytes, os.PathLike)) or not hasattr(paths, "__len__") or len(paths) == 0:
        raise InvalidArgumentError(f"paths must be a non-empty list of store paths, got {paths!r}")
    if any(not isinstance(p, (str, os.PathLike)) or not os.fspath(p) for p in paths):
        raise InvalidArgumentError(f"every path must be a non-empty str or os.PathLike, got {list(paths)!r}")
    paths = [os.path.abspath(os.fspath(p)) for p in paths]
    nodes = [None] * len(paths) if nodes is None else list(nodes)
    if len(nodes) != len(paths):
        raise InvalidArgumentError(f"nodes must give one node id (or None) per path: {len(nodes)} for {len(paths)}")
    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    unknown = [n for n in nodes if n is not None and n not in alive]
    if unknown:
        raise UnknownNodeError(f"node ids {unknown} are not live nodes of this Ray cluster; "
                               f"live nodes: {sorted(alive)}")
    seen = {}
    for i, key in enumerate(zip(nodes, paths)):
        if key in seen:
            raise DuplicateShardError(f"shards {seen[key]} and {i} are the same store {key[1]}; "
                                      "give each shard its own path")
        seen[key] = i
    return paths, nodes


UNIFORM_ONLY = ("ShardedReplay samples its shards uniformly: prioritized stores are not supported yet (each "
                "shard would keep priorities that sampling across shards ignores, with no weights and no "
                "update_priorities); use uniform shards, or one DiskReplay with prioritized=True")


def _check_compatible(infos):
    first = infos[0]
    prioritized = [info["path"] for info in infos if info.get("prioritized")]
    if prioritized:
        return InvalidArgumentError(f"{prioritized[0]} is a prioritized store. {UNIFORM_ONLY}")
    for i, info in enumerate(infos[1:], 1):
        if info["num_envs"] != first["num_envs"]:
            return ShardMismatchError(f"shard {i} ({info['path']}) has num_envs {info['num_envs']}, shard 0 has "
                                      f"{first['num_envs']}; every shard needs the same")
        if None not in (info["fields"], first["fields"]) and info["fields"] != first["fields"]:
            return ShardMismatchError(f"shard {i} ({info['path']}) has fields {info['fields']}, shard 0 has "
                                      f"{first['fields']}; every shard needs the same fields")
    return None


def _unwrap(exc: BaseException) -> BaseException:
    """The exception a shard raised, out of Ray's ``RayTaskError`` wrapper."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc
