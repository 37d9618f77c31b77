"""SIGKILL target of ``tests/features/test_parts.py``: opens (or creates) a store of one part kind and
adds steps until killed, printing ``seen_size`` after each acknowledged step.

    python part_child.py KIND BACKEND PATH
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from stores import fill, make_store  # noqa: E402

from diskreplay import DiskReplay  # noqa: E402


def main() -> None:
    kind, backend, path = sys.argv[1:4]
    buf = DiskReplay.open(path) if os.path.exists(path) else make_store(kind, backend, path=path)
    start = buf.seen_size + 1
    while True:
        start = fill(buf, 1, start)
        print(buf.seen_size, flush=True)


if __name__ == "__main__":
    main()
