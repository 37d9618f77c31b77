"""``diskreplay``: inspect, verify, export and convert replay stores from a terminal.

Every command opens stores read-only and takes no lock, so it is safe beside a live writer.
Each one parses its arguments, makes one library call and renders the result (cli/output.py).
"""
from __future__ import annotations

import dataclasses
import os
import sys

import click

from diskreplay import DiskReplay
from diskreplay.backends import BACKENDS
from diskreplay.episodereader import EpisodeReader
from diskreplay.export import FORMATS, check_output_path, export_store, format_for
from diskreplay.stats import compute_stats
from diskreplay.verify import verify_store
from diskreplay.views import batch_keys, read_block, sample_batch, snapshot, store_info

from .output import (check_output, cli_message, echo_json, echo_lines, fmt_numbers, handle_errors, kv_lines,
                     note_overtaken, parse_fields, parse_indices, positions, progress, returns_line, rows_table, table,
                     terminal_width)
from .plot import load_pyplot, plot_format, plot_store
from .watch import watch_store

SHOW_DEFAULT = 10


def range_options(func):
    """``--last N`` or ``--start``/``--stop``: the chronological positions a command reads."""
    func = click.option("--stop", type=int, help="Position after the last one read (default: size).")(func)
    func = click.option("--start", type=int,
                        help="First chronological position (0 = oldest; negative counts from the newest).")(func)
    return click.option("--last", type=click.IntRange(min=0), metavar="N",
                        help="Only the newest N transitions.")(func)


def open_reader(path: str) -> DiskReplay:
    return DiskReplay.open(path, mode="r")


def refuse_empty(buf: DiskReplay, doing: str) -> None:
    """sample, export and plot make something of rows: a store without any is refused alike
    (exit 1), whether or not its fields were declared (show, stats and episodes list none)."""
    if buf.fields is None or snapshot(buf).size == 0:
        raise click.ClickException(f"{buf.path} holds no transitions yet: nothing to {doing}")


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
    """Show what the store at PATH holds: backend, sizes, counters and fields
    (and alpha and epsilon of a prioritized store, frame_stack of a store of frame stacks,
    whose states field shows whole stacks), and how batches not in RAM are read
    (cold_reads: which small fields the cold path keeps in RAM).

    Example: diskreplay info runs/pong.replay
    """
    with open_reader(path) as buf:
        data = store_info(buf)
    if as_json:
        echo_json(data)
        return
    keys = ("path", "backend", "format_version", "max_size", "size", "seen_size", "head", "num_envs",
            "batch_size", "use_cer") + (("prioritized", "alpha", "epsilon", "priority_tree") if data["prioritized"] else ()) + (
            ("frame_stack",) if data["frame_stack"] else ()) + ("disk_bytes",) + (
            ("cold_reads",) if data["cold_reads"] else ())
    echo_lines(kv_lines([(k, data[k]) for k in keys] + [("writer", "live" if data["writer_alive"] else "none"),
                                                        ("last_flush", data["last_flush"] or "never")]))
    click.echo("fields:")
    if not data["fields"]:
        click.echo("  (none yet: declared by the first add)")
        return
    rows = [[name, str(tuple(spec["shape"])), spec["dtype"]] for name, spec in data["fields"].items()]
    echo_lines(table(["name", "shape", "dtype"], rows, width=terminal_width() - 2), indent="  ")


# ---------------------------------------------------------------- show
@main.command()
@click.argument("path", type=click.Path())
@click.argument("more", nargs=-1, type=str, metavar="[I ...]")
@click.option("--head", "head", type=click.IntRange(min=0), metavar="N", help="The oldest N transitions.")
@click.option("--tail", "tail", type=click.IntRange(min=0), metavar="N",
              help=f"The newest N transitions (the default, N={SHOW_DEFAULT}).")
@click.option("--index", "index", multiple=True, metavar="I",
              help="Slot indices in [0, size): --index 3 4 5, or --index 3,4,5.")
@click.option("--env", "env", type=click.IntRange(min=0), metavar="E",
              help="Only env E's transitions (--head/--tail then count those; --index slots of other envs "
                   "are left out, with a note on stderr).")
@click.option("--fields", "fields", metavar="a,b", help="Only these keys (e.g. states,rewards).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of row objects, arrays in full.")
@handle_errors
def show(path, more, head, tail, index, env, fields, as_json) -> None:
    """Show transitions of the store at PATH with their slot, number and env.

    --head and --tail list rows in chronological order (oldest first); --index lists
    the given slots in the order given. t is the transition's number (1 for the first
    ever added), env the env that added it. In the table, arrays of more than 4
    elements are summarized as shape min..max ~mean; --json gives them in full.

    Examples: diskreplay show runs/pong.replay --tail 5 --env 1;
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
        if buf.fields is None:  # nothing added yet: as empty as a declared store without rows
            echo_json([]) if as_json else click.echo("(no rows)")
            return
        keys = parse_fields(fields, batch_keys(buf))
        block = read_block(buf, head=head, tail=tail, index=idx_list, env=env)
        envs = (block.transitions - 1) % buf.num_envs  # env-major: transition t came from env (t-1) % num_envs
    if idx_list is not None and env is not None and len(block.slots) < len(idx_list):
        click.echo(f"note: {len(idx_list) - len(block.slots)} of the {len(idx_list)} slots given hold other "
                   f"envs' transitions; --env {env} leaves them out", err=True)
    if as_json:
        echo_json([{"slot": int(s), "transition": int(t), "env": int(e), **{k: block.batch[k][i] for k in keys}}
                   for i, (s, t, e) in enumerate(zip(block.slots.tolist(), block.transitions.tolist(),
                                                     envs.tolist()))])
    elif len(block.slots) == 0:
        click.echo("(no rows)")
    else:
        echo_lines(rows_table(block.slots, block.batch, keys, transitions=block.transitions, envs=envs,
                              choose="--fields"))


# ---------------------------------------------------------------- stats
@main.command()
@click.argument("path", type=click.Path())
@range_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@handle_errors
def stats(path: str, last, start, stop, as_json: bool) -> None:
    """Per-field statistics and episode returns of the store at PATH.

    min, max, mean and std are over the finite elements of each field, read in row
    blocks (bounded memory; each field once, next states never, one- and two-byte
    integers summed exactly); the nonfinite column counts NaN and infinite elements.
    Episodes are reconstructed per env from the env-major order and dones; returns
    are over complete episodes (whose start is among the rows read), so an episode
    cut by the ring's wrap, by --last/--start or by a live writer overtaking the read
    is not counted. Rows a live writer overwrote before they were read are left out
    and counted on stderr.

    Examples: diskreplay stats runs/pong.replay --json;
    diskreplay stats runs/pong.replay --last 100000
    """
    start, stop = positions(last, start, stop)
    with open_reader(path) as buf, progress("reading") as update:
        data = compute_stats(buf, progress=update, start=start, stop=stop)
    note_overtaken(data["skipped_overwritten"])
    if as_json:
        echo_json(data)
        return
    click.echo(f"{data['size']} transitions (positions {data['start']}..{data['stop']} of a store with "
               f"seen_size {data['seen_size']})" if (data["start"], data["stop"]) != (0, data["size"]) else
               f"{data['size']} transitions (seen_size {data['seen_size']})")
    rows = [[name] + fmt_numbers([s[k] for k in ("min", "max", "mean")]) + fmt_numbers([s["std"]])
            + [str(s["nonfinite"])] for name, s in data["fields"].items()]
    echo_lines(table(["field", "min", "max", "mean", "std", "nonfinite"], rows, right={1, 2, 3, 4, 5}))
    for name, s in data["fields"].items():
        if s["nonfinite"]:
            click.echo(f"warning: {name} holds {s['nonfinite']} NaN or infinite values, left out of its "
                       "min, max, mean and std", err=True)
    ep = data["episodes"]
    click.echo("")
    click.echo(f"dones: {data['dones']}")
    env_rows = [[str(e), str(d), str(c)] for e, (d, c) in
                enumerate(zip(ep["dones_per_env"], ep["complete_episodes_per_env"]))]
    echo_lines(table(["env", "episodes", "complete"], env_rows, right={0, 1, 2}))
    click.echo(returns_line(ep))


# ---------------------------------------------------------------- episodes
@main.command()
@click.argument("path", type=click.Path())
@range_options
@click.option("--env", "env", type=click.IntRange(min=0), metavar="E", help="Only the episodes of env E.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of episode objects.")
@handle_errors
def episodes(path: str, last, start, stop, env, as_json: bool) -> None:
    """The episodes held in the store at PATH: env, length, return, complete, and the
    transition numbers (1-based, as seen_size counts) of their first and last rows.

    For each env oldest first, read in one streaming pass (bounded memory, safe beside a
    live writer). An episode ends at a done, at a truncation (a bool field named
    truncateds) or where a next state is not the state of its env's next row; it is
    complete when both its start and its end are held (not cut by the ring's wrap, by
    --last/--start, or by a live writer overtaking the read, nor still running).

    Examples: diskreplay episodes runs/pong.replay --last 100000;
    diskreplay episodes runs/pong.replay --env 0 --json
    """
    start, stop = positions(last, start, stop)
    with open_reader(path) as buf, progress("reading") as update:
        reader = EpisodeReader(buf, start, stop, env=env, data=False, progress=update)
        found = [{"env": ep.env, "length": ep.length, "return": ep.ret, "complete": ep.complete,
                  "first": ep.first, "last": ep.last} for ep in reader]
    note_overtaken(reader.skipped)
    if as_json:
        echo_json(found)
        return
    if not found:
        click.echo("no episodes")
        return
    rows = [[str(ep["env"]), str(ep["length"])] + fmt_numbers([ep["return"]])
            + ["yes" if ep["complete"] else "no", str(ep["first"]), str(ep["last"])] for ep in found]
    echo_lines(table(["env", "length", "return", "complete", "first", "last"], rows, right={0, 1, 2, 4, 5}))
    done = sum(ep["complete"] for ep in found)
    click.echo(f"{len(found)} episodes, {done} complete")


# ---------------------------------------------------------------- sample
@main.command()
@click.argument("path", type=click.Path())
@click.option("-n", "n", type=click.IntRange(min=1), metavar="N",
              help="Batch size N (default: the store's batch_size).")
@click.option("--seed", type=click.IntRange(min=0), metavar="S",
              help="Draw indices with an own generator seeded with S (reproducible).")
@click.option("--n-step", "n_step", type=int, default=1, show_default=True, metavar="N",
              help="n-step returns over up to N transitions of each env (adds discounts).")
@click.option("--gamma", type=float, default=0.99, show_default=True, metavar="G",
              help="Discount G of the n-step returns.")
@click.option("--json", "as_json", is_flag=True, help="Print the batch as a JSON dict of lists.")
@handle_errors
def sample(path, n, seed, n_step, gamma, as_json) -> None:
    """Draw a batch from the store at PATH, as sample() returns it.

    Without --seed the batch is the one the store's own sampler would draw next;
    either way the store's sampler state is never moved. With --seed, indices are
    uniform in [0, size) from numpy's default_rng(S). --json adds the drawn slots
    under "idxs". --n-step N gives n-step rows (discounted rewards over up to N
    transitions of each env and episode, and their discounts), as sample(n_step=N).
    On a prioritized store the batch is drawn by priority and has its weights
    (beta 0.4); with --seed the indices are uniform and it has their priorities.

    Example: diskreplay sample runs/pong.replay -n 4 --seed 0 --json
    """
    with open_reader(path) as buf:
        refuse_empty(buf, "sample")
        idxs, batch = sample_batch(buf, n, seed=seed, n_step=n_step, gamma=gamma)
        keys = batch_keys(buf)
        keys += [key for key in batch if key not in keys]  # discounts, with --n-step
    if as_json:
        echo_json({"idxs": idxs, **{k: batch[k] for k in keys}})
    else:
        echo_lines(rows_table(idxs, batch, keys))


# ---------------------------------------------------------------- verify
@main.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@handle_errors
def verify(path: str, as_json: bool) -> None:
    """Check the store at PATH for damage, read-only; exit 0 when sound, 1 when damaged.

    Checks the description, the live counters, every file's size and header (HDF5
    structure for the hdf5 backend) and both checkpoint slots, and reads every row
    once: each row durable at the last flush is checked against its CRC-32 in
    rowsums.npy (rows added since have no CRC yet and are only read).

    Example: diskreplay verify runs/pong.replay
    """
    with progress("verifying") as update:
        report = verify_store(path, progress=update)
    if as_json:
        echo_json(dataclasses.asdict(report))
    else:
        click.echo(cli_message(report.summary()))
    if not report.ok:
        sys.exit(1)


# ---------------------------------------------------------------- export
@main.command()
@click.argument("path", type=click.Path())
@click.argument("out", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)),
              help="Output format (default: from OUT's suffix, .h5/.hdf5 for HDF5, else npz).")
@range_options
@click.option("--dataset-id", help="minari: the dataset's id, NAME-vN (default: the store's name, -v0).")
@click.option("--include-incomplete", is_flag=True,
              help="minari: keep episodes the ring cut or that have not ended (skipped and counted by default).")
@click.option("--overwrite", is_flag=True, help="Replace OUT (minari: the dataset in OUT) if it exists.")
@handle_errors
def export(path, out, fmt, last, start, stop, dataset_id, include_incomplete, overwrite) -> None:
    """Export the transitions of the store at PATH to OUT, oldest first.

    npz and hdf5: the arrays states, actions, rewards, next_states, dones, any extras
    and slots (the slot each row came from), in chronological order.

    d4rl: one HDF5 file as D4RL lays it out (observations, actions, rewards,
    terminals, timeouts, next_observations, infos/<extra>), per env, each env's
    transitions oldest first; timeouts from a truncateds field, plus where an episode
    or an env's rows end without terminating. Float observations are float32,
    integer ones keep their dtype (uint8 frames stay uint8).

    minari: OUT is a Minari datasets root (a directory); the dataset goes to
    OUT/DATASET_ID, loaded by minari.load_dataset(DATASET_ID) with
    MINARI_DATASETS_PATH=OUT. Needs pip install 'diskreplay[minari]'.

    Every format streams: memory stays flat whatever the store's size. Beside a live
    writer, rows it overwrote before they were read are left out and counted on stderr
    (--last N reads fewer, so fewer are lost).

    Example: diskreplay export runs/pong.replay pong.h5 --last 1000
    """
    start, stop = positions(last, start, stop)
    out = check_output_path(out)  # never inside a store, before anything else is looked at
    fmt = format_for(out, fmt)
    if fmt != "minari":
        check_output(out, overwrite)
    with open_reader(path) as buf, progress("exporting") as update:
        refuse_empty(buf, "export")
        result = export_store(buf, out, fmt=fmt, start=start, stop=stop, progress=update, overwrite=overwrite,
                              dataset_id=dataset_id, include_incomplete=include_incomplete)
    note_overtaken(result["skipped_overwritten"])
    if fmt != "minari":
        click.echo(f"exported {result['rows']} transitions to {out} ({fmt})")
        return
    click.echo(f"exported {result['episodes']} episodes ({result['rows']} transitions) to "
               f"{os.path.join(out, result['dataset_id'])} (load it with MINARI_DATASETS_PATH={out})")
    if result["skipped_incomplete"]:
        click.echo(f"note: skipped {result['skipped_incomplete']} incomplete episodes (cut by the ring or not "
                   "ended); --include-incomplete keeps them", err=True)


# ---------------------------------------------------------------- plot
@main.command()
@click.argument("path", type=click.Path())
@click.argument("out", type=click.Path(dir_okay=False), metavar="OUT.png")
@range_options
@handle_errors
def plot(path, out, last, start, stop) -> None:
    """Plot episode returns over time and per-field histograms of PATH to OUT.

    The format comes from OUT's suffix (.png, .pdf, .svg, ...). Returns are drawn as
    points with their rolling mean across all envs and a band of one standard
    deviation; integer fields get histogram bins of whole values. Needs matplotlib:
    pip install 'diskreplay[plot]'.

    Example: diskreplay plot runs/pong.replay pong.png --last 100000
    """
    out = check_output_path(out)
    try:
        plt = load_pyplot()
    except ImportError as exc:
        raise click.ClickException(str(exc)) from None
    fmt = plot_format(out, plt)
    start, stop = positions(last, start, stop)
    with open_reader(path) as buf:
        refuse_empty(buf, "plot")
        result = plot_store(buf, out, plt, fmt=fmt, start=start, stop=stop)
    note_overtaken(result["skipped_overwritten"])
    click.echo(f"wrote {out}: {result['episodes']} episode returns, "
               f"histograms of {', '.join(result['histograms']) or 'no fields'}")


# ---------------------------------------------------------------- watch
@main.command()
@click.argument("path", type=click.Path())
@click.option("--interval", type=click.FloatRange(min=0.05), default=2.0, show_default=True, metavar="SECONDS",
              help="Time between refreshes.")
@click.option("-n", "--count", type=click.IntRange(min=1), metavar="N",
              help="Refresh N times, then exit (default: until Ctrl-C).")
@click.option("--returns", "keep", type=click.IntRange(min=1), default=100, show_default=True, metavar="K",
              help="Summarize the returns of the last K episodes that ended.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per refresh, one a line.")
@handle_errors
def watch(path, interval, count, keep, as_json) -> None:
    """Follow the store at PATH while a trainer fills it: counters, add rate, recent
    episode returns and whether a writer is live, refreshed every --interval seconds.

    Read-only: it never writes to the store or blocks the writer; each refresh reads
    only the rewards and episode ends of the rows added since the previous one (at
    most the newest 100000). Returns count episodes that ended since watching began
    and whose start was read too. Ctrl-C quits (exit 0). Without a terminal (a pipe,
    a file) each refresh is printed below the previous one.

    Examples: diskreplay watch runs/pong.replay;
    diskreplay watch runs/pong.replay --interval 10 -n 6 --json
    """
    watch_store(path, interval, count, as_json, keep)


# ---------------------------------------------------------------- convert
@main.command()
@click.argument("src", type=click.Path())
@click.argument("dst", type=click.Path())
@click.option("--backend", required=True, type=click.Choice(BACKENDS), help="Backend of DST.")
@click.option("--overwrite", is_flag=True, help="Replace an existing store at DST.")
@handle_errors
def convert(src, dst, backend, overwrite) -> None:
    """Copy the store SRC to a new store DST with another backend.

    Contents, counters and the sampler's state are kept. SRC is only read: one whose writer
    was killed is read as recovery would leave it (a read-only copy converts too). DST is
    built under a temporary name and renamed into place when whole; with --overwrite an old
    store there stays until then.

    Example: diskreplay convert runs/pong.replay runs/pong-h5.replay --backend hdf5
    """
    with progress("converting") as update:
        DiskReplay.convert(src, dst, backend=backend, progress=update, overwrite=overwrite)
    click.echo(f"converted {src} to {dst} ({backend})")


if __name__ == "__main__":  # pragma: no cover
    main()
