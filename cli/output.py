"""Presentation for the command line: argument parsing helpers, JSON, tables, progress bars.

Nothing here reads a store; the commands get their data from the library and render it here.

The output rules live here: tables fit the terminal (80 columns when stdout is not one),
a cut cell ends in ``…`` (never ``~``, which marks an approximate mean), columns that do
not fit are left out with a note on stderr, JSON has the same keys whatever the data,
errors speak in the command line's terms (``--overwrite``, not ``overwrite=True``), and
exit codes say what went wrong (:func:`handle_errors`: 1 a store problem, 2 a bad
argument, 141 a closed pipe).
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import shutil
import signal
import sys
import textwrap

import click
import numpy as np

from diskreplay import DiskReplayError, IndexOutOfRangeError, InvalidArgumentError


# ---------------------------------------------------------------- arguments
def positions(last: int | None, start: int | None, stop: int | None) -> tuple[int | None, int | None]:
    """``(start, stop)`` chronological positions from ``--last N`` or ``--start``/``--stop``."""
    if last is not None:
        if start is not None or stop is not None:
            raise click.UsageError("give --last, or --start/--stop, not both")
        return (-last if last else 0), (None if last else 0)
    return start, stop


def parse_indices(values) -> list[int]:
    """Slot indices from ``--index`` values, each one index or a comma-separated list."""
    out = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                index = int(part)
            except ValueError:
                raise click.BadParameter(f"{part!r} is not an integer slot index", param_hint="--index") from None
            if not -2 ** 63 <= index < 2 ** 63:
                raise click.BadParameter(f"{part} is far outside any store's slots", param_hint="--index")
            out.append(index)
    if not out:
        raise click.BadParameter("no slot index given", param_hint="--index")
    return out


def parse_fields(spec: str | None, keys: list[str]) -> list[str]:
    """The keys named by ``--fields a,b`` (all ``keys`` without it), checked against ``keys``."""
    if spec is None:
        return keys
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in keys]
    if unknown or not names:
        raise click.BadParameter(f"unknown field(s) {', '.join(unknown) or '(none given)'}; "
                                 f"the store has {', '.join(keys)}", param_hint="--fields")
    return names


def check_output(out: str, overwrite: bool) -> None:
    """Refuse an output path whose directory is missing, or that exists without ``--overwrite``."""
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise click.ClickException(f"cannot write {out}: the directory {parent} does not exist")
    if os.path.exists(out) and not overwrite:
        raise click.ClickException(f"{out} exists; pass --overwrite to replace it")


# ---------------------------------------------------------------- JSON
def jsonable(value):
    """Numpy values as JSON-ready Python values; NaN and infinities become None; float
    dtypes wider than float64 (float128) become Python floats."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f" and (value.dtype.itemsize > 8 or not np.isfinite(value).all()):
            return [jsonable(v) for v in value] if value.ndim else jsonable(value[()])
        return value.tolist()
    if isinstance(value, np.floating):
        value = float(value)
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def echo_json(data) -> None:
    click.echo(json.dumps(jsonable(data)))


# ---------------------------------------------------------------- text
def fmt_number(x, digits: int = 6) -> str:
    """A number for a table: integers in full, floats with ``digits`` significant digits."""
    if isinstance(x, (bool, np.bool_)):
        return "True" if x else "False"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    x = float(x)
    if math.isfinite(x) and x == int(x) and abs(x) < 1e15:
        return f"{int(x)}" if abs(x) >= 1e6 else f"{x:g}"
    return f"{x:.{digits}g}"


def fmt_numbers(values, digits: int = 6) -> list[str]:
    """Numbers formatted with the fewest significant digits (at least ``digits``, at most
    17) that keep different values apart: 123456 and 123457 never both print as 123456.
    None prints as ``-``."""
    present = [v for v in values if v is not None]
    floats = [float(v) for v in present if not isinstance(v, (bool, np.bool_, int, np.integer))]
    for prec in range(digits, 18):
        texts = {x: fmt_number(x, prec) for x in floats}
        if len(set(texts.values())) == len(set(floats)):
            break
    return [("-" if v is None else fmt_number(v, prec)) for v in values]


def fmt_value(value, small: int = 4) -> str:
    """A cell: scalars as they are, small arrays in full, large ones summarized."""
    arr = np.asarray(value)
    if arr.ndim == 0:
        return fmt_number(arr.item())
    if arr.size <= small:
        return "[" + " ".join(fmt_number(v) for v in arr.reshape(-1).tolist()) + "]"
    shape = "x".join(map(str, arr.shape))
    if arr.dtype.kind == "b":
        return f"{shape} {int(arr.sum())} true"
    a = arr.astype(np.float64)
    return f"{shape} {fmt_number(a.min())}..{fmt_number(a.max())} ~{fmt_number(round(float(a.mean()), 4))}"


CUT = "…"
MIN_WIDTH = 40


def terminal_width() -> int:
    """Columns for tables: the terminal's (or ``COLUMNS``), 80 when stdout is not a terminal."""
    return max(MIN_WIDTH, shutil.get_terminal_size((80, 24)).columns)


def table(header: list[str], rows: list[list[str]], width: int | None = None, right: set | None = None,
          choose: str | None = None) -> list[str]:
    """Aligned lines no wider than ``width`` (default :func:`terminal_width`): the widest
    columns are cut (a cut cell ends in ``…``) down to their header's width (at least 4);
    columns that still do not fit are left out, from the right, with a note on stderr
    naming the command's option that chooses columns (``choose``), if it has one."""
    width = terminal_width() if width is None else width
    right = right or set()
    ncol = len(header)
    widths = [max([len(header[i])] + [len(r[i]) for r in rows]) for i in range(ncol)]
    floors = [min(widths[i], max(len(header[i]), 4)) for i in range(ncol)]
    while ncol > 1 and sum(floors[:ncol]) + 2 * (ncol - 1) > width:
        ncol -= 1
    if ncol < len(header):
        left = len(header) - ncol
        how = f"choose columns with {choose}, or use --json" if choose else "use --json, or a wider terminal"
        click.echo(f"note: {left} column{'s' if left > 1 else ''} left out to fit {width} columns "
                   f"({', '.join(header[ncol:])}); {how}", err=True)
        header, rows = header[:ncol], [r[:ncol] for r in rows]
        widths = widths[:ncol]
    budget = width - 2 * (ncol - 1)
    while sum(widths) > budget:
        i = max(range(ncol), key=lambda j: widths[j] - floors[j])
        if widths[i] <= floors[i]:
            break
        widths[i] -= 1

    def cell(text: str, i: int) -> str:
        if len(text) > widths[i]:
            text = text[: widths[i] - 1] + CUT
        return text.rjust(widths[i]) if i in right else text.ljust(widths[i])

    lines = ["  ".join(cell(h, i) for i, h in enumerate(header)).rstrip()]
    lines += ["  ".join(cell(c, i) for i, c in enumerate(r)).rstrip() for r in rows]
    return lines


def rows_table(slots, batch: dict, keys: list[str], *, transitions=None, envs=None, choose: str | None = None
               ) -> list[str]:
    """A table of transitions: their slot (and transition number ``t`` and ``env`` when
    given), then one column per key."""
    lead = [("slot", slots)] + [(name, col) for name, col in (("t", transitions), ("env", envs)) if col is not None]
    cols = [[str(v) for v in np.asarray(col).tolist()] for _, col in lead]
    for k in keys:
        col = np.asarray(batch[k])
        if col.ndim == 1 and col.dtype.kind == "f":  # a column of numbers: the digits that tell them apart
            cols.append(fmt_numbers(col.astype(np.float64).tolist()))
        else:
            cols.append([fmt_value(v) for v in batch[k]])
    rows = [[c[i] for c in cols] for i in range(len(cols[0]))]
    return table([name for name, _ in lead] + keys, rows, right=set(range(len(lead))), choose=choose)


def kv_lines(pairs: list[tuple[str, object]], width: int | None = None) -> list[str]:
    """``key  value`` lines, keys aligned; long values wrap onto indented lines."""
    width = terminal_width() if width is None else width
    keyw = max(len(k) for k, _ in pairs)
    room = max(20, width - keyw - 2)
    lines = []
    for key, value in pairs:
        # at spaces where there are some (never inside a number); a long path is cut anywhere
        chunks = textwrap.wrap(str(value), room, break_on_hyphens=False) or [""]
        lines.append(f"{key:<{keyw}}  {chunks[0]}")
        lines += [" " * (keyw + 2) + c for c in chunks[1:]]
    return lines


def echo_lines(lines, indent: str = "") -> None:
    for line in lines:
        click.echo(indent + line)


def note_overtaken(skipped: int) -> None:
    """Tell stderr how many requested rows the live writer overwrote before they were read."""
    if skipped:
        click.echo(f"note: the live writer overwrote {skipped} of the requested transitions before they "
                   "were read; they are left out", err=True)


def returns_line(ep: dict) -> str:
    """The returns summary; episodes with a NaN or infinite return are counted, not averaged."""
    if not ep["complete_episodes"]:
        return "returns: no complete episodes"
    bad = ep["nonfinite_returns"]
    head = (f"returns over {ep['complete_episodes']} complete episodes" if not bad else
            f"returns over the {ep['finite_returns']} of {ep['complete_episodes']} complete episodes with a "
            f"finite return ({bad} NaN or infinite)")
    if not ep["finite_returns"]:
        return head + ": none to summarize"
    mean, lo, hi = fmt_numbers([ep["return_mean"], ep["return_min"], ep["return_max"]])
    return f"{head}: mean {mean}, min {lo}, max {hi}"


# ---------------------------------------------------------------- errors
# (API term, CLI term, the commands it applies to: None for all)
CLI_TERMS = ((r"overwrite=True", "--overwrite", None), (r"DiskReplay\.open\(\) to resume it", "another path", None),
             (r"\bbatch_size\b", "-n", {"sample"}), (r"\bn_step\b", "--n-step", {"sample"}),
             (r"^env must", "--env must", {"show", "episodes"}))


def cli_message(message: str, command: str | None = None) -> str:
    """A library error message in the command line's terms (its flags, not API arguments)."""
    for api, flag, commands in CLI_TERMS:
        if commands is None or command in commands:
            message = re.sub(api, flag, message)
    for internal, plain in HDF5_REASONS:
        message = re.sub(internal, plain, message)
    return HDF5_CALL.sub(r"\g<why>", message)


# HDF5's reasons that name its internals, in plain words.
HDF5_REASONS = ((r"truncated file: eof = (\d+), sblock->base_addr = \d+, stored_eof = (\d+)",
                 r"truncated: \1 of its \2 bytes"),
                (r"actual len exceeds EOA", "its size does not match the end its header records"))


# What to do when a command runs out of memory, in the flags it has.
LESS_MEMORY = {"stats": "read fewer rows (--last N, --start/--stop)", "episodes": "read fewer rows (--last N, "
               "--start/--stop)", "plot": "read fewer rows (--last N, --start/--stop)",
               "export": "export fewer rows (--start/--stop)", "sample": "draw a smaller batch (-n)",
               "show": "show fewer rows (--head/--tail N) or fewer fields (--fields)"}


def out_of_memory_message(command: str | None) -> str:
    hint = LESS_MEMORY.get(command)
    return f"out of memory in {command or 'the command'}; " + (f"{hint} or free memory" if hint else "free memory")


def closed_pipe() -> None:
    """The reader of stdout went away (``| head``): end quietly, with the status of a tool
    that the pipe's signal ended (141), not 1, which means a store problem."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the final flush goes nowhere
    except (OSError, ValueError, AttributeError):
        pass
    sys.exit(128 + signal.SIGPIPE)


# fsutil.atomic_replace's staging names (``.<name>.<pid>.<hex>.tmp``; HDF5 may add a suffix)
TEMP_NAME = re.compile(r"^\.(?P<path>.+)\.\d+\.[0-9a-f]{16}\.tmp(\.\w+)?$")
HDF5_OPEN = re.compile(r"name = '(?P<name>[^']*)', errno = (?P<errno>\d+)")
HDF5_CALL = re.compile(r"Unable to (synchronously )?[a-z ]+? \((?P<why>[^()]*)\)")  # the HDF5 call, not its reason
HDF5_WRAPPER = re.compile(r"^Unable to (synchronously )?(?P<what>[\w ]+?) \((?P<why>.*)\)$")


def user_path(path) -> str:
    """The path a user named for a file written beside it under a temporary name."""
    text = os.fsdecode(path)
    head, name = os.path.split(text)
    m = TEMP_NAME.match(name)
    if m:
        return os.path.join(head, m.group("path"))
    return text


def os_error_message(exc: OSError) -> str:
    """An OSError in the command line's terms: the path the user gave (not the temporary
    file written beside it), the system's reason, no errno numbers or HDF5 call stacks."""
    if isinstance(exc, DiskReplayError):  # the library's own message, with the errno it kept
        return cli_message(exc.strerror if exc.errno and exc.strerror else str(exc))
    text = str(exc)
    reason = exc.strerror or (os.strerror(exc.errno) if exc.errno else None)
    filename = exc.filename
    m = HDF5_OPEN.search(text)
    if m:  # h5py: "Unable to synchronously create file (unable to open file: name = '...', errno = 2, ...)"
        filename, reason = m.group("name"), os.strerror(int(m.group("errno")))
    elif reason is None:
        w = HDF5_WRAPPER.match(text)
        reason = w.group("why") if w else text
    if filename:
        return f"{user_path(filename)}: {reason}"
    return reason


def handle_errors(func):
    """Library errors become ``Error: ...`` on stderr in the command line's terms, without a
    traceback: exit 2 for a bad argument (InvalidArgumentError, an index outside the store,
    as for click's own checks), else exit 1. A closed pipe (``| head``) ends quietly (141)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context(silent=True)
        name = ctx.info_name if ctx is not None else None
        try:
            return func(*args, **kwargs)
        except BrokenPipeError:
            closed_pipe()
        except (InvalidArgumentError, IndexOutOfRangeError) as exc:
            raise click.UsageError(cli_message(str(exc), name), ctx=ctx) from None
        except OSError as exc:  # the library's StoreIOError and the like too
            raise click.ClickException(os_error_message(exc)) from None
        except MemoryError:
            raise click.ClickException(out_of_memory_message(name)) from None
        except DiskReplayError as exc:
            raise click.ClickException(cli_message(str(exc), name)) from None

    return wrapper


# ---------------------------------------------------------------- progress
@contextlib.contextmanager
def progress(label: str):
    """A callback ``update(done, total)`` for the library's ``progress=`` arguments.

    It draws a bar on stderr, created at the first call (when ``total`` is known), only
    when stderr is a terminal and there is something to do."""
    with contextlib.ExitStack() as stack:
        bar, shown = None, 0

        def update(done: int, total: int) -> None:
            nonlocal bar, shown
            if bar is None:
                if not sys.stderr.isatty() or total <= 0:
                    bar = False
                else:
                    bar = stack.enter_context(click.progressbar(length=total, label=label, file=sys.stderr))
            if bar is not False:
                bar.update(done - shown)
                shown = done

        yield update
