"""What every test folder shares: the backend fixture, and the ``slow`` marker given by folder.

The folders (ARCHITECTURE.md, "Tests"): unit/ (one module each), features/ (behaviour by
feature), durability/ (kill -9, power cuts, interrupts, I/O errors, hostile input, threads:
the ``slow`` tier), integrations/ (the RL libraries), cli/, scripts/ (the benchmarks: also
``slow``), docs/ (the README's examples and claims). README's test command runs
``-m "not slow"``; ``.ci/run`` runs both tiers.
"""
import os

import pytest

from diskreplay.backends import BACKENDS

SLOW_FOLDERS = ("durability", "scripts")
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Every storage test runs against every backend."""
    return request.param


def pytest_collection_modifyitems(config, items):
    for item in items:
        folder = os.path.relpath(str(item.path), HERE).split(os.sep)[0]
        if folder in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)
