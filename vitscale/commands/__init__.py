"""One module per CLI command; each exposes ``HELP`` (its line in ``vitscale --help``) and
``register(subparsers)`` (``vitscale.cli`` calls it only for the command being run, so what it
imports costs nothing to the other commands)."""

from __future__ import annotations

import argparse
import textwrap
import typing

from ..shell import SHELL_FLAG


def field_choices(cls: type, name: str) -> tuple[str, ...]:
    """The choices of a config field (its ``Literal[...]`` type), for an option that mirrors it."""
    return typing.get_args(typing.get_type_hints(cls)[name])


OVERRIDES_HELP = "dotted config overrides, e.g. optim.lr=1e-3 (vitscale config lists the groups and their fields)"


def add_overrides(p: argparse.ArgumentParser, dest: str = "overrides", *, nargs: str = "*", metavar: str = "key=value",
                  help: str = OVERRIDES_HELP) -> None:  # fmt: skip
    """Add the positional argument of a command's dotted config overrides. ``vitscale.cli`` also gives it
    the ``key=value`` arguments that follow an option, and answers an option that names a config field
    (``--lr 1e-3``) with the override to write (``optim.lr=1e-3``)."""
    p.add_argument(dest, nargs=nargs, metavar=metavar, help=help)
    p.set_defaults(overrides_dest=dest)




def add_shell_flag(p: argparse.ArgumentParser) -> None:
    """Add :data:`SHELL_FLAG` (``args.allow_shell``) to a command that loads a config file."""
    p.add_argument(SHELL_FLAG, dest="allow_shell", action="store_true",
                   help="run the shell commands (pipe: data paths) the config file holds; without it they are "
                        "refused unless given on the command line (a run folder's config.yaml may come from "
                        "anyone: docs/trust.md)")  # fmt: skip


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Plain-text help for every command: the description and epilog are wrapped to the terminal
    paragraph by paragraph, while lines that start with a space (examples, commands) are kept as
    written. Give it as ``formatter_class`` to ``add_parser``."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out: list[str] = []
        para: list[str] = []

        def flush() -> None:
            if para:
                out.extend(textwrap.wrap(" ".join(para), width, initial_indent=indent, subsequent_indent=indent,
                                         break_long_words=False, break_on_hyphens=False))
                para.clear()

        for line in text.strip("\n").splitlines():
            if not line.strip():
                flush()
                out.append("")
            elif line[0].isspace():
                flush()
                out.append(indent + line)
            else:
                para.append(line.strip())
        flush()
        return "\n".join(out)


class DefaultsHelpFormatter(HelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """``HelpFormatter`` that also appends each option's default to its help."""
