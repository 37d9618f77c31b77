"""``diskreplay``: inspect, verify, export and convert replay stores from a terminal.

Every command opens stores read-only and takes no lock, so it is safe beside a live writer.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import sys

import click
import numpy as np

from diskreplay import DiskReplay, DiskReplayError

from .inspect import (ChronoReader, OvertakenError, batch_keys, fmt_number, fmt_value, jsonable,
                      kv_lines, snapshot, table)

SHOW_DEFAULT = 10
_SHOW_RETRIES = 50


def handle_errors(func):
    """DiskReplayError and OS errors become ``Error: ...`` on stderr and exit 1, no traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except click.ClickException:
            raise
        except DiskReplayError as exc:
            raise click.ClickException(str(exc)) from None
        except OvertakenError as exc:
            raise click.ClickException(f"{exc}; the writer is faster than this read, "
                                       "try again or read fewer rows") from None
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            raise click.ClickException(f"{where}{exc.strerror or exc}") from None

    return wrapper


def open_reader(path: str) -> DiskReplay:
    try:
        return DiskReplay.open(path, mode="r")
    except DiskReplayError as exc:
        raise click.ClickException(str(exc)) from None


def need_fields(buf: DiskReplay) -> None:
    if buf.fields is None:
        raise click.ClickException(f"{buf.path} holds no transitions yet (its fields are declared by the first add)")


def echo_json(data) -> None:
    click.echo(json.dumps(jsonable(data)))


@contextlib.contextmanager
def progress_bar(total: int, label: str):
    """A callback ``advance(n)``; draws a bar on stderr only when stderr is a terminal."""
    if not sys.stderr.isatty() or total <= 0:
        yield lambda n: None
        return
    with click.progressbar(length=total, label=label, file=sys.stderr) as bar:
        yield bar.update


def chrono_range(size: int, start: int | None, stop: int | None) -> tuple[int, int]:
    """Chronological ``[start, stop)``; negative values count from the newest, like Python slices."""
    lo = 0 if start is None else (start + size if start < 0 else start)
    hi = size if stop is None else (stop + size if stop < 0 else stop)
    if not 0 <= lo <= size:
        raise click.BadParameter(f"{start} is outside the store's {size} transitions", param_hint="--start")
    if not lo <= hi <= size:
        raise click.BadParameter(f"{stop} must lie in [{lo}, {size}]", param_hint="--stop")
    return lo, hi


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="diskreplay")
def main() -> None:
    """Inspect diskreplay stores: replay buffers on disk.

    Commands open stores read-only and never block or change a running trainer.
    """


# ---------------------------------------------------------------- info
@main.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@handle_errors
def info(path: str, as_json: bool) -> None:
    """Show what the store at PATH holds: backend, sizes, counters and fields.

    Example: diskreplay info runs/pong.replay
    """
    from .inspect import store_info

    with open_reader(path) as buf:
        data = store_info(buf)
    if as_json:
        echo_json(data)
        return
    pairs = [("path", data["path"]), ("backend", data["backend"]),
             ("format_version", data["format_version"]), ("max_size", data["max_size"]),
             ("size", data["size"]), ("seen_size", data["seen_size"]), ("head", data["head"]),
             ("num_envs", data["num_envs"]), ("batch_size", data["batch_size"]),
             ("use_cer", data["use_cer"]), ("disk_bytes", data["disk_bytes"]),
             ("writer", "live" if data["writer_alive"] else "none"),
             ("last_flush", data["last_flush"] or "never")]
    for line in kv_lines(pairs):
        click.echo(line)
    click.echo("fields:")
    if not data["fields"]:
        click.echo("  (none yet: declared by the first add)")
        return
    rows = [[name, str(tuple(spec["shape"])), spec["dtype"]] for name, spec in data["fields"].items()]
    for line in table(["name", "shape", "dtype"], rows, width=78):
        click.echo("  " + line)


# ---------------------------------------------------------------- show
def parse_indices(values) -> list[int]:
    out = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                out.append(int(part))
            except ValueError:
                raise click.BadParameter(f"{part!r} is not an integer slot index", param_hint="--index") from None
    return out


def parse_fields(spec: str | None, keys: list[str]) -> list[str]:
    if spec is None:
        return keys
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in keys]
    if unknown or not names:
        raise click.BadParameter(f"unknown field(s) {', '.join(unknown) or '(none given)'}; "
                                 f"the store has {', '.join(keys)}", param_hint="--fields")
    return names


def read_rows(buf: DiskReplay, head: int | None, tail: int | None, index: list[int] | None):
    """(slots, batch) for the requested rows, taken from one snapshot.

    ``--head``/``--tail`` rows are retried with a fresh snapshot when the live writer
    overwrote any of them between the snapshot and the read."""
    for _ in range(_SHOW_RETRIES):
        snap = snapshot(buf)
        if index is not None:
            slots = np.asarray(index, np.int64)
            return slots, buf.get(slots)
        if head is not None:
            lo, hi = 0, min(head, snap.size)
        else:
            lo, hi = snap.size - min(tail, snap.size), snap.size
        positions = np.arange(lo, hi, dtype=np.int64)
        reader = ChronoReader(buf, snap, lo, hi, max(1, hi - lo))
        try:
            got = list(reader)
        except OvertakenError:
            continue
        if reader.skipped:
            continue
        batch = got[0][1] if got else buf.get(np.empty(0, np.int64))
        return snap.slot(positions), batch
    raise OvertakenError("the live writer kept overwriting the requested rows")


@main.command()
@click.argument("path", type=click.Path())
@click.argument("more", nargs=-1, type=str, metavar="[I ...]")
@click.option("--head", "head", type=click.IntRange(min=0), help="The oldest N transitions.")
@click.option("--tail", "tail", type=click.IntRange(min=0),
              help=f"The newest N transitions (the default, N={SHOW_DEFAULT}).")
@click.option("--index", "index", multiple=True,
              help="Slot indices in [0, size): --index 3 4 5, or --index 3,4,5.")
@click.option("--fields", "fields", metavar="a,b", help="Only these keys (e.g. states,rewards).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of row objects, arrays in full.")
@handle_errors
def show(path, more, head, tail, index, fields, as_json) -> None:
    """Show transitions of the store at PATH with their slots.

    --head and --tail list rows in chronological order (oldest first); --index lists
    the given slots in the order given. In the table, arrays of more than 4 elements
    are summarized as shape min..max ~mean; --json gives them in full.

    Examples: diskreplay show runs/pong.replay --tail 5;
    diskreplay show runs/pong.replay --index 0 7 9 --fields actions,rewards --json
    """
    if more and not index:
        raise click.UsageError(f"unexpected argument(s) {' '.join(more)}; slot indices go after --index")
    chosen = sum(x is not None and x != () for x in (head, tail, index))
    if chosen > 1:
        raise click.UsageError("give only one of --head, --tail and --index")
    idx_list = parse_indices(list(index) + list(more)) if index else None
    if chosen == 0:
        tail = SHOW_DEFAULT
    with open_reader(path) as buf:
        need_fields(buf)
        keys = parse_fields(fields, batch_keys(buf))
        slots, batch = read_rows(buf, head, tail, idx_list)
    if as_json:
        echo_json([{"slot": int(s), **{k: batch[k][i] for k in keys}} for i, s in enumerate(slots.tolist())])
        return
    if len(slots) == 0:
        click.echo("(no rows)")
        return
    rows = [[str(s)] + [fmt_value(batch[k][i]) for k in keys] for i, s in enumerate(slots.tolist())]
    for line in table(["slot"] + keys, rows, right={0}):
        click.echo(line)


# ---------------------------------------------------------------- stats
@main.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@handle_errors
def stats(path: str, as_json: bool) -> None:
    """Per-field statistics and episode returns of the store at PATH.

    min, max, mean and std are over all elements of each field, read in row blocks
    (bounded memory). Episodes are reconstructed per env from the env-major order
    and dones; returns are over complete episodes (whose start is still in the
    store), so an episode cut by the ring's wrap is not counted.

    Example: diskreplay stats runs/pong.replay --json
    """
    from .inspect import compute_stats

    with open_reader(path) as buf:
        need_fields(buf)
        total = buf.size
        with progress_bar(total, "reading") as advance:
            data = compute_stats(buf, progress=advance)
    if data["skipped_overwritten"]:
        click.echo(f"note: the live writer overwrote the {data['skipped_overwritten']} oldest "
                   "transitions before they were read; they are left out", err=True)
    if as_json:
        echo_json(data)
        return
    click.echo(f"{data['size']} transitions (seen_size {data['seen_size']})")
    rows = []
    for name, s in data["fields"].items():
        cells = [fmt_number(s[k]) if s[k] is not None else "-" for k in ("min", "max", "mean", "std")]
        rows.append([name] + cells)
    for line in table(["field", "min", "max", "mean", "std"], rows, right={1, 2, 3, 4}):
        click.echo(line)
    ep = data["episodes"]
    click.echo("")
    click.echo(f"dones: {data['dones']}")
    env_rows = [[str(e), str(d), str(c)] for e, (d, c) in
                enumerate(zip(ep["dones_per_env"], ep["complete_episodes_per_env"]))]
    for line in table(["env", "episodes", "complete"], env_rows, right={0, 1, 2}):
        click.echo(line)
    if ep["complete_episodes"]:
        click.echo(f"returns over {ep['complete_episodes']} complete episodes: mean "
                   f"{fmt_number(ep['return_mean'])}, min {fmt_number(ep['return_min'])}, "
                   f"max {fmt_number(ep['return_max'])}")
    else:
        click.echo("returns: no complete episodes")


# ---------------------------------------------------------------- sample
@main.command()
@click.argument("path", type=click.Path())
@click.option("-n", "n", type=click.IntRange(min=1), help="Batch size (default: the store's batch_size).")
@click.option("--seed", type=click.IntRange(min=0),
              help="Draw indices with an own generator seeded with S (reproducible).")
@click.option("--json", "as_json", is_flag=True, help="Print the batch as a JSON dict of lists.")
@handle_errors
def sample(path, n, seed, as_json) -> None:
    """Draw a batch from the store at PATH, as sample() returns it.

    Without --seed the batch is the one the store's own sampler would draw next;
    either way the store's sampler state is never moved. With --seed, indices are
    uniform in [0, size) from numpy's default_rng(S). --json adds the drawn slots
    under "idxs".

    Example: diskreplay sample runs/pong.replay -n 4 --seed 0 --json
    """
    with open_reader(path) as buf:
        need_fields(buf)
        n = n or buf.batch_size
        if seed is None:
            batch = buf.sample(n)
            idxs = np.asarray(buf.batch_idxs)
        else:
            size = buf.size
            if size == 0:
                raise click.ClickException(f"cannot sample from {path}: the store is empty")
            idxs = np.random.default_rng(seed).integers(0, size, n, dtype=np.int64)
            batch = buf.get(idxs)
        keys = batch_keys(buf)
    if as_json:
        echo_json({"idxs": idxs, **{k: batch[k] for k in keys}})
        return
    rows = [[str(s)] + [fmt_value(batch[k][i]) for k in keys] for i, s in enumerate(idxs.tolist())]
    for line in table(["slot"] + keys, rows, right={0}):
        click.echo(line)


# ---------------------------------------------------------------- verify
@main.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@handle_errors
def verify(path: str, as_json: bool) -> None:
    """Check the store at PATH for damage, read-only; exit 0 when sound, 1 when damaged.

    Checks the description, the live counters, every file's size and header (HDF5
    structure for the hdf5 backend), both checkpoint slots, and reads every row once.
    Rows have no per-row checksums yet, so silent changes to row bytes go unseen.

    Example: diskreplay verify runs/pong.replay
    """
    from diskreplay.verify import verify_store

    if not os.path.exists(path):
        raise click.ClickException(f"no store at {path}: the path does not exist")
    if not os.path.isdir(path):
        raise click.ClickException(f"{path} is a file, not a diskreplay store (a store is a directory)")
    if not {"store.json", "meta.bin", "CREATING"} & set(os.listdir(path)):
        raise click.ClickException(f"{path} is not a diskreplay store: it has no store.json")
    state = {"bar": None, "last": 0}

    def progress(done: int, total: int) -> None:
        if state["bar"] is None:
            state["cm"] = progress_bar(total, "verifying")
            state["bar"] = state["cm"].__enter__()
        state["bar"](done - state["last"])
        state["last"] = done

    try:
        report = verify_store(path, progress=progress)
    finally:
        if state["bar"] is not None:
            state["cm"].__exit__(None, None, None)
    if as_json:
        echo_json({"path": report.path, "ok": report.ok, "problems": report.problems,
                   "checked": report.checked, "notes": report.notes})
    else:
        click.echo(report.summary())
    if not report.ok:
        sys.exit(1)


# ---------------------------------------------------------------- export
@main.command()
@click.argument("path", type=click.Path())
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["npz", "hdf5"]),
              help="Output format (default: from OUT's suffix, .h5/.hdf5 for HDF5, else npz).")
@click.option("--start", type=int, help="First chronological position (0 = oldest; negative counts from the newest).")
@click.option("--stop", type=int, help="Position after the last one (default: size).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@handle_errors
def export(path, out, fmt, start, stop, overwrite) -> None:
    """Export the transitions of the store at PATH to OUT, oldest first.

    OUT gets the arrays states, actions, rewards, next_states (materialized), dones,
    any extras, and slots (the slot each row came from). HDF5 output is written in row
    blocks (bounded memory); npz output is built in memory.

    Example: diskreplay export runs/pong.replay pong.h5 --start -1000
    """
    from .export import export_store, format_for

    fmt = format_for(out, fmt)
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise click.ClickException(f"cannot write {out}: the directory {parent} does not exist")
    if os.path.exists(out) and not overwrite:
        raise click.ClickException(f"{out} exists; pass --overwrite to replace it")
    with open_reader(path) as buf:
        need_fields(buf)
        snap = snapshot(buf)
        lo, hi = chrono_range(snap.size, start, stop)
        with progress_bar(hi - lo, "exporting") as advance:
            result = export_store(buf, snap, out, fmt, lo, hi, progress=advance)
    if result["skipped_overwritten"]:
        click.echo(f"note: the live writer overwrote the {result['skipped_overwritten']} oldest "
                   "requested transitions before they were read; they are left out", err=True)
    click.echo(f"exported {result['rows']} transitions to {out} ({fmt})")


# ---------------------------------------------------------------- plot
@main.command()
@click.argument("path", type=click.Path())
@click.argument("out", type=click.Path(dir_okay=False), metavar="OUT.png")
@handle_errors
def plot(path, out) -> None:
    """Plot episode returns over time and per-field histograms of PATH to OUT.png.

    Needs matplotlib: pip install 'diskreplay[plot]'.

    Example: diskreplay plot runs/pong.replay pong.png
    """
    from .plot import load_pyplot, plot_store

    try:
        plt = load_pyplot()
    except ImportError as exc:
        raise click.ClickException(str(exc)) from None
    with open_reader(path) as buf:
        need_fields(buf)
        result = plot_store(buf, out, plt)
    click.echo(f"wrote {out}: {result['episodes']} episode returns, "
               f"histograms of {', '.join(result['histograms']) or 'no fields'}")


# ---------------------------------------------------------------- convert
@main.command()
@click.argument("src", type=click.Path())
@click.argument("dst", type=click.Path())
@click.option("--backend", required=True, type=click.Choice(["memmap", "hdf5"]), help="Backend of DST.")
@click.option("--overwrite", is_flag=True, help="Replace an existing store at DST.")
@handle_errors
def convert(src, dst, backend, overwrite) -> None:
    """Copy the store SRC to a new store DST with another backend.

    Contents, counters and the sampler's state are kept. SRC is only read.

    Example: diskreplay convert runs/pong.replay runs/pong-h5.replay --backend hdf5
    """
    state = {"bar": None, "last": 0}

    def progress(done: int, total: int) -> None:
        if state["bar"] is None:
            state["cm"] = progress_bar(total, "converting")
            state["bar"] = state["cm"].__enter__()
        state["bar"](done - state["last"])
        state["last"] = done

    try:
        DiskReplay.convert(src, dst, backend=backend, progress=progress, overwrite=overwrite)
    finally:
        if state["bar"] is not None:
            state["cm"].__exit__(None, None, None)
    click.echo(f"converted {src} to {dst} ({backend})")


if __name__ == "__main__":  # pragma: no cover
    main()
