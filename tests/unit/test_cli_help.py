"""Every command's --help reads as plain text: no argparse escapes (%%), no reStructuredText markup, a
help string for every argument."""

from __future__ import annotations

import argparse
import re

import pytest

from vitscale.cli import build_parser, main


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) for every command and subcommand, e.g. ("data", "digits")."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(build_parser()))
RST = re.compile(r"``|:(?:mod|func|class|meth|attr|ref|doc|data|obj):`")


def test_every_command_is_walked():
    names = {p for p, _ in COMMANDS}
    assert {("demo",), ("train",), ("eval",), ("report",), ("bench",), ("label-tokens",), ("memory",),
            ("data", "digits")} <= names  # fmt: skip


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_reads_as_plain_text(path, capsys):
    with pytest.raises(SystemExit) as e:
        main([*path, "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: vitscale {' '.join(path)}")
    assert "%%" not in text and "%(" not in text, text
    assert not RST.search(text), RST.search(text).group(0)
    parser = dict(COMMANDS)[path]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = "/".join(action.option_strings) or action.metavar or action.dest
        assert action.help and action.help != argparse.SUPPRESS, f"vitscale {' '.join(path)}: {name} has no help"
        assert name.split("/")[0] in text or str(action.metavar) in text


def test_top_level_help_lists_report(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "report" in out and "%%" not in out
