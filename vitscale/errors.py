"""Errors a person can fix, and how every ``vitscale`` command reports them.

A :class:`UserError` (a config that does not load, an up-front check that fails, a damaged
checkpoint, a run folder in use, a run that diverged) carries a message of one or two lines that
names the path or the setting and the cause; the CLI prints it as ``vitscale <command>: <message>``
and exits with its ``exit_code``. :func:`describe` also turns the errors the operating system and
PyTorch raise for a person's input (a missing file, permission denied, a full disk, out of memory)
into such a line. Anything else is a bug and keeps its traceback. ``vitscale --debug`` (or
``VITSCALE_DEBUG=1``) shows the traceback of every error.

Exit codes: 0 done; 1 the run failed or was refused (a damaged checkpoint, a folder in use, a run
that diverged, a file that cannot be read or written); 2 the command line or the config must change
(a config error, a failed up-front check); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import errno
import os

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """A problem the user can fix; its message (one or two lines) says what and where."""

    exit_code = EXIT_FAILED


class CheckError(UserError, ValueError):
    """An up-front check of a run failed: the message names the field and the fix (exit code 2)."""

    exit_code = EXIT_USAGE


class NonFiniteError(UserError):
    """The run stopped on non-finite numbers: more non-finite steps than its budget allows
    (:mod:`vitscale.train.nonfinite`), or a teacher's non-finite outputs (:mod:`vitscale.tasks.distill`);
    the checkpoints so far are kept (exit code 1)."""


class ConfigError(UserError, ValueError):
    """A config that cannot be loaded or run here: unknown key, wrong type, bad value, missing file, a
    setting this machine cannot run (exit code 2). Raised by the config loader and by any layer that
    finds such a setting; ``vitscale.config`` exports it."""

    exit_code = EXIT_USAGE


def debug_enabled() -> bool:
    """``VITSCALE_DEBUG`` set to anything but empty / ``0`` (``vitscale --debug`` sets it)."""
    return os.environ.get("VITSCALE_DEBUG", "") not in ("", "0")


def _first_lines(text: str, n: int) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    more = " (... --debug shows the rest)" if len(lines) > n else ""
    return "\n".join(lines[:n]) + more


# OSErrors a person causes by where they point vitscale (errno -> a hint after the cause).
_OS_HINTS = {
    errno.ENOSPC: "free some space or choose another folder",
    errno.EDQUOT: "your disk quota is used up: free some space or choose another folder",
    errno.EROFS: "choose a writable folder",
    errno.EACCES: "check the permissions, or choose another folder",
    errno.EPERM: "check the permissions, or choose another folder",
    errno.EFBIG: "a file-size limit was reached",
}


_LOST_MARKS = ("gloo/transport/", "Connection reset by peer", "Connection closed by peer", "ProcessGroupNCCL",
               "NCCL communicator", "collective operation timeout", "Timed out waiting")  # fmt: skip
"""What a collective's RuntimeError says when its peer is gone or hung (gloo's TCP pair, NCCL's watchdog)."""


def _lost_rank(exc: BaseException) -> str | None:
    """One line for a collective that failed because another rank (a process, a node) is gone or hung:
    PyTorch's ``DistError`` family (gloo's "Connection closed by peer", NCCL's watchdog, the store's
    timeouts), or the failure DCP reports for it."""
    names = {c.__name__ for c in type(exc).__mro__}
    failures = getattr(exc, "failures", None)  # DCP's CheckpointException: {rank: (exception, traceback)}
    if not names & {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"} and isinstance(failures, dict):
        inner = [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        return next((m for m in (_lost_rank(e) for e in inner if isinstance(e, BaseException)) if m), None)
    text = str(exc)
    dist = names & {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}
    if not dist and not (isinstance(exc, RuntimeError) and any(m in text for m in _LOST_MARKS)):
        return None
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    first = __import__("re").sub(r"^\[[^\]]*\]\s*", "", first).split(". This is typically")[0]  # gloo's source location, its advice
    return (f"lost contact with another rank ({first[:200]}): a process or node of the job stopped or hung "
            "(parallel.timeout bounds the wait); start the job again to resume from the newest checkpoint")  # fmt: skip


def describe(exc: BaseException) -> tuple[str, int] | None:
    """``(message, exit code)`` for an error a person caused, or None for a bug (keep the traceback)."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", EXIT_INTERRUPTED
    if isinstance(exc, UserError):  # vitscale's own messages: one or two lines (a resume's diff: a line per key)
        return str(exc).strip(), exc.exit_code
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename is not None else ""
        hint = _OS_HINTS.get(exc.errno or 0)
        return f"{where}{exc.strerror}" + (f" ({hint})" if hint else ""), EXIT_FAILED
    if isinstance(exc, OSError):  # raised by vitscale with its own message (a missing data folder, ...)
        return _first_lines(str(exc), 2) or type(exc).__name__, EXIT_FAILED
    oom = getattr(__import__("sys").modules.get("torch"), "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return (
            "out of memory on the device: lower train.batch_size (or raise train.grad_accum), or turn on "
            "parallel.activation_checkpointing=full",
            EXIT_FAILED,
        )
    lost = _lost_rank(exc)
    if lost:
        return lost, EXIT_FAILED
    if isinstance(exc, MemoryError):
        return "out of host memory: lower train.batch_size, data.num_workers or the image size", EXIT_FAILED
    if isinstance(exc, NotImplementedError):  # a model family without the asked capability: choose another
        return _first_lines(str(exc), 2) or type(exc).__name__, EXIT_USAGE
    # Library-level input errors: vitscale raises these with a message naming the value at fault.
    if isinstance(exc, (ValueError, KeyError)):
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        return _first_lines(str(text), 2) or type(exc).__name__, EXIT_FAILED
    return None


__all__ = ["CheckError", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_USAGE", "UserError", "debug_enabled", "describe"]
