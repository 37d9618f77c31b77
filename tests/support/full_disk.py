"""A store on a small tmpfs that another program fills (issue 35 item 3), run by
tests/durability/test_full_disk.py:

    python full_disk.py DIR BACKEND [worst plain|stack4]

In a mount namespace of its own (and a user namespace when not root), mounts a 24 MiB tmpfs
at ``DIR``, creates a store there, fills the rest of the tmpfs with a file of its own (the
other program), then adds steps whose episode ends write the jump ring's sparse
``jump_states.npy`` until an add raises ``InsufficientSpaceError``. Checks that the failed
add changed nothing, that the writer still refuses with the same error (not "an earlier sync
failed"; steps without an episode end still add), then deletes the filler and goes on adding with the same writer object, flushes,
closes and reopens: every acknowledged step must be back. Prints one JSON line. With
``worst``: create's free-space count is enough for the side files' worst case
(``worst_case``).
"""
import ctypes
import json
import os
import sys

import numpy as np

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18


def private_tmpfs(directory: str, size: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | (0 if uid == 0 else CLONE_NEWUSER)
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    if uid != 0:  # become root of the new user namespace, which may mount a tmpfs
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"0 {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"0 {gid} 1")
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:  # our mounts stay ours
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    if libc.mount(b"tmpfs", directory.encode(), b"tmpfs", 0, f"size={size}".encode()) != 0:
        raise OSError(ctypes.get_errno(), f"mount tmpfs on {directory}")


def fill(path: str) -> int:
    """Take every free byte (another program filling the disk); returns the bytes taken."""
    chunk, total = bytes(1 << 16), 0
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                total += f.write(chunk)
            except OSError:
                break
        for size in (4096, 512, 1):
            while True:
                try:
                    total += f.write(chunk[:size])
                except OSError:
                    break
    return total


def step(t: int, n: int):
    ts = np.arange(t, t + n)
    states = np.repeat(ts[:, None].astype(np.float32), 64, axis=1)
    dones = ts % 3 == 0
    next_states = states + n
    next_states[dones] = -1.0  # a terminal observation: the next step's state differs (a jump)
    return states, ts, (ts % 7).astype(np.float32), next_states, dones


def worst_case(directory: str, backend: str, kind: str) -> dict:
    """A tmpfs of just the size create asks for (its refusal names the bytes), and a store
    whose side files then reach their worst case (every step an episode end with a terminal
    state; frame stacks: every step a new stack) for three laps: no ENOSPC after create."""
    import re
    from diskreplay import DiskReplay, InsufficientSpaceError
    frame_stack = 4 if kind == "stack4" else None
    shape = (4, 12, 12) if frame_stack else (64,)
    fields = {"states": (shape, "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"), "dones": ((), "bool")}
    store, n, m = os.path.join(directory, "s"), 2, 600
    try:
        DiskReplay.create(store, m, num_envs=n, backend=backend, fields=fields, seed=0, frame_stack=frame_stack)
        raise AssertionError("a 64 KiB tmpfs held the store")
    except InsufficientSpaceError as exc:
        needed = int(re.search(r"needs [^(]*\((\d+) bytes\)", str(exc)).group(1))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount(directory.encode()) != 0:
        raise OSError(ctypes.get_errno(), "umount")
    size = needed + 64 * 1024  # the count plus a little for the filesystem's own blocks
    if libc.mount(b"tmpfs", directory.encode(), b"tmpfs", 0, f"size={size}".encode()) != 0:
        raise OSError(ctypes.get_errno(), "mount")
    rng = np.random.default_rng(0)
    buf = DiskReplay.create(store, m, num_envs=n, backend=backend, fields=fields, seed=0, frame_stack=frame_stack)
    refused = None
    try:
        while buf.seen_size < 3 * m:
            states = rng.integers(0, 255, (n,) + shape, dtype=np.uint8)
            next_states = rng.integers(0, 255, (n,) + shape, dtype=np.uint8)  # never the next step's states
            ts = np.arange(buf.seen_size + 1, buf.seen_size + 1 + n)
            buf.add(states, ts, np.ones(n, np.float32), next_states, np.ones(n, bool))
        buf.flush()
    except InsufficientSpaceError as exc:
        refused = str(exc)
    seen = buf.seen_size
    buf.close()
    st = os.statvfs(directory)
    return {"kind": kind, "frame_stack": frame_stack, "needed": needed, "tmpfs": size, "refused": refused, "seen": seen, "laps": seen / m,
            "free_at_end": st.f_bavail * st.f_frsize}


def main() -> None:
    directory, backend = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3 and sys.argv[3] == "worst":
        private_tmpfs(directory, "64k")
        print(json.dumps(worst_case(directory, backend, sys.argv[4])))
        return
    private_tmpfs(directory, "24m")
    from diskreplay import DiskReplay, InsufficientSpaceError
    store = os.path.join(directory, "s")
    fields = {"states": ((64,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    buf = DiskReplay.create(store, 4000, num_envs=2, backend=backend, fields=fields, seed=0)
    out = {"filler_bytes": fill(os.path.join(directory, "filler"))}
    acked, refused = 0, None
    while refused is None and acked < 20 * buf.max_size:
        try:
            buf.add(*step(buf.seen_size + 1, 2))
            acked = buf.seen_size
        except InsufficientSpaceError as exc:
            refused = str(exc)
    out["refused"] = refused
    out["acked_at_refusal"] = acked
    out["seen_after_refusal"] = buf.seen_size
    out["again"] = []
    for _ in range(6):  # still full: steps with a jump are refused alike, the others added
        try:
            buf.add(*step(buf.seen_size + 1, 2))
            out["again"].append("added")
        except Exception as exc:  # noqa: BLE001 - reported
            out["again"].append(f"{type(exc).__name__}: {exc}")
    os.unlink(os.path.join(directory, "filler"))  # the other program frees its space
    for _ in range(50):
        buf.add(*step(buf.seen_size + 1, 2))
    out["seen_after_freeing"] = buf.seen_size
    buf.flush()
    buf.close()
    with DiskReplay.open(store, mode="r") as reader:
        got = reader.get(np.arange(reader.size))
        seen, size, base = reader.seen_size, reader.size, 0
        ts = np.arange(seen - size + 1, seen + 1)
        slots = (ts - base - 1) % reader.max_size
        out["reopened_seen"] = seen
        out["rows_right"] = bool((got["actions"][slots] == ts).all() and (got["states"][slots, 0] == ts).all())
        want_next = np.where(ts % 3 == 0, -1.0, ts + 2)
        out["next_states_right"] = bool((got["next_states"][slots, 0] == want_next).all())
        out["damaged"] = reader.verify_rows()[1]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
