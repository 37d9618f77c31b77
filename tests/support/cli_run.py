"""The ``diskreplay`` command line run two ways: in process through click's CliRunner (what
the CLI tests use: no interpreter start per call) and through the installed entry point (one
smoke test per command, and the tests whose subject is the process: pipes, signals, exit
codes seen by a shell)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from diskreplay.cli.main import main

ENTRY = Path(sys.executable).with_name("diskreplay")


class Result:
    def __init__(self, code, out, err):
        self.code, self.out, self.err = code, out, err

    def json(self):
        return json.loads(self.out)

    def __repr__(self):
        return f"<exit {self.code}\nstdout: {self.out}\nstderr: {self.err}>"


def invoke(*args) -> Result:
    """``diskreplay ARGS`` in this process; an exception other than click's exit is raised."""
    r = CliRunner().invoke(main, [str(a) for a in args], prog_name="diskreplay")
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return Result(r.exit_code, r.stdout, r.stderr)


def entry_point(*args, timeout=120) -> Result:
    """``diskreplay ARGS`` as a shell runs it: the installed script, a process of its own."""
    p = subprocess.run([str(ENTRY), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in p.stderr, p.stderr
    return Result(p.returncode, p.stdout, p.stderr)
