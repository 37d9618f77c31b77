"""Arguments checked one way everywhere, and warnings reported where the user called."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from diskreplay import DiskReplay, InvalidArgumentError, RecoveryWarning
from diskreplay.core.schema import check_count


@pytest.mark.parametrize("value, expected", [(32, 32), (32.0, 32), (np.int16(7), 7), (1e6, 1_000_000)])
def test_a_count_is_an_integer_or_an_integral_float(value, expected):
    assert check_count("n", value) == expected


@pytest.mark.parametrize("value", [True, 0, -3, 2.5, float("nan"), float("inf"), "32", None, [32]])
def test_anything_else_is_refused_with_the_argument_named(value):
    with pytest.raises(InvalidArgumentError, match="^n must be"):
        check_count("n", value)


def test_create_and_sample_take_batch_size_by_the_same_rule(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 10, backend=backend, batch_size=4.0, seed=0) as buf:
        assert buf.batch_size == 4
        for t in range(5):
            buf.add(np.full(2, t, np.float32), t, 0.5, np.full(2, t + 1, np.float32), False)
        assert len(buf.sample(3.0)["states"]) == 3
        for bad in (2.5, 0, True, "3"):
            with pytest.raises(InvalidArgumentError, match="batch_size"):
                buf.sample(bad)
        with pytest.raises(InvalidArgumentError, match="batch_size"):
            DiskReplay.create(tmp_path / "t", 10, backend=backend, batch_size=2.5)


def test_the_recovery_warning_points_at_the_callers_line(tmp_path, backend):
    path = tmp_path / "s"
    child = textwrap.dedent(f"""
        import os, numpy as np
        from diskreplay import DiskReplay
        buf = DiskReplay.create({str(path)!r}, 10, backend={backend!r})
        buf.add(np.zeros(2, np.float32), 1, 0.5, np.ones(2, np.float32), False)
        os._exit(0)  # the writer stops without closing the store
    """)
    subprocess.run([sys.executable, "-c", child], check=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        buf = DiskReplay.open(path)  # the line the warning must name
        line = sys._getframe().f_lineno - 1
    buf.close()
    found = [w for w in caught if issubclass(w.category, RecoveryWarning)]
    assert len(found) == 1 and "stopped without closing" in str(found[0].message)
    assert (found[0].filename, found[0].lineno) == (__file__, line)
