"""The ``vitscale`` command line: ``vitscale <command> --help`` documents each command.

Each command lives in its own module under ``vitscale.commands`` exposing
``register(subparsers)``, which adds a subparser whose ``func(args) -> int`` runs it. An error a
person can fix ends the command with one or two lines and an exit code
(:func:`vitscale.errors.describe`); ``--debug`` (before or after the command, or ``VITSCALE_DEBUG=1``)
shows the traceback instead.
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
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"vitscale.commands.{name}").register(sub)
    for p in sub.choices.values():  # `vitscale train ... --debug` works too
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


DEBUG_HELP = "show the full traceback of an error (also: VITSCALE_DEBUG=1)"


def main(argv: list[str] | None = None) -> int:
    from .errors import debug_enabled, describe

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from .signals import EXIT_TERMINATED, Terminated, sigterm_raises
    from .tools.env import invoked

    debug = bool(args.debug) or debug_enabled()
    joined = _in_process_group()
    with invoked(argv), sigterm_raises():  # the command line a run records; SIGTERM as an exception
        try:
            rc = int(args.func(args) or 0)
        except Exception as e:  # KeyboardInterrupt too (below); SystemExit passes through
            rc = _report(args.command, e, debug, describe)
        except KeyboardInterrupt as e:
            rc = _report(args.command, e, debug, describe)
        except Terminated as e:  # everything on the way out has run: partial saves removed, lock released
            if debug:
                raise
            print(f"vitscale {args.command}: {e}", file=sys.stderr)
            rc = EXIT_TERMINATED
    if not joined and _in_process_group():  # the command joined torchrun's process group: leave it
        from vitscale.distributed import destroy_distributed

        destroy_distributed(barrier=rc == 0)
    return rc


def _in_process_group() -> bool:
    dist = sys.modules.get("torch.distributed")  # never imports torch for a command that did not
    return dist is not None and dist.is_available() and dist.is_initialized()


def _report(command: str, e: BaseException, debug: bool, describe) -> int:
    """Print ``vitscale <command>: <what went wrong>`` and return the exit code; a bug (or --debug)
    goes on up with its traceback."""
    described = None if debug else describe(e)
    if described is None:
        raise e
    message, code = described
    print(f"vitscale {command}: {message}", file=sys.stderr)
    return code
