"""``diskreplay``: inspect, verify, export and convert replay stores from a terminal.

Every command opens stores read-only and takes no lock, so it is safe beside a live writer.
"""
from __future__ import annotations

import json
import os
import sys
import time

import click

from diskreplay import DiskReplay, DiskReplayError


def open_reader(path: str) -> DiskReplay:
    try:
        return DiskReplay.open(path, mode="r")
    except DiskReplayError as exc:
        raise click.ClickException(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="diskreplay")
def main() -> None:
    """Inspect diskreplay stores: replay buffers on disk.

    Commands open stores read-only and never block or change a running trainer.
    """


@main.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def info(path: str, as_json: bool) -> None:
    """Show what the store at PATH holds: backend, sizes, counters and fields.

    Example: diskreplay info runs/pong.replay
    """
    from .inspect import store_info

    with open_reader(path) as buf:
        data = store_info(buf)
    if as_json:
        click.echo(json.dumps(data))
        return
    rows = [("path", data["path"]), ("backend", data["backend"]),
            ("format_version", data["format_version"]), ("max_size", data["max_size"]),
            ("size", data["size"]), ("seen_size", data["seen_size"]), ("head", data["head"]),
            ("num_envs", data["num_envs"]), ("batch_size", data["batch_size"]),
            ("use_cer", data["use_cer"]), ("disk_bytes", data["disk_bytes"]),
            ("writer", "live" if data["writer_alive"] else "none"),
            ("last_flush", data["last_flush"] or "never")]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key:<{width}}  {value}")
    click.echo("fields:")
    if not data["fields"]:
        click.echo("  (none yet: declared by the first add)")
    for name, spec in (data["fields"] or {}).items():
        click.echo(f"  {name:<{width - 2}}  {tuple(spec['shape'])!s:<16} {spec['dtype']}")


if __name__ == "__main__":  # pragma: no cover
    main()
