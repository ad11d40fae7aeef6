"""The ``vitscale`` command line: ``vitscale <command> --help`` documents each command.

Each command lives in its own module under ``vitscale.commands`` exposing
``register(subparsers)``, which adds a subparser whose ``func(args) -> int`` runs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Command modules, in the order `vitscale --help` lists them.
COMMAND_MODULES = (
    "demo",
    "train",
    "eval",
    "export",
    "report",
    "data",
    "models",
    "bench",
    "bench_data",
    "label_tokens",
    "convert",
    "memory",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vitscale",
        description="Train Vision Transformers (ViT, ViT-22B, CLIP, VOLO) at every scale.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"vitscale {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"vitscale.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from .tools.env import invoked

    with invoked(argv):  # the command line a run records (summary.json, train.log)
        return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
