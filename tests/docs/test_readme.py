"""Every fenced Python and shell example of README.md runs, and says what it really prints.

The examples are found in README.md itself, so a section added tomorrow is covered too.
Each example runs in a fresh temporary directory as its working directory, holding the
store the README's command-line section describes (``runs/pong.replay``: max_size 10,
2 envs, 16 transitions added) and a copy with one damaged row (``runs/broken.replay``).

* ```` ```python ```` blocks run as a script with this interpreter; they must exit 0.
* ```` ```console ```` blocks: each ``$ command`` runs in bash (the ``diskreplay``
  beside this interpreter first on PATH); it must exit 0 unless it ends in ``; echo $?``,
  and the lines shown after it must be what it prints (a line ending in ``...`` is a
  prefix; the machine-dependent ``path``, ``disk_bytes`` and ``last_flush`` values of
  ``info`` are not compared).
* ```` ```bash ```` blocks: every line is a command, run the same way.

Commands that set up the environment are checked, not re-run (the test runs inside that
environment): ``python3 -m venv`` is skipped, ``pip install X[extra]`` must name extras
pyproject.toml declares (the test extra installs what they need, so an example whose
package is missing fails when it runs), ``.venv/bin/python`` is this interpreter, and
``python -m pytest`` (this very suite) is not run again. Nothing an example writes
outlives its directory, no example may leave more than ``MAX_LEFT_BYTES`` on disk, and a
Python example removes the stores it made (a reader who runs one twice, or runs them all,
finds nothing left over; a command's output, an export or a converted store, is its point).
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from readme_store import make_store
import paths

ROOT = Path(paths.ROOT)
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
MAX_LEFT_BYTES = 64 << 20
VOLATILE = ("path ", "disk_bytes ", "last_flush ")
TIMEOUT = 300


def fenced_blocks(text: str) -> list[tuple[int, str, str]]:
    """``(line number, language, body)`` of every fenced block."""
    blocks, lang, start, body = [], None, 0, []
    for no, line in enumerate(text.splitlines(), 1):
        if lang is None:
            m = re.match(r"^```(\w*)\s*$", line)
            if m:
                lang, start, body = m.group(1), no, []
        elif line.startswith("```"):
            blocks.append((start, lang, "\n".join(body) + "\n"))
            lang = None
        else:
            body.append(line)
    return blocks


EXAMPLES = [b for b in fenced_blocks(README.read_text()) if b[1] in ("python", "console", "bash", "sh", "shell")]


def declared_extras() -> set[str]:
    """The extras of the installed diskreplay (pyproject.toml's optional-dependencies)."""
    return set(importlib.metadata.metadata("diskreplay").get_all("Provides-Extra") or [])


@pytest.fixture
def workdir(tmp_path, monkeypatch, request):
    """A fresh directory holding the README's stores, as the examples' cwd."""
    runs = tmp_path / "runs"
    runs.mkdir()
    # A short temporary directory of the example's own: AF_UNIX socket paths (Ray's, and
    # multiprocessing's resource sharer, through which DataLoader workers hand tensors over)
    # are limited to 107 bytes, too short for a directory under pytest's.
    own_tmp = tempfile.mkdtemp(prefix="rd-")
    request.addfinalizer(lambda: shutil.rmtree(own_tmp, ignore_errors=True))
    make_store(runs / "pong.replay")
    broken = runs / "broken.replay"
    shutil.copytree(runs / "pong.replay", broken)
    states = np.load(broken / "states.npy", mmap_mode="r+")
    states[3, 0] += 1  # slot 3 no longer matches its CRC
    states.flush()
    del states
    # TMPDIR: what an example puts in the temporary directory (the demo's store) is its own too.
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", COLUMNS="80",
               TMPDIR=own_tmp, RAY_TMPDIR=tempfile.gettempdir())
    env.pop("PYTHONPATH", None)
    return tmp_path, env


def disk_use(path: Path) -> int:
    return sum(p.lstat().st_blocks * 512 for p in path.rglob("*"))


def stores_in(cwd: Path) -> set[Path]:
    """The stores under ``cwd``, not counting its temporary directory."""
    return {p.parent for p in cwd.rglob("store.json") if cwd / "tmp" not in p.parents}


def check_setup(part: str) -> str | None:
    """An environment-setup command checked instead of run (None), else the command to run."""
    words = shlex.split(part)
    if words[:3] == ["python3", "-m", "venv"]:
        return None
    if "pip" in os.path.basename(words[0]) or words[1:3] == ["-m", "pip"]:
        assert "install" in words, part
        extras = declared_extras()
        for word in words:
            for group in re.findall(r"\[([\w,\s-]+)\]", word):
                missing = {e.strip() for e in group.split(",")} - extras
                assert not missing, f"README installs extras {missing} that pyproject.toml does not declare"
        return None
    if words[0].endswith("python") and words[1:3] == ["-m", "pytest"]:
        return None  # this suite
    return part.replace(".venv/bin/python", shlex.quote(sys.executable))


def run_command(command: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    parts = [check_setup(p.strip()) for p in command.split("&&")]
    parts = [p for p in parts if p]
    if not parts:
        return subprocess.CompletedProcess(command, 0, "", "")
    return subprocess.run(["bash", "-c", " && ".join(parts)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)


def console_steps(body: str) -> list[tuple[str, list[str]]]:
    """``(command, lines it shows)`` of a console block."""
    steps = []
    for line in body.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    return steps


def check_output(where: str, command: str, shown: list[str], got: str) -> None:
    lines = got.splitlines()
    i = 0
    for want in shown:
        assert i < len(lines), f"{where}: `{command}` printed\n{got}\nbut the README shows\n" + "\n".join(shown)
        line = lines[i]
        i += 1
        if want.startswith(VOLATILE):
            assert line.split()[0] == want.split()[0], f"{where}: `{command}`: {line!r} for {want!r}"
            while i < len(lines) and lines[i].startswith(" ") and not lines[i].lstrip().startswith("fields"):
                i += 1  # a long path wrapped onto the next lines
        elif want.endswith("..."):
            assert line.startswith(want[:-3]), f"{where}: `{command}`: {line!r} does not start {want[:-3]!r}"
        else:
            assert line.rstrip() == want.rstrip(), f"{where}: `{command}` printed {line!r}, README shows {want!r}"


def stand_in_slm_lab(cwd: Path) -> None:
    """SLM-Lab is not installable here; the README's registration example touches only its
    module ``slm_lab.agent.memory``, so an empty module of that name stands in for it."""
    pkg = cwd / "slm_lab" / "agent"
    pkg.mkdir(parents=True)
    for init in (cwd / "slm_lab" / "__init__.py", pkg / "__init__.py", pkg / "memory.py"):
        init.write_text("")


@pytest.mark.parametrize("lineno, lang, body", EXAMPLES, ids=[f"README.md:{n}-{lang}" for n, lang, _ in EXAMPLES])
def test_readme_example_runs(lineno, lang, body, workdir):
    cwd, env = workdir
    where = f"README.md:{lineno}"
    before = disk_use(cwd)
    stores = stores_in(cwd)
    if lang == "python":
        if re.search(r"^import slm_lab\b", body, re.M):
            stand_in_slm_lab(cwd)
        script = cwd / "example.py"
        script.write_text(body)
        p = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert p.returncode == 0, f"{where} failed:\n{p.stdout}\n{p.stderr}"
        left = sorted(str(s.relative_to(cwd)) for s in stores_in(cwd) - stores)
        assert not left, f"{where} leaves the stores {left} behind; remove them at its end"
    else:
        steps = console_steps(body) if lang == "console" else [(line, None) for line in body.splitlines()
                                                                 if line.strip() and not line.startswith("#")]
        for command, shown in steps:
            p = run_command(command, cwd, env)
            assert "Traceback" not in p.stderr, f"{where}: `{command}`:\n{p.stderr}"
            if command.rstrip().endswith("echo $?"):
                assert shown and p.stdout.splitlines()[-1:] == [shown[-1]], f"{where}: `{command}`:\n{p.stdout}"
            else:
                assert p.returncode == 0, f"{where}: `{command}` exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
            if shown:
                check_output(where, command, shown, p.stdout)
    left = disk_use(cwd) - before
    assert left <= MAX_LEFT_BYTES, f"{where} leaves {left} bytes on disk; keep README examples small"


def test_readme_has_examples_of_every_kind():
    langs = {lang for _, lang, _ in EXAMPLES}
    assert {"python", "console", "bash"} <= langs and len(EXAMPLES) >= 10
