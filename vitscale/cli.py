"""The ``vitscale`` command line: ``vitscale <command> --help`` documents each command.

Each command lives in its own module under ``vitscale.commands`` exposing ``HELP`` (its line in
``vitscale --help``) and ``register(subparsers)``, which adds a subparser whose ``func(args) -> int``
runs it. Only the command being run is registered in full; the others are listed by their ``HELP``,
so what a command's ``register`` imports (torch, for some) loads only when that command runs and
``vitscale --help`` starts without torch. An error a person can fix ends the command with one or two
lines and an exit code (:func:`vitscale.errors.describe`); ``--debug`` (before or after the command,
or ``VITSCALE_DEBUG=1``) shows the traceback instead. A command that takes dotted config overrides
(``commands.add_overrides``) also takes them after its options, and answers an option that names a
config field (``--lr 1e-3``) with the key=value to write instead. ``vitscale --import MODULE``
(repeatable, before the command) imports a user's module first, so that it can register a model
family, task, data format, evaluator or command (``vitscale.registry``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from .errors import EXIT_USAGE
from .registry import COMMANDS


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``vitscale`` parser. Every command is listed; ``command`` (the one being run) is registered in
    full, the others by their one-line ``HELP`` only. None: every command in full (to walk them all)."""
    parser = _Parser(
        prog="vitscale",
        description="Train Vision Transformers (ViT, ViT-22B, CLIP, VOLO) at every scale.",
    )
    from .version import __version__

    parser.add_argument("--version", action="version", version=f"vitscale {__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE", help=IMPORT_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        if command is None or command == name:
            cmd.register(sub)
        else:
            sub.add_parser(name, help=cmd.HELP)
    for p in sub.choices.values():  # `vitscale train ... --debug` works too
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its usage error said as every refusal is (once under torchrun:
    :func:`vitscale.launcher.say`); each command's subparser is one too."""

    def error(self, message: str):
        from .launcher import say

        say(f"{self.format_usage()}{self.prog}: error: {message}", EXIT_USAGE)
        self.exit(EXIT_USAGE)


def _command_in(argv: list[str]) -> str | None:
    """The command ``argv`` runs: its first word that is not an option or the value of ``--import``."""
    after_import = False
    for a in argv:
        if not a.startswith("-") and not after_import:
            return a
        after_import = a == "--import"
    return None


def _imports_in(argv: list[str]) -> list[str]:
    """The modules of the ``--import MODULE`` / ``--import=MODULE`` options before the command."""
    out, i = [], 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] == "--import" and i + 1 < len(argv):
            out.append(argv[i + 1])
            i += 1
        elif argv[i].startswith("--import="):
            out.append(argv[i].split("=", 1)[1])
        i += 1
    return out


_invoked: list[str] | None = None
"""The arguments :func:`main` was called with, as ``["vitscale", *argv]``, while it runs (None: from
``sys.argv``); kept here, not in ``vitscale.tools``, so that a command that needs no torch imports none."""


@contextlib.contextmanager
def invoked(argv: list[str] | None):
    """While a command runs: ``main(argv)`` called with arguments (in a notebook, a test, a script)
    records ``vitscale <argv>`` as its command line instead of the interpreter's ``sys.argv``."""
    global _invoked
    saved, _invoked = _invoked, (["vitscale", *argv] if argv is not None else None)
    try:
        yield
    finally:
        _invoked = saved


def invoked_argv() -> list[str] | None:
    """The command line :func:`main` was called with while it runs (``vitscale.tools.env.command_line``
    records it); None outside it or when it reads ``sys.argv``."""
    return _invoked


DEBUG_HELP = "show the full traceback of an error (also: VITSCALE_DEBUG=1)"
IMPORT_HELP = ("import a Python module first (repeatable), so that it registers its model family, task, data format, "
               "evaluator or command (a plug-in)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from .errors import debug_enabled, describe
    from .launcher import say

    given = sys.argv[1:] if argv is None else list(argv)
    from .errors import ConfigError
    from .registry import import_plugins

    try:
        import_plugins(_imports_in(given))  # before the parser: a plug-in may add a command
    except ConfigError as e:
        say(f"vitscale: {e}", e.exit_code)
        return e.exit_code
    parser = build_parser(_command_in(given) or "")
    args, extra = parser.parse_known_args(given)
    if extra:
        rc = _extra_arguments(parser, args, extra)
        if rc is not None:
            return rc
    if not getattr(args, "func", None):
        from .launcher import rank

        if not rank():
            parser.print_help()
        return EXIT_USAGE
    from .signals import EXIT_TERMINATED, Terminated, sigterm_raises

    debug = bool(args.debug) or debug_enabled()
    joined = _in_process_group()
    with invoked(argv), sigterm_raises():  # the command line a run records; SIGTERM as an exception
        try:
            rc = int(args.func(args) or 0)
        except Exception as e:  # KeyboardInterrupt too (below); SystemExit passes through
            rc = _report(args.command, e, debug, describe)
        except KeyboardInterrupt as e:
            rc = _report(args.command, e, debug, describe)
        except Terminated as e:  # everything on the way out has run: partial saves removed, lock released, logs closed
            if debug:
                raise
            if not getattr(e, "quiet", False):
                print(f"vitscale {args.command}: {e}", file=sys.stderr)
            rc = getattr(e, "exit_code", EXIT_TERMINATED)  # saved on a signal: 128 + its number (vitscale.train.preemption)
    if not joined and _in_process_group():  # the command joined torchrun's process group: leave it
        from vitscale.distributed import destroy_distributed

        destroy_distributed(barrier=rc == 0)
    return rc


def _extra_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> int | None:
    """Arguments argparse left over. A command's dotted overrides given after an option join its
    overrides (``vitscale train digits_vit --print-config train.max_steps=5``); an option that names a
    config field (``--lr 1e-3``) gets a one-line hint (exit code 2); anything else is argparse's error."""
    dest = getattr(args, "overrides_dest", None)
    if dest is not None:
        options = [a for a in extra if a.startswith("-")]
        if options:
            from .config.load import option_hint  # the schema, on this error path only

            hint = option_hint(extra)
            if hint:
                from .launcher import say

                say(f"vitscale {args.command}: {hint}", EXIT_USAGE)
                return EXIT_USAGE
        else:
            setattr(args, dest, [*getattr(args, dest), *extra])
            return None
    parser.error(f"unrecognized arguments: {' '.join(extra)}")  # exits with code 2
    return 2


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
    from .launcher import rank, say

    r = rank()
    say(f"vitscale {command}{f' (rank {r})' if r else ''}: {message}", code)  # a refusal: once, under torchrun
    return code
