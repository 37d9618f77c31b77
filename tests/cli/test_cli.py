"""The ``diskreplay`` command line, in process through click's CliRunner; one smoke test per
command through the installed entry point.

The shared store is the README's (tests/support/readme_store.py): max_size 10, num_envs 2,
8 steps = transitions 1..16, of which 7..16 remain. Transition t has states [t, t, t],
actions t, rewards t/2, log_probs -t, next state [t+2]*3 and is done for t in DONES.
Transition t lives in slot (t - 1) % 10 and belongs to env (t - 1) % 2.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

from diskreplay import DiskReplay
from diskreplay.cli.main import main

from diskreplay.backends import BACKENDS
from cli_run import entry_point, invoke
from readme_store import DONES, FIELDS, MAX_SIZE, make_store

COMMANDS = ["info", "show", "stats", "episodes", "sample", "verify", "export", "plot", "watch", "convert"]


@pytest.fixture(scope="module", params=BACKENDS)
def store(request, tmp_path_factory):
    return make_store(tmp_path_factory.mktemp(request.param) / "s.replay", request.param)


@pytest.fixture(scope="module")
def memmap_store(tmp_path_factory):
    """One store for the tests whose subject is not the backend."""
    return make_store(tmp_path_factory.mktemp("one") / "s.replay", "memmap")


@pytest.fixture
def run():
    """The CLI in process (tests/support/cli_run.py); the entry point has its own smoke test per command."""
    return invoke


# One call per command through the installed script, as a shell runs it: the console-script
# entry, click's exit codes and stdout outside CliRunner. Every other test runs in process.
SMOKE = {
    "info": (["--json"], lambda r, out: r.json()["size"] == MAX_SIZE),
    "show": (["--tail", 2, "--json"], lambda r, out: [row["actions"] for row in r.json()] == [15, 16]),
    "stats": (["--json"], lambda r, out: r.json()["fields"]["rewards"]["count"] == MAX_SIZE),
    "episodes": (["--json"], lambda r, out: sum(ep["length"] for ep in r.json()) == MAX_SIZE),
    "sample": (["-n", 3, "--seed", 1, "--json"], lambda r, out: len(r.json()["actions"]) == 3),
    "verify": ([], None),  # checked below: its line names the store
    "export": (["{out}.npz"], lambda r, out: len(np.load(f"{out}.npz")["actions"]) == MAX_SIZE),
    "plot": (["{out}.png"], lambda r, out: os.path.getsize(f"{out}.png") > 0),
    "watch": (["--count", 1, "--interval", 0.05, "--json"], lambda r, out: json.loads(r.out)["size"] == MAX_SIZE),
    "convert": (["{out}.replay", "--backend", "hdf5"], lambda r, out: converted_size(f"{out}.replay") == MAX_SIZE),
}


def converted_size(path):
    with DiskReplay.open(path, mode="r") as buf:
        return buf.size


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_runs_from_the_entry_point(memmap_store, tmp_path, command):
    assert set(SMOKE) == set(COMMANDS)
    args, check = SMOKE[command]
    out = str(tmp_path / "out")
    r = entry_point(command, memmap_store, *[str(a).format(out=out) for a in args])
    assert r.code == 0, r
    assert check(r, out) if command != "verify" else r.out.startswith(f"{memmap_store}: OK"), r


def t_of_slot(slot):
    """Transition held by ``slot`` in the shared store (seen 16, head 5)."""
    return 16 - (5 - slot) % MAX_SIZE


def assert_fits(text, width=80):
    assert text.strip()
    assert all(len(line) <= width for line in text.splitlines()), text


# ---------------------------------------------------------------- help
def test_every_command_has_help(run):
    r = run("--help")
    assert r.code == 0
    for cmd in COMMANDS:
        assert cmd in r.out
    for cmd in COMMANDS:
        r = run(cmd, "--help")
        assert r.code == 0, r
        assert f"Usage: diskreplay {cmd}" in r.out
        assert "Example" in r.out


# ---------------------------------------------------------------- info
def test_info(store, run):
    r = run("info", store, "--json")
    assert r.code == 0 and r.err == ""
    d = r.json()
    assert d["path"] == str(store)
    assert d["backend"] in BACKENDS and d["format_version"] == 2
    assert (d["max_size"], d["size"], d["seen_size"], d["head"], d["num_envs"]) == (10, 10, 16, 5, 2)
    assert (d["batch_size"], d["use_cer"]) == (32, False)
    assert d["fields"]["states"] == {"shape": [3], "dtype": "float32"}
    assert d["fields"]["log_probs"] == {"shape": [], "dtype": "float32"}
    assert d["disk_bytes"] > 0 and d["writer_alive"] is False
    assert d["cold_reads"] == "through the mapping (small rows)"
    r = run("info", store)
    assert r.code == 0
    assert_fits(r.out)
    assert "seen_size       16" in r.out and "writer          none" in r.out


def test_info_says_how_cold_batches_are_read(tmp_path, run):
    """Stores of large frames read cold batches by positioned reads and keep their small
    fields in RAM; info names them, their size and whether they can be locked."""
    fields = {"states": ((4, 64, 64), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    with DiskReplay.create(tmp_path / "big", 1000, fields=fields) as buf:
        buf.add(np.zeros((4, 64, 64), np.uint8), 1, 0.0, np.zeros((4, 64, 64), np.uint8), False)
    d = run("info", tmp_path / "big", "--json").json()
    assert d["cold_reads"].startswith("frames by hinted reads; actions, rewards, dones in RAM (0.0 MiB, ")
    r = run("info", tmp_path / "big")
    assert r.code == 0 and "cold_reads      frames by hinted reads" in r.out
    assert_fits(r.out)


# ---------------------------------------------------------------- show
def test_show_tail_head_index(store, run):
    r = run("show", store, "--tail", 3, "--json")
    assert r.code == 0
    rows = r.json()
    assert [row["slot"] for row in rows] == [3, 4, 5]
    newest = rows[-1]
    assert newest == {"slot": 5, "transition": 16, "env": 1, "states": [16.0] * 3, "actions": 16, "rewards": 8.0,
                      "next_states": [18.0] * 3, "dones": False, "log_probs": -16.0}
    assert [row["dones"] for row in rows] == [True, True, False]

    rows = run("show", store, "--head", 2, "--json").json()
    assert [(row["slot"], row["actions"]) for row in rows] == [(6, 7), (7, 8)]

    rows = run("show", store, "--index", 0, 9, 2, "--fields", "actions,next_states", "--json").json()
    assert rows == [{"slot": 0, "transition": 11, "env": 0, "actions": 11, "next_states": [13.0] * 3},
                    {"slot": 9, "transition": 10, "env": 1, "actions": 10, "next_states": [12.0] * 3},
                    {"slot": 2, "transition": 13, "env": 0, "actions": 13, "next_states": [15.0] * 3}]

    # --env: only that env's transitions; --head/--tail count them.
    rows = run("show", store, "--tail", 3, "--env", 0, "--json").json()
    assert [(row["transition"], row["env"]) for row in rows] == [(11, 0), (13, 0), (15, 0)]
    rows = run("show", store, "--head", 2, "--env", 1, "--json").json()
    assert [row["transition"] for row in rows] == [8, 10]
    r = run("show", store, "--index", "0,9,2", "--env", 1, "--json")
    assert [row["slot"] for row in r.json()] == [9]
    assert "2 of the 3 slots given hold other envs' transitions; --env 1 leaves them out" in r.err
    assert "slots given" not in run("show", store, "--index", "9", "--env", 1).err
    assert len(run("show", store, "--tail", 100, "--env", 1, "--json").json()) == 5
    r = run("show", store, "--env", 2)
    assert r.code == 2 and "env must be in [0, 2)" in r.err

    r = run("show", store)  # default: the newest 10, oldest first
    assert r.code == 0
    assert_fits(r.out)
    lines = r.out.splitlines()
    assert lines[0].split() == ["slot", "t", "env", "states", "actions", "rewards", "next_states", "dones",
                                "log_probs"]
    assert [int(line.split()[0]) for line in lines[1:]] == [6, 7, 8, 9, 0, 1, 2, 3, 4, 5]
    assert lines[-1].split() == ["5", "16", "1", "[16", "16", "16]", "16", "8", "[18", "18", "18]", "False", "-16"]


def test_show_summarizes_large_arrays(tmp_path, run):
    path = tmp_path / "big.replay"
    with DiskReplay.create(path, 4, seed=0) as buf:
        for t in range(1, 6):
            frame = np.full((4, 84, 84), t, np.uint8)
            frame[0, 0, 0] = 0
            buf.add(frame, t, float(t), frame + 1, False)
    r = run("show", path, "--tail", 1)
    assert r.code == 0
    assert_fits(r.out)
    assert "4x84x84 0..5" in r.out
    rows = run("show", path, "--tail", 1, "--json").json()
    assert np.array(rows[0]["states"]).shape == (4, 84, 84)


# ---------------------------------------------------------------- stats
def test_stats(store, run):
    r = run("stats", store, "--json")
    assert r.code == 0 and r.err == ""
    d = r.json()
    assert (d["size"], d["seen_size"], d["dones"]) == (10, 16, 4)
    ts = np.arange(7, 17, dtype=np.float64)
    for name, values in (("states", ts), ("actions", ts), ("rewards", ts / 2), ("log_probs", -ts)):
        s = d["fields"][name]
        assert s["min"] == values.min() and s["max"] == values.max()
        assert s["mean"] == pytest.approx(values.mean()) and s["std"] == pytest.approx(values.std())
    assert d["fields"]["states"]["count"] == 30
    assert d["fields"]["dones"]["mean"] == pytest.approx(0.4)
    ep = d["episodes"]
    # env 0 (odd t): dones at 11, 15; the episode ending at 11 started before the wrap.
    # env 1 (even t): dones at 10, 14; only 12+14 is complete.
    assert ep["dones_per_env"] == [2, 2] and ep["complete_episodes_per_env"] == [1, 1]
    assert (ep["return_mean"], ep["return_min"], ep["return_max"]) == (13.5, 13.0, 14.0)
    r = run("stats", store)
    assert r.code == 0
    assert_fits(r.out)
    assert "returns over 2 complete episodes: mean 13.5, min 13, max 14" in r.out
    assert r.out.splitlines()[1].split() == ["field", "min", "max", "mean", "std", "nonfinite"]
    assert r.out.splitlines()[2].split() == ["states", "7", "16", "11.5", "2.87228", "0"]


def test_stats_of_the_newest_rows(store, run):
    d = run("stats", store, "--last", 4, "--json").json()
    assert (d["size"], d["start"], d["stop"]) == (4, 6, 10)
    assert d["fields"]["actions"]["min"] == 13 and d["fields"]["actions"]["max"] == 16
    assert run("stats", store, "--start", -4, "--json").json() == d
    big = run("stats", store, "--last", 1000, "--json").json()  # as a slice: clamped to the store
    assert big["size"] == 10 and big["start"] == 0
    d = run("stats", store, "--start", 2, "--stop", 5, "--json").json()
    assert d["fields"]["actions"]["min"] == 9 and d["size"] == 3
    r = run("stats", store, "--last", 2, "--start", 1)
    assert r.code == 2 and "--last" in r.err
    r = run("stats", store, "--last", -1)
    assert r.code == 2


def test_stats_shouts_about_nonfinite_values(tmp_path, run):
    path = tmp_path / "nan.replay"
    with DiskReplay.create(path, 20, seed=0, fields=FIELDS) as buf:
        # episodes: [1, nan] [2, 3] [4] [inf, 5]; values that differ in the 7th digit.
        for t, (r, d) in enumerate(zip([1, np.nan, 2, 3, 4, np.inf, 5], [0, 1, 0, 1, 1, 0, 1])):
            buf.add(np.zeros(3, np.float32), 123456 + (t % 2), np.float32(r), np.zeros(3, np.float32), bool(d),
                    log_probs=np.float32(0))
    r = run("stats", path)
    assert r.code == 0, r
    lines = r.out.splitlines()
    row = {line.split()[0]: line.split() for line in lines[2:7]}
    assert row["rewards"] == ["rewards", "1", "5", "3", "1.41421", "2"]
    assert row["actions"][1:4] == ["123456", "123457", "123456.4"]  # mean told apart from min
    assert "warning: rewards holds 2 NaN or infinite values" in r.err and "Warning" not in r.err
    assert ("returns over the 2 of 4 complete episodes with a finite return (2 NaN or infinite): "
            "mean 4.5, min 4, max 5") in r.out


def test_stats_counts_first_episodes_when_nothing_was_evicted(tmp_path, run):
    path = tmp_path / "small.replay"
    with DiskReplay.create(path, 10, seed=0) as buf:
        for t in range(1, 6):
            buf.add(np.zeros(2, np.float32), 0, 1.0, np.zeros(2, np.float32), t in (2, 5))
    ep = run("stats", path, "--json").json()["episodes"]
    assert ep["complete_episodes"] == 2 and ep["return_min"] == 2.0 and ep["return_max"] == 3.0


# ---------------------------------------------------------------- sample
def test_sample(store, run):
    r = run("sample", store, "-n", 6, "--seed", 3, "--json")
    assert r.code == 0 and r.err == ""
    d = r.json()
    idxs = np.random.default_rng(3).integers(0, 10, 6).tolist()
    assert d["idxs"] == idxs
    assert d["actions"] == [t_of_slot(s) for s in idxs]
    assert d["next_states"] == [[t_of_slot(s) + 2.0] * 3 for s in idxs]
    assert run("sample", store, "-n", 6, "--seed", 3, "--json").json() == d

    # Without --seed: the store's own next batch, and the sampler state is not moved.
    with DiskReplay.open(store, mode="r") as buf:
        want = buf.sample(5)
        want_idxs = buf.batch_idxs.tolist()
    for _ in range(2):
        d = run("sample", store, "-n", 5, "--json").json()
        assert d["idxs"] == want_idxs and d["rewards"] == want["rewards"].tolist()
    r = run("sample", store, "-n", 4, "--seed", 0)
    assert r.code == 0
    assert_fits(r.out)
    assert len(r.out.splitlines()) == 5


# ---------------------------------------------------------------- verify
def test_verify_sound(store, run):
    r = run("verify", store)
    assert r.code == 0, r
    assert r.out.splitlines()[0].endswith(": OK")
    assert "10 rows" in r.out and "10 row CRCs" in r.out
    assert r.err == ""  # no progress bar when stderr is not a terminal
    d = run("verify", store, "--json").json()
    assert d["ok"] is True and d["problems"] == [] and d["checked"]["rows_crc_checked"] == 10


def _data_offset(path, backend, field):
    if backend == "hdf5":
        from diskreplay.backends import get_backend
        from diskreplay.format.description import read_description

        desc = read_description(str(path))
        return path / "data.h5", get_backend("hdf5").dataset_offsets(str(path), desc["fields"], MAX_SIZE)[field]
    from diskreplay.disk.npyfile import read_npy_header

    return path / f"{field}.npy", read_npy_header(str(path / f"{field}.npy"))[2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_verify_names_damage(tmp_path, run, backend):
    # A truncated data file.
    s1 = make_store(tmp_path / "a.replay", backend)
    victim = s1 / ("data.h5" if backend == "hdf5" else "actions.npy")
    os.truncate(victim, victim.stat().st_size - 8)
    r = run("verify", s1)
    assert r.code == 1, r
    assert "DAMAGED" in r.out and victim.name in r.out
    # A row whose bytes changed: rewards of slot 3 (transition 14).
    s2 = make_store(tmp_path / "b.replay", backend)
    file, offset = _data_offset(s2, backend, "rewards")
    with open(file, "r+b") as f:
        f.seek(offset + 3 * 4)
        f.write(np.float32(99).tobytes())
    r = run("verify", s2)
    assert r.code == 1
    assert "1 rows do not match their CRC" in r.out and "slots 3" in r.out
    # Both checkpoint slots damaged, and meta.bin's check word.
    s3 = make_store(tmp_path / "c.replay", backend)
    size = (s3 / "checkpoint.bin").stat().st_size
    with open(s3 / "checkpoint.bin", "r+b") as f:
        for pos in (0, size // 2):
            f.seek(pos)
            f.write(b"XXXX")
    with open(s3 / "meta.bin", "r+b") as f:  # flip a byte of the check word (never a no-op)
        f.seek(8 * 3)
        byte = f.read(1)[0]
        f.seek(8 * 3)
        f.write(bytes([byte ^ 0xFF]))
    d = run("verify", s3, "--json").json()
    assert d["ok"] is False
    assert any("checkpoint.bin" in p and "neither" in p for p in d["problems"])
    assert any("meta.bin" in p and "check word" in p for p in d["problems"])


# ---------------------------------------------------------------- export
def test_export(store, run, tmp_path):
    out = tmp_path / "all.npz"
    r = run("export", store, out)
    assert r.code == 0 and "exported 10 transitions" in r.out
    with np.load(out) as z:
        assert sorted(z.files) == sorted(["states", "actions", "rewards", "next_states", "dones",
                                          "log_probs", "slots"])
        assert z["actions"].tolist() == list(range(7, 17))
        assert z["slots"].tolist() == [6, 7, 8, 9, 0, 1, 2, 3, 4, 5]
        assert z["states"].dtype == np.float32 and z["states"].shape == (10, 3)
        assert z["next_states"][:, 0].tolist() == list(range(9, 19))
        assert z["dones"].tolist() == [t in DONES for t in range(7, 17)]

    import h5py

    out = tmp_path / "part.h5"
    r = run("export", store, out, "--start", 2, "--stop", -1)
    assert r.code == 0, r
    with h5py.File(out, "r") as f:
        assert f["actions"][:].tolist() == list(range(9, 16))
        assert f["next_states"][-1].tolist() == [17.0] * 3
        assert f["log_probs"][0] == -9.0 and f["dones"].dtype == np.bool_
    r = run("export", store, out)
    assert r.code == 1 and "--overwrite" in r.err
    assert run("export", store, out, "--overwrite", "--format", "hdf5").code == 0
    r = run("export", store, tmp_path / "x.npz", "--start", "1.5")
    assert r.code == 2 and "Error" in r.err
    # Positions work as Python slices: the README's --start -1000 on a 10-row store is all of it.
    r = run("export", store, tmp_path / "all.h5", "--start", -1000)
    assert r.code == 0 and "exported 10 transitions" in r.out
    # --last N, as stats and plot take it: beside a live writer, fewer rows to lose.
    r = run("export", store, tmp_path / "last.npz", "--last", 4)
    assert r.code == 0 and "exported 4 transitions" in r.out
    with np.load(tmp_path / "last.npz") as z:
        assert z["actions"].tolist() == [13, 14, 15, 16]
    assert run("export", store, tmp_path / "l.npz", "--last", 4, "--start", 1).code == 2


# ---------------------------------------------------------------- plot
def test_plot(store, run, tmp_path):
    out = tmp_path / "p.png"
    r = run("plot", store, out)
    assert r.code == 0, r
    assert "2 episode returns" in r.out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pdf = tmp_path / "p.pdf"
    r = run("plot", store, pdf, "--last", 6)
    assert r.code == 0, r
    assert pdf.read_bytes()[:5] == b"%PDF-" and "1 episode returns" in r.out  # 13 to 15 of env 0
    r = run("plot", store, tmp_path / "p.nope")
    assert r.code == 2 and ".png" in r.err and not (tmp_path / "p.nope").exists()


def test_plot_without_matplotlib(memmap_store, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    r = CliRunner().invoke(main, ["plot", str(memmap_store), str(tmp_path / "p.png")])
    assert r.exit_code == 1
    assert "pip install 'diskreplay[plot]'" in r.stderr
    assert not (tmp_path / "p.png").exists()


# ---------------------------------------------------------------- convert
def test_convert(store, run, tmp_path):
    src_backend = run("info", store, "--json").json()["backend"]
    other = "hdf5" if src_backend == "memmap" else "memmap"
    dst = tmp_path / "c.replay"
    r = run("convert", store, dst, "--backend", other)
    assert r.code == 0, r
    a, b = run("info", store, "--json").json(), run("info", dst, "--json").json()
    assert b["backend"] == other
    for key in ("size", "seen_size", "head", "max_size", "num_envs", "fields"):
        assert a[key] == b[key]
    assert run("show", dst, "--json").json() == run("show", store, "--json").json()
    assert run("sample", dst, "-n", 4, "--json").json() == run("sample", store, "-n", 4, "--json").json()
    r = run("convert", store, dst, "--backend", other)
    assert r.code == 1 and r.err.startswith("Error: ")


# ---------------------------------------------------------------- errors and safety
@pytest.mark.parametrize("args,code", [
    (["info", "{missing}"], 1), (["show", "{missing}"], 1), (["stats", "{file}"], 1),
    (["verify", "{missing}"], 1), (["verify", "{dir}"], 1), (["sample", "{store}", "-n", "0"], 2),
    (["show", "{store}", "--index", "10"], 2), (["show", "{store}", "--index", "-1"], 2),
    (["show", "{store}", "--index", "1.5"], 2), (["show", "{store}", "--index", "99999999999999999999999"], 2),
    (["sample", "{store}", "-n", "100000000000000000000"], 2), (["sample", "{store}", "-n", "1e20"], 2),
    (["show", "{store}", "--index", "x"], 2),
    (["show", "{store}", "--fields", "nope"], 2), (["show", "{store}", "--head", "1", "--tail", "1"], 2),
    (["show", "{store}", "3"], 2), (["export", "{store}", "{missing}/x.npz"], 1),
    (["convert", "{store}", "{tmp}/d", "--backend", "zarr"], 2), (["plot", "{missing}", "{tmp}/p.png"], 1),
])
def test_errors_are_clean(memmap_store, run, tmp_path, args, code):
    (tmp_path / "file").write_text("not a store")
    (tmp_path / "dir").mkdir()
    subst = {"missing": tmp_path / "nope", "file": tmp_path / "file", "store": memmap_store, "tmp": tmp_path,
             "dir": tmp_path / "dir"}
    r = run(*[a.format(**subst) for a in args])
    assert r.code == code, r
    assert r.out == ""
    assert "Error: " in r.err and "Traceback" not in r.err


def test_commands_never_change_the_store(store, run, tmp_path):
    def digest():
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(store.iterdir())}

    before = digest()
    for args in (["info"], ["show"], ["stats"], ["sample"], ["verify"], ["export", tmp_path / "e.h5"],
                 ["plot", tmp_path / "p.png"], ["watch", "-n", 2, "--interval", 0.1],
                 ["convert", tmp_path / "c.replay", "--backend", "memmap"]):
        assert run(args[0], store, *args[1:]).code == 0
    assert digest() == before


# ---------------------------------------------------------------- beside a live writer
WRITER = textwrap.dedent("""
    import sys
    import time
    import numpy as np
    from diskreplay import DiskReplay
    buf = DiskReplay.create(sys.argv[1], 50, backend=sys.argv[2], seed=0,
                            fields={"states": ((3,), "int64"), "actions": ((), "int64"),
                                    "rewards": ((), "float32"), "dones": ((), "bool")})
    t = 0
    while True:
        t += 1
        buf.add(np.full(3, t, np.int64), t, 1.0, np.full(3, t + 1, np.int64), t % 10 == 0)
        if t == 120:
            print("ready", flush=True)
        if t > 120:
            time.sleep(0.0001)  # leaves readers a chance to read rows before they are overwritten
""")


@pytest.mark.parametrize("backend", BACKENDS)
def test_info_and_show_beside_a_live_writer(tmp_path, run, backend):
    path = tmp_path / "live.replay"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), backend], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        for _ in range(3):
            d = run("info", path, "--json").json()
            assert d["writer_alive"] is True
            assert d["seen_size"] >= 120 and d["size"] == 50
            assert d["head"] == (d["seen_size"] - 1) % 50
            rows = run("show", path, "--tail", 5, "--json").json()
            ts = [row["actions"] for row in rows]
            assert ts[0] >= 116 and ts == list(range(ts[0], ts[0] + 5))
            for row in rows:
                assert row["slot"] == (row["actions"] - 1) % 50
                assert row["states"] == [row["actions"]] * 3
                assert row["next_states"] == [row["actions"] + 1] * 3
        r = run("stats", path, "--json")
        assert r.code == 0
        d = r.json()
        rewards = d["fields"]["rewards"]
        # Rows the writer overwrote before they were read are left out, never mixed in.
        assert rewards["count"] == d["size"] == 50 - d["skipped_overwritten"]
        assert rewards["mean"] in (1.0, None)
        assert run("stats", path, "--last", 20).code == 0
        out = path.parent / "live.h5"
        r = run("export", path, out, "--overwrite")
        assert r.code == 0, r
        import h5py

        with h5py.File(out, "r") as f:  # rows the writer overtook are left out, never mixed in
            actions = f["actions"][:]
            assert (f["states"][:, 0] == actions).all() and (np.diff(actions) > 0).all()
            assert (f["next_states"][:, 0] == actions + 1).all()
        out = path.parent / "live.npz"  # members written in place; moved over the rows overtaken
        assert run("export", path, out).code == 0
        with np.load(out) as npz:
            actions = npz["actions"]
            assert (npz["states"][:, 0] == actions).all() and (np.diff(actions) > 0).all()
            assert (npz["next_states"][:, 0] == actions + 1).all() and len(npz["slots"]) == len(actions)
        assert run("plot", path, path.parent / "live.png").code == 0
        assert run("plot", path, path.parent / "live.pdf", "--last", 20).code == 0
        assert run("verify", path).code == 0
        r = run("episodes", path, "--json")  # episodes of 10 transitions: rows overtaken cut them, never mix
        assert r.code == 0 and all(ep["length"] <= 10 for ep in r.json()) and all(
            ep["length"] == 10 and ep["last"] % 10 == 0 for ep in r.json() if ep["complete"]), r
        r = run("export", path, path.parent / "last.npz", "--last", 20)
        assert r.code == 0, r
        with np.load(path.parent / "last.npz") as npz:
            assert (npz["states"][:, 0] == npz["actions"]).all() and len(npz["actions"]) <= 20
    finally:
        writer.kill()
        writer.wait()


# ---------------------------------------------------------------- episodes
def test_episodes(store, run):
    # env 0 holds 7, 9, 11, 13, 15 (dones 11, 15); env 1 holds 8, 10, 12, 14, 16 (dones 10, 14).
    r = run("episodes", store, "--json")
    assert r.code == 0, r.err
    eps = json.loads(r.out)
    assert [(e["env"], e["first"], e["last"], e["length"], e["return"], e["complete"]) for e in eps] == [
        (1, 8, 10, 2, 9.0, False), (0, 7, 11, 3, 13.5, False), (1, 12, 14, 2, 13.0, True),
        (0, 13, 15, 2, 14.0, True), (1, 16, 16, 1, 8.0, False)]
    r = run("episodes", store, "--env", 1, "--last", 5, "--json")
    assert [(e["first"], e["last"], e["complete"]) for e in json.loads(r.out)] == [(12, 14, False), (16, 16, False)]
    r = run("episodes", store)
    assert r.code == 0 and r.out.splitlines()[0].split() == ["env", "length", "return", "complete", "first", "last"]
    assert r.out.splitlines()[-1] == "5 episodes, 2 complete"
    assert_fits(r.out)


def test_episodes_bad_input(store, run, tmp_path):
    r = run("episodes", store, "--env", 2)
    assert r.code == 2 and "env must be an integer in [0, 2)" in r.err
    r = run("episodes", tmp_path / "missing.replay")
    assert r.code == 1 and "Error:" in r.err
    empty = tmp_path / "empty.replay"
    DiskReplay.create(empty, 4).close()
    r = run("episodes", empty)
    assert r.code == 0 and r.out == "no episodes\n"
    assert run("episodes", empty, "--json").out == "[]\n"
