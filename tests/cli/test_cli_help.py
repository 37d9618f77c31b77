"""The ``--help`` texts: every command has one, and what they claim is what the code does."""
from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from diskreplay.cli.main import main


def help_text(*args) -> str:
    r = CliRunner().invoke(main, [*args, "--help"], prog_name="diskreplay")
    assert r.exit_code == 0, r.output
    return " ".join(r.output.split())  # one line: claims may wrap anywhere


@pytest.mark.parametrize("command", sorted(main.commands))
def test_every_command_has_help_text(command):
    text = help_text(command)
    assert text.startswith(f"Usage: diskreplay {command}")
    description = " ".join((main.commands[command].help or "").split())
    assert description and description.split(". ")[0] in text
    assert f" {command} " in help_text()  # listed in the group's help
    assert "Example" in text
    for param in main.commands[command].params:
        if param.param_type_name == "option" and not param.hidden and param.name != "help":
            assert param.help, f"{command} {param.opts[0]} has no help text"


def test_verify_help_tells_that_rows_are_checksummed():
    text = help_text("verify")
    assert not re.search(r"no (per-row )?checksums?|unseen", text, re.IGNORECASE), text
    assert "CRC-32" in text and "rowsums.npy" in text


def test_options_show_the_names_their_help_uses():
    text = help_text("sample")
    for shown in ("-n N ", "--seed S ", "--n-step N ", "--gamma G "):
        assert shown in text, (shown, text)
    text = help_text("show")
    for shown in ("--head N ", "--tail N ", "--index I ", "--env E "):
        assert shown in text, (shown, text)
