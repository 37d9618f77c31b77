"""The stores in ``tests/data/format497`` and what diskreplay at commit 497696e read from them.

Run with a checkout of 497696e (the stores and the expected results must come from that
code, not from the code under test):

    PYTHONPATH=<a checkout of 497696e> python tests/support/make_format497.py OUTDIR

(``--record-only OUTDIR`` records ``expected.json`` again from the stores already there,
leaving them as they are: a new store, killed ones included, would differ from the
committed one.)

OUTDIR is ``tests/data/format497``. It writes, for both backends, small stores through the
public API only (``DiskReplay.create``, ``add``, ``sample``, ``update_priorities``,
``flush``, ``close``):

- ``plain1``: one env, 40 transitions in 16 slots (wrapped), dones but no autoresets;
- ``plain3``: three envs, 60 transitions in 24 slots, ``use_cer``, two extra fields;
- ``jumps2``: two envs that autoreset (the true final states passed as next states: the
  jump ring), 50 transitions in 20 slots, flushed half way;
- ``stack4``: ``frame_stack=4`` of uint8 (8, 8) frames, two envs, 16 slots (env-major
  frames, format 3), 40 transitions with autoresets;
- ``stack4slot``: the same with three envs in 16 slots (frames in slot order, format 2);
- ``prio``: prioritized, 50 transitions in 32 slots, priorities updated three times;
- ``killed``: two envs that autoreset, 32 slots, ``flush_every=8``, written by a child
  process killed with SIGKILL in the middle of its adds, after 80 transitions: the fixture
  is left as the kill left it, so that whoever opens it recovers it;
- ``killedadd``: the same, with env 0 autoresetting at every step (every add takes the
  general path, which a Python signal handler can interrupt), killed inside an ``add`` after 84
  (tried until a writer reopening a copy says it restored the rows of the add in flight).

and then ``expected.json``: what the old code gives for each store, every time on a fresh
copy (the fixtures are never opened in place), once as if opened in the boot that wrote
them ("same_boot": a killed writer is a process crash) and once as if after a reboot
("other_boot": the store rolls back to its last flush), see ``boot``:

- ``read``: ``verify_store`` of the copy, a ``mode="r"`` open (recovery warnings,
  ``describe``), ``verify_store`` again, and whether the reader left every file as it was;
- ``write``: a ``mode="r+"`` open (recovery warnings, ``describe``), ``add_more``,
  ``describe``, ``close``, ``verify_store``, then ``describe`` of a ``mode="r"`` reopen;
- ``convert``: ``DiskReplay.convert`` to the other backend (a killed store is refused
  until a writer recovered it: recorded, then opened ``r+`` once and converted), then back
  again, each result described.

``tests/features/test_format497.py`` runs the same procedures with the current code and compares
with ``expected.json``. Everything here uses only numpy and diskreplay's public API,
except ``boot``, which sets the boot id recovery compares with (as tests/durability/test_power_loss.py
does), and which knows the module it lives in at 497696e and now.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings

import numpy as np

FORMAT497_COMMIT = "497696e"
VECTOR = {"states": [[4], "float32"], "actions": [[], "int64"], "rewards": [[], "float32"], "dones": [[], "bool"]}
EXTRAS = {"truncateds": [[], "bool"], "log_probs": [[], "float32"]}
STACK = {"states": [[4, 8, 8], "uint8"], "actions": [[], "int64"], "rewards": [[], "float32"], "dones": [[], "bool"]}

# name -> how the store is made (kept in expected.json too; the test takes it from there)
STORES = {
    "plain1": {"mode": "plain", "max_size": 16, "num_envs": 1, "seed": 1, "fields": VECTOR, "steps": 40},
    "plain3": {"mode": "plain", "max_size": 24, "num_envs": 3, "seed": 2, "fields": {**VECTOR, **EXTRAS},
               "use_cer": True, "steps": 20},
    "jumps2": {"mode": "jumps", "max_size": 20, "num_envs": 2, "seed": 3, "fields": VECTOR, "steps": 25,
               "flush_at": 12},
    "stack4": {"mode": "jumps", "max_size": 16, "num_envs": 2, "seed": 4, "fields": STACK, "frame_stack": 4,
               "steps": 20},
    "stack4slot": {"mode": "jumps", "max_size": 16, "num_envs": 3, "seed": 5, "fields": STACK, "frame_stack": 4,
                   "steps": 12},
    "prio": {"mode": "plain", "max_size": 32, "num_envs": 1, "seed": 6, "fields": VECTOR, "steps": 50,
             "prioritized": True, "alpha": 0.6, "epsilon": 1e-6},
    "killed": {"mode": "jumps", "max_size": 32, "num_envs": 2, "seed": 7, "fields": VECTOR, "flush_every": 8,
               "kill_after": 80, "kill": "between"},
    "killedadd": {"mode": "jumps", "max_size": 32, "num_envs": 2, "seed": 8, "fields": VECTOR, "flush_every": 8,
                  "episode": 1, "kill_after": 84, "kill": "during"},
}
KILL_TRIES = 200  # children started, at most, until one is killed during an add
BACKENDS = ("memmap", "hdf5")
OTHER = {"memmap": "hdf5", "hdf5": "memmap"}
MORE_STEPS = 3  # steps add_more adds after a reopen
MORE_START = 1000  # their step numbers start here (fresh states: a jump for every env)


def fixtures():
    """``(fixture name, store name, backend)`` of every fixture store."""
    return [(f"{name}-{backend}", name, backend) for name in STORES for backend in BACKENDS]


# ---------------------------------------------------------------- the transitions
def frame(step: int, env: int, episode: int) -> np.ndarray:
    return ((np.arange(64, dtype=np.int64).reshape(8, 8) + 7 * step + 31 * env + 13 * episode) % 256).astype(np.uint8)


class Walker:
    """Steps of ``num_envs`` envs, computed from step numbers (no random generator, so that
    any numpy gives the same). Env ``e``'s episodes last ``5 + 2e`` steps and end with a
    done; in mode ``plain`` the next episode starts from the last next state (no jump),
    in mode ``jumps`` from a fresh state (an autoreset: the store keeps the true next state
    given at the episode end in its jump ring). ``spec["episode"]`` replaces the 5. Frame-stack stores get stacks of the
    newest ``k`` frames, a fresh episode's stack its first frame repeated."""

    def __init__(self, spec: dict, start: int = 0):
        self.spec, self.n, self.k = spec, spec["num_envs"], spec.get("frame_stack")
        self.step = start
        self.episode = [0] * self.n
        self.t = [0] * self.n
        self.obs = [self.fresh(e) for e in range(self.n)]

    def fresh(self, e: int) -> np.ndarray:
        if self.k:
            return np.stack([frame(self.step, e, self.episode[e])] * self.k)
        return np.array([10 * self.episode[e] + e, self.step, -e, 0.5 * self.episode[e]], np.float32)

    def next_of(self, e: int, obs: np.ndarray) -> np.ndarray:
        if self.k:
            return np.concatenate([obs[1:], frame(self.step + 1, e, self.episode[e])[np.newaxis]])
        return (obs + np.float32(0.25 * (1 + e))).astype(np.float32)

    def args(self) -> tuple[list, dict]:
        """The next step's ``add`` arguments, and its keyword arguments (the extra fields)."""
        n, step = self.n, self.step
        states = np.stack(self.obs)
        nexts = [self.next_of(e, self.obs[e]) for e in range(n)]
        dones = np.array([self.t[e] == self.spec.get("episode", 5) - 1 + 2 * e for e in range(n)])
        actions = np.array([(3 * step + e) % 5 for e in range(n)], np.int64)
        rewards = np.array([(step % 7) * 0.5 - e for e in range(n)], np.float32)
        extra = {}
        if "truncateds" in self.spec["fields"]:
            extra["truncateds"] = np.array([(step + e) % 11 == 10 for e in range(n)])
            extra["log_probs"] = np.array([-(step + e) / 10 for e in range(n)], np.float32)
        args = [states, actions, rewards, np.stack(nexts), dones]
        self.step += 1
        for e in range(n):
            if dones[e] and self.spec["mode"] == "jumps":
                self.episode[e] += 1
                self.t[e] = 0
                self.obs[e] = self.fresh(e)
            else:
                self.t[e] = 0 if dones[e] else self.t[e] + 1
                self.obs[e] = nexts[e]
        if n == 1:
            return [v[0] for v in args], {k: v[0] for k, v in extra.items()}
        return args, extra

    def add(self, buf) -> None:
        args, extra = self.args()
        buf.add(*args, **extra)


def fields_of(spec: dict) -> dict:
    return {name: (tuple(shape), dtype) for name, (shape, dtype) in spec["fields"].items()}


def create(path: str, spec: dict, backend: str):
    from diskreplay import DiskReplay
    kwargs = {k: spec[k] for k in ("use_cer", "prioritized", "alpha", "epsilon", "frame_stack", "flush_every")
              if k in spec}
    return DiskReplay.create(path, spec["max_size"], num_envs=spec["num_envs"], backend=backend, seed=spec["seed"],
                             fields=fields_of(spec), batch_size=8, **kwargs)


def priorities_for(idxs, round_: int) -> np.ndarray:
    return np.array([(int(i) % 5) + 0.1 * round_ + 0.05 * j for j, i in enumerate(idxs)], np.float64)


def build(path: str, spec: dict, backend: str) -> None:
    """Write the (not killed) store ``spec`` describes at ``path``."""
    walker = Walker(spec)
    with create(path, spec, backend) as buf:
        for step in range(spec["steps"]):
            walker.add(buf)
            if step + 1 == spec.get("flush_at"):
                buf.flush()
            if spec.get("prioritized") and step + 1 in (20, 40, 50):
                buf.sample(8)
                buf.update_priorities(buf.batch_idxs, priorities_for(buf.batch_idxs, step + 1))
                if step + 1 == 40:
                    buf.flush()


def child(path: str, name: str, backend: str) -> None:
    """A killed store's writer: adds forever (sampling now and then), printing
    ``seen_size`` after every add, until it is killed. Its parent kills it (``"between"``:
    most likely between two adds), or (``"during"``) once ``kill_after`` transitions are in,
    it stops printing and kills itself with SIGKILL from a timer's signal handler, which
    Python runs between two bytecodes: most often inside an ``add``."""
    spec = STORES[name]
    walker = Walker(spec)
    buf = create(path, spec, backend)
    armed = False
    while True:
        walker.add(buf)
        if walker.step % 10 == 0:
            buf.sample(8)
        if not armed:
            print(buf.seen_size, flush=True)
            if spec["kill"] == "during" and buf.seen_size >= spec["kill_after"]:
                armed = True
                signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGKILL))
                signal.setitimer(signal.ITIMER_REAL, 1e-6 * (int.from_bytes(os.urandom(2), "little") % 300 + 1))


def kill_child(path: str, name: str, backend: str) -> None:
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", path, name, backend],
                            stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if int(line) >= STORES[name]["kill_after"]:
                if STORES[name]["kill"] == "between":
                    os.kill(proc.pid, signal.SIGKILL)
                break
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, proc.returncode


def build_killed(path: str, name: str, backend: str) -> None:
    """A store whose writer was killed; for ``"during"``, tried until the kill came inside an
    ``add`` (a writer reopening the store says it restored the rows that add was writing)."""
    for _ in range(KILL_TRIES):
        if os.path.exists(path):
            shutil.rmtree(path)
        kill_child(path, name, backend)
        if STORES[name]["kill"] == "between":
            return
        with tempfile.TemporaryDirectory() as work:
            copy = os.path.join(work, "store")
            shutil.copytree(path, copy)
            with opened(copy, "r+") as (_, notes):
                if any("during an add" in note for note in notes):
                    return
    raise RuntimeError(f"no child of {KILL_TRIES} was killed during an add")


def add_more(buf, spec: dict) -> None:
    """What ``write`` adds after a reopen: ``MORE_STEPS`` steps from fresh states (and, in a
    prioritized store, new priorities of slots 0..2)."""
    walker = Walker(spec, start=MORE_START)
    for _ in range(MORE_STEPS):
        walker.add(buf)
    if spec.get("prioritized"):
        buf.update_priorities([0, 1, 2], [3.0, 0.5, 7.0])


# ---------------------------------------------------------------- what is recorded
def digest(value) -> str:
    """The first 64 bits of the sha256 of an array's dtype, shape and bytes."""
    a = np.ascontiguousarray(value)
    h = hashlib.sha256(f"{a.dtype.str} {a.shape} ".encode())
    h.update(a.tobytes())
    return h.hexdigest()[:16]


def batch_digest(batch: dict) -> dict:
    return {key: digest(value) for key, value in sorted(batch.items())}


def files_digest(path: str) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            with open(full, "rb") as f:
                h.update(name.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


INFO_KEYS = ("backend", "format_version", "max_size", "size", "seen_size", "head", "num_envs", "batch_size",
             "use_cer", "prioritized", "alpha", "epsilon", "fields", "frame_stack")


def describe(buf, last_flush: bool = False, stats: bool = False) -> dict:
    """Counters, every row (plain, its jump flag, 3-step), priorities, the store's sampler's
    next two batches, a seeded batch and the episodes of an open store (and the time of its
    last flush, and ``compute_stats`` with returns and tallies, when asked)."""
    from diskreplay.stats import compute_stats
    from diskreplay.views import sample_batch, store_info
    info = store_info(buf)
    out = {"info": {k: info[k] for k in INFO_KEYS}, "len": len(buf), "ns_buffer": digest(buf.ns_buffer)}
    if last_flush:
        out["last_flush_ns"] = buf.last_flush_ns
    if stats:
        out["stats"] = json.loads(json.dumps(compute_stats(buf, keep_returns=True, keep_tallies=True),
                                             default=lambda v: v.tolist() if isinstance(v, np.ndarray) else v.item()))
    slots = np.arange(buf.size)
    out["rows"] = batch_digest(buf.get(slots))
    out["jumps"] = buf.get(slots, fields=["jumps"])["jumps"].astype(int).tolist()
    out["nstep"] = batch_digest(buf.get(slots, n_step=3, gamma=0.9))
    if buf.prioritized:
        out["priorities"] = buf.get(slots, fields=["priorities"])["priorities"].tolist()
    out["samples"] = []
    for _ in range(2):
        batch = buf.sample(8)
        out["samples"].append({"idxs": np.asarray(buf.batch_idxs).tolist(), "batch": batch_digest(batch)})
    idxs, batch = sample_batch(buf, 8, seed=0)
    out["seeded"] = {"idxs": np.asarray(idxs).tolist(), "batch": batch_digest(batch)}
    episodes = list(buf.episodes())
    out["episodes"] = {"env": [int(ep["env"]) for ep in episodes],
                       "complete": [int(ep["complete"]) for ep in episodes],
                       "first_slot": [int(ep["slots"][0]) for ep in episodes],
                       "length": [len(ep["slots"]) for ep in episodes],
                       "data": digest(np.array([[digest(v) for k, v in sorted(ep.items()) if isinstance(v, np.ndarray)]
                                                for ep in episodes]))}
    return out


def verify(path: str) -> dict:
    from diskreplay.verify import verify_store
    report = verify_store(path)
    return {"ok": report.ok, "problems": report.problems, "notes": report.notes, "checked": report.checked}


@contextlib.contextmanager
def opened(path: str, mode: str):
    """``(buf, recovery warnings)`` of ``DiskReplay.open``, closed at the end."""
    from diskreplay import DiskReplay, RecoveryWarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        buf = DiskReplay.open(path, mode=mode)
    try:
        yield buf, [str(w.message) for w in caught if issubclass(w.category, RecoveryWarning)]
    finally:
        buf.close()


@contextlib.contextmanager
def boot(boot_id: int):
    """Recovery, while this runs, takes ``boot_id`` for this boot's id."""
    try:
        from diskreplay.format import counters  # the current layout
    except ImportError:
        from diskreplay import counters  # 497696e
    real = counters.current_boot_id
    counters.current_boot_id = lambda: boot_id
    try:
        yield
    finally:
        counters.current_boot_id = real


def boot_ids(recorded: int) -> dict:
    """The boot id for each case: the one the stores were written in, and another."""
    return {"same_boot": recorded, "other_boot": recorded ^ 0x5A5A}


def real_boot_id() -> int:
    try:
        from diskreplay.format import counters
    except ImportError:
        from diskreplay import counters
    return counters.current_boot_id()


def run_read(path: str, spec: dict) -> dict:
    before = files_digest(path)
    out = {"verify_before": verify(path)}
    with opened(path, "r") as (buf, notes):
        out["recovery"] = notes
        out["state"] = describe(buf, last_flush=True, stats=True)
    out["verify_after"] = verify(path)
    out["files_unchanged"] = files_digest(path) == before
    return out


def run_write(path: str, spec: dict) -> dict:
    out = {}
    with opened(path, "r+") as (buf, notes):
        out["recovery"] = notes
        out["opened"] = describe(buf)
        add_more(buf, spec)
        out["added"] = describe(buf)
    out["verify"] = verify(path)
    with opened(path, "r") as (buf, notes):
        out["reopen_recovery"] = notes
        out["reopened"] = describe(buf, stats=True)
    return out


def run_convert(path: str, spec: dict, backend: str, work: str) -> dict:
    from diskreplay import DiskReplay, DiskReplayError
    there, back = os.path.join(work, "there"), os.path.join(work, "back")
    out = {}
    try:
        DiskReplay.convert(path, there, backend=OTHER[backend])
        out["raw"] = "converted"
    except DiskReplayError as e:
        out["raw"] = type(e).__name__
        with opened(path, "r+") as (_, notes):
            out["recovery"] = notes
        DiskReplay.convert(path, there, backend=OTHER[backend])
    with opened(there, "r") as (buf, _):
        out["there"] = describe(buf)
    out["there_verify"] = verify(there)
    DiskReplay.convert(there, back, backend=backend)
    with opened(back, "r") as (buf, _):
        out["back"] = describe(buf)
    out["back_verify"] = verify(back)
    return out


SCENARIOS = ("read", "write", "convert")


def run(scenario: str, fixture: str, spec: dict, backend: str, work: str) -> dict:
    """``scenario`` on a fresh copy, in ``work``, of the fixture store at ``fixture``."""
    path = os.path.join(work, "store")
    shutil.copytree(fixture, path)
    if scenario == "read":
        out = run_read(path, spec)
    elif scenario == "write":
        out = run_write(path, spec)
    else:
        out = run_convert(path, spec, backend, work)
    return json.loads(json.dumps(out).replace(os.path.realpath(work), "<work>").replace(work, "<work>"))


def dumps(value, indent: str = "") -> str:
    """JSON with a line per key, lists of numbers and strings on one line."""
    inner = indent + " "
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k)}: {dumps(v, inner)}" for k, v in sorted(value.items())]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(inner + dumps(v, inner) for v in value) + "\n" + indent + "]"
    return json.dumps(value)


# ---------------------------------------------------------------- main
def main(outdir: str, build_stores: bool = True) -> None:
    os.makedirs(outdir, exist_ok=True)
    for fixture, name, backend in fixtures() if build_stores else ():
        path = os.path.join(outdir, fixture)
        if os.path.exists(path):
            shutil.rmtree(path)
        if "kill" in STORES[name]:
            build_killed(path, name, backend)
        else:
            build(path, STORES[name], backend)
    recorded = real_boot_id()
    if not build_stores:  # the boot the stores were written in
        with open(os.path.join(outdir, "expected.json")) as f:
            recorded = json.load(f)["boot_id"]
    expected = {"commit": FORMAT497_COMMIT, "numpy": np.__version__, "boot_id": recorded, "stores": {}}
    for fixture, name, backend in fixtures():
        entry = expected["stores"][fixture] = {"store": name, "backend": backend, "spec": STORES[name]}
        for case, boot_id in boot_ids(recorded).items():
            entry[case] = {}
            for scenario in SCENARIOS:
                with tempfile.TemporaryDirectory() as work, boot(boot_id):
                    entry[case][scenario] = run(scenario, os.path.join(outdir, fixture), STORES[name], backend, work)
        if entry["other_boot"] == entry["same_boot"]:
            entry["other_boot"] = "same_boot"  # a store closed cleanly: the boot does not matter
        print(fixture, "seen_size", entry["same_boot"]["read"]["state"]["info"]["seen_size"],
              "recovery:", entry["same_boot"]["write"]["recovery"] or "-")
    with open(os.path.join(outdir, "expected.json"), "w") as f:
        f.write(dumps(expected) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(*sys.argv[2:5])
    elif sys.argv[1] == "--record-only":  # the stores in OUTDIR as they are, recorded again
        main(sys.argv[2], build_stores=False)
    else:
        main(sys.argv[1])
