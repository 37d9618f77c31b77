"""The CLI's output rules (cli/output.py): width, cut marks, broken pipes, JSON of any dtype,
empty stores, errors in the command line's terms."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from diskreplay import DiskReplay
from diskreplay.cli.main import main
from diskreplay.cli.output import CUT, fmt_numbers, jsonable, table

ENTRY = Path(sys.executable).with_name("diskreplay")


def invoke(*args, env=None):
    r = CliRunner().invoke(main, [str(a) for a in args], prog_name="diskreplay", env=env)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r


def wide_store(path, extras=5):
    fields = {"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    fields.update({f"extra_field_{i}": ((), "float32") for i in range(extras)})
    with DiskReplay.create(path, 2000, seed=0, fields=fields) as buf:
        for t in range(1, 2001):
            buf.add(np.full(3, t, np.float32), t, 0.5, np.full(3, t + 1, np.float32), t % 7 == 0,
                    **{f"extra_field_{i}": np.float32(t / 3) for i in range(extras)})
    return path


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    return wide_store(tmp_path_factory.mktemp("wide") / "w.replay")


def test_tables_fit_the_terminal_and_say_what_they_left_out(wide):
    for columns, width in ((None, 80), ("60", 60), ("132", 132)):
        r = invoke("show", wide, "--tail", 3, env={"COLUMNS": columns} if columns else None)
        assert r.exit_code == 0
        assert max(len(line) for line in r.stdout.splitlines()) <= width
    r = invoke("show", wide, "--tail", 3, env={"COLUMNS": "80"})
    assert "columns left out to fit 80 columns" in r.stderr and "--fields" in r.stderr
    for command in ("sample", "episodes", "stats"):  # no --fields to suggest there
        narrow = invoke(command, wide, env={"COLUMNS": "40"})
        tables = narrow.stdout.split("\n\n")[0].splitlines()[1 if command == "stats" else 0:]  # not the prose
        assert narrow.exit_code == 0 and max(len(line) for line in tables) <= 40, narrow.stdout
        assert "--fields" not in narrow.stderr and " 1 columns" not in narrow.stderr, narrow.stderr
    assert r.stdout.splitlines()[0].split()[:3] == ["slot", "t", "env"]


def test_a_cut_cell_is_marked_apart_from_an_approximate_mean():
    lines = table(["a", "b"], [["x" * 50, "4x84x84 0..255 ~31.2"]], width=30)
    assert all(len(line) <= 30 for line in lines)
    assert lines[1].split()[0].endswith(CUT) and "~" not in lines[1].split()[0]


def test_numbers_get_the_digits_that_tell_them_apart():
    assert fmt_numbers([123456.0, 123457.0, 123456.5]) == ["123456", "123457", "123456.5"]
    assert fmt_numbers([0.1, 0.2, None]) == ["0.1", "0.2", "-"]
    assert fmt_numbers([1.0000001, 1.0000002]) == ["1.0000001", "1.0000002"]


def test_show_tells_neighbouring_values_apart(tmp_path):
    path = tmp_path / "d.replay"
    with DiskReplay.create(path, 10, seed=0, fields=FIELDS) as buf:
        for r in (123456.0, 123456.5, 123457.0):
            buf.add(np.zeros(2, np.float32), 0, np.float32(r), np.zeros(2, np.float32), False)
    out = invoke("show", path, "--fields", "rewards").stdout.splitlines()
    assert [line.split()[-1] for line in out[1:]] == ["123456", "123456.5", "123457"], out


def test_a_closed_pipe_ends_quietly(wide):
    p = subprocess.Popen([str(ENTRY), "show", str(wide), "--tail", "2000", "--fields", "states,actions"],
                         stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    assert p.stdout.readline().split()[:1] == [b"slot"]  # then, like `| head -1`, stop reading
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=60)
    assert err == "", err  # no "Error: Broken pipe", no traceback
    assert p.returncode == 141  # as a tool the pipe's signal ends; 1 would mean a store problem


def test_json_of_wide_floats(tmp_path):
    path = tmp_path / "f128.replay"
    fields = {"states": ((2,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool"), "precise": ((), "longdouble")}
    with DiskReplay.create(path, 4, seed=0, fields=fields) as buf:
        buf.add(np.zeros(2, np.float32), 1, 0.5, np.ones(2, np.float32), False, precise=np.longdouble(0.25))
    for args in (["show", path, "--json"], ["sample", path, "-n", 2, "--seed", 0, "--json"]):
        r = invoke(*args)
        assert r.exit_code == 0, r.output
        text = json.dumps(json.loads(r.stdout))
        assert "0.25" in text
    assert jsonable(np.array([np.longdouble("inf"), 1], np.longdouble)) == [None, 1.0]


FIELDS = {"states": ((2,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"), "dones": ((), "bool")}


def test_empty_looks_the_same_declared_or_not(tmp_path):
    declared = tmp_path / "d.replay"
    DiskReplay.create(declared, 4, seed=0, fields=FIELDS).close()
    undeclared = tmp_path / "u.replay"
    DiskReplay.create(undeclared, 4, seed=0).close()
    for path in (declared, undeclared):
        r = invoke("show", path)
        assert (r.exit_code, r.stdout) == (0, "(no rows)\n")
        assert invoke("show", path, "--json").stdout == "[]\n"
        d = json.loads(invoke("stats", path, "--json").stdout)
        assert d["size"] == 0 and d["episodes"]["complete_episodes"] == 0
        assert invoke("episodes", path).stdout == "no episodes\n"
    prioritized = tmp_path / "p.replay"
    DiskReplay.create(prioritized, 4, seed=0, prioritized=True).close()
    stacked = tmp_path / "f.replay"
    DiskReplay.create(stacked, 8, seed=0, frame_stack=2, fields=dict(FIELDS, states=((2, 3), "uint8"))).close()
    infos = [json.loads(invoke("info", path, "--json").stdout) for path in (declared, undeclared, prioritized,
                                                                            stacked)]
    assert all(list(info) == list(infos[0]) for info in infos), infos  # what does not apply is null
    assert infos[1]["cold_reads"] is None and infos[0]["priority_tree"] is None and infos[0]["frame_stack"] is None
    assert infos[2]["priority_tree"] in ("C", "numpy") and infos[3]["frame_stack"] == 2
    # What makes something of rows refuses both alike: the same exit code, the same words.
    for args in (["sample"], ["export", "{tmp}/e.npz"], ["export", "{tmp}/e.h5"], ["plot", "{tmp}/e.png"]):
        said = set()
        for path in (declared, undeclared):
            r = invoke(args[0], path, *[a.format(tmp=tmp_path) for a in args[1:]])
            assert r.exit_code == 1 and r.stdout == "", (args, r.stdout)
            said.add(r.stderr.replace(str(path), "PATH"))
        assert len(said) == 1 and "holds no transitions" in said.pop(), (args, said)
    assert not list(tmp_path.glob("e.*"))


def test_errors_speak_in_flags(tmp_path, wide):
    dst = tmp_path / "c.replay"
    assert invoke("convert", wide, dst, "--backend", "hdf5").exit_code == 0
    r = invoke("convert", wide, dst, "--backend", "hdf5")
    assert r.exit_code == 1 and "--overwrite" in r.stderr and "overwrite=True" not in r.stderr
    r = invoke("sample", wide, "-n", 10 ** 20)
    assert r.exit_code == 2 and "batch_size" not in r.stderr
    for n_step in (0, 10 ** 6):
        r = invoke("sample", wide, "--n-step", n_step)
        assert r.exit_code == 2 and "--n-step" in r.stderr and "n_step" not in r.stderr, r.stderr
    r = invoke("show", wide, "--index", "")
    assert r.exit_code == 2 and "no slot index" in r.stderr
    for command in ("show", "episodes"):
        r = invoke(command, wide, "--env", 3)
        assert r.exit_code == 2 and "Error: --env must" in r.stderr, r.stderr


def test_out_of_memory_names_the_commands_own_flags(wide, monkeypatch):
    import diskreplay.cli.main as cli_main

    def exhausted(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(cli_main, "sample_batch", exhausted)
    r = invoke("sample", wide, "-n", 10 ** 11)
    assert r.exit_code == 1 and "smaller batch (-n)" in r.stderr and "--last" not in r.stderr, r.stderr


def test_long_values_wrap_between_numbers():
    from diskreplay.cli.output import kv_lines

    lines = kv_lines([("newest", " ".join(["-0.0680796"] * 12)), ("path", "/a" * 40)], width=60)
    assert all(len(line) <= 60 for line in lines)
    assert all(word == "-0.0680796" for line in lines[:-3] for word in line.split()[1 if line[0] != " " else 0:])
    assert "".join(line.strip() for line in lines[-3:]).endswith("/a" * 40)


@pytest.mark.parametrize("args", [["export", "{store}", "/proc/nowhere/x.npz"], ["export", "{store}", "/proc/x.npz"],
                                  ["export", "{store}", "/proc/x.h5"], ["plot", "{store}", "/proc/x.png"],
                                  ["convert", "{store}", "/proc/x.replay", "--backend", "hdf5"]])
def test_os_errors_name_the_users_path_and_the_reason(tmp_path, wide, args):
    """Writing where nothing can be written: the path given, the system's reason; never the
    temporary file beside it, an errno number, h5py's call or a traceback."""
    args = [a.format(store=wide) for a in args]
    p = subprocess.run([str(ENTRY), *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    line = p.stderr.strip()
    assert line.startswith("Error: ") and "\n" not in line, p.stderr
    out = args[2]
    assert out in line and (line.endswith("No such file or directory") or "does not exist" in line), line
    for leak in (".tmp", "[Errno", "errno =", "Unable to", "Traceback"):
        assert leak not in line, line


def test_damaged_hdf5_files_are_named_without_hdf5_internals(tmp_path):
    path = tmp_path / "h.replay"
    with DiskReplay.create(path, 10, backend="hdf5") as buf:
        buf.add(np.zeros(2, np.float32), 0, 1.0, np.zeros(2, np.float32), False)
    with open(path / "data.h5", "r+b") as f:
        f.write(b"garbage!")  # the HDF5 signature is gone
    for command in ("stats", "info", "verify"):
        p = subprocess.run([str(ENTRY), command, str(path)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 1
        text = p.stdout + p.stderr
        assert "data.h5 is not a readable HDF5 file (file signature not found)" in text, text
        assert "Unable to" not in text and "Traceback" not in text
    with open(path / "data.h5", "r+b") as f:
        f.write(b"\x89HDF\r\n\x1a\n")  # the signature back, then the file cut short
        f.truncate(4000)
    for command in ("stats", "verify"):
        p = subprocess.run([str(ENTRY), command, str(path)], capture_output=True, text=True, timeout=120)
        text = p.stdout + p.stderr
        assert p.returncode == 1 and "data.h5" in text and "truncated: 4000 of its" in text, text
        for internal in ("sblock", "eof =", "Unable to", "Traceback"):
            assert internal not in text, text


def test_damage_anywhere_in_an_hdf5_store_is_an_error_line(tmp_path):
    """Bytes overwritten anywhere in data.h5's first pages (superblock, object headers, heaps):
    each command either reads what is left or exits 1 naming the file, never a traceback."""
    path = tmp_path / "h.replay"
    with DiskReplay.create(path, 10, backend="hdf5", fields=FIELDS) as buf:
        buf.add(np.zeros(2, np.float32), 0, 1.0, np.zeros(2, np.float32), False)
    good = (path / "data.h5").read_bytes()
    failed = 0
    for offset in range(64, 4096, 64):
        (path / "data.h5").write_bytes(good[:offset] + b"\xff" * 64 + good[offset + 64:])
        for command in ("stats", "show"):
            r = invoke(command, path)  # an exception other than SystemExit is raised here
            assert r.exit_code in (0, 1), (offset, command, r.output)
            if r.exit_code:
                failed += 1
                assert r.stderr.startswith("Error: ") and "data.h5" in r.stderr, (offset, r.stderr)
                for internal in ("Unable to", "sblock", "EOA"):
                    assert internal not in r.stderr, (offset, r.stderr)
    assert failed  # the damage was seen


@pytest.mark.parametrize("name", ["states.npy", "rewards.npy", "rowsums.npy", "ns_buffer.npy"])
def test_a_damaged_npy_header_is_an_error_line(tmp_path, name):
    path = tmp_path / "m.replay"
    with DiskReplay.create(path, 10, fields=FIELDS) as buf:
        buf.add(np.zeros(2, np.float32), 0, 1.0, np.zeros(2, np.float32), False)
    with open(path / name, "r+b") as f:
        f.seek(64)
        f.write(b"\xff" * 64)  # inside the header's dict: numpy's tokenizer meets an open bracket
    for command in ("info", "show", "stats", "verify"):
        r = invoke(command, path)
        assert r.exit_code == 1 and name in r.output and "header" in r.output, (command, r.output)


def test_an_address_space_limit_is_named_when_a_map_fails(tmp_path, monkeypatch):
    """ulimit -v counts mappings: a store larger than it leaves cannot be mapped, and the
    error says so instead of asking whether the file is on a local filesystem."""
    import errno
    import mmap

    path = tmp_path / "m.replay"
    with DiskReplay.create(path, 10, fields=FIELDS) as buf:
        buf.add(np.zeros(2, np.float32), 0, 1.0, np.zeros(2, np.float32), False)

    def no_room(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", no_room)
    r = invoke("stats", path)
    assert r.exit_code == 1 and "ulimit -v" in r.stderr and "local filesystem" not in r.stderr, r.stderr


def test_os_error_message_unit():
    from diskreplay import StoreIOError
    from diskreplay.cli.output import os_error_message, user_path

    assert user_path("/a/b/.out.npz.123.0123456789abcdef.tmp.parts") == "/a/b/out.npz"
    assert user_path("/a/.ds-v0.9.00000000ffffffff.tmp") == "/a/ds-v0"
    assert user_path("/a/b/out.npz") == "/a/b/out.npz"
    assert os_error_message(PermissionError(13, "Permission denied", "/x/.o.h5.7.0123456789abcdef.tmp")) == "/x/o.h5: Permission denied"
    h5 = OSError("Unable to synchronously create file (unable to open file: name = '/x/.o.h5.7.0123456789abcdef.tmp', errno = 28, "
                 "error message = 'No space left on device', flags = 13, o_flags = 242)")
    assert os_error_message(h5) == "/x/o.h5: No space left on device"
    assert os_error_message(OSError("Unable to synchronously open file (truncated file)")) == "truncated file"
    assert os_error_message(StoreIOError(5, "reading the row at byte 0 of fd 3: Input/output error")) == \
        "reading the row at byte 0 of fd 3: Input/output error"


def test_out_of_memory_is_an_error_line(wide, monkeypatch):
    import diskreplay.cli.main as cli_main

    def exhausted(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(cli_main, "compute_stats", exhausted)
    r = invoke("stats", wide)
    assert r.exit_code == 1 and r.stderr.startswith("Error: out of memory in stats") and "--last" in r.stderr
