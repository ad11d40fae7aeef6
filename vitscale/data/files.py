"""Only regular files are read: a FIFO, socket or device in a data source is skipped, never opened.

Opening a FIFO for reading blocks until something writes to it — forever, in a training run; reading
a character device such as ``/dev/zero`` never ends. So every data format checks what a path is
(``stat``, which follows a symbolic link to what it names) **before** opening it: listings skip and
count such entries (:func:`split_regular`, :func:`special_kind`), and the one function that reads a
sample's bytes (:func:`read_regular`) opens with ``O_NONBLOCK`` (a FIFO's open then returns at once)
and checks the open file again (``fstat``), so a file swapped for a FIFO after the listing is skipped
like an undecodable one instead of blocking. A check rather than a read timeout: a timeout would
need a thread or an alarm per read in every worker and still cost its full length on each such file.
"""

from __future__ import annotations

import os
import stat

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class NotRegularFile(OSError):
    """A data path that names a FIFO, socket, device or folder instead of a regular file."""


def special_kind(mode: int) -> str | None:
    """What a ``st_mode`` names when it is not a regular file ("a FIFO", ...), else None."""
    if stat.S_ISREG(mode):
        return None
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "not a regular file"


def split_regular(paths: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """``(regular, skipped)``: the paths that are regular files (or cannot be stat-ed: their reader
    reports them), and ``(path, kind)`` of the others, in order. One ``stat`` per path, no open."""
    keep, skipped = [], []
    for p in paths:
        try:
            kind = special_kind(os.stat(p).st_mode)
        except OSError:
            kind = None
        if kind is None:
            keep.append(p)
        else:
            skipped.append((p, kind))
    return keep, skipped


def describe_skipped(where: str, skipped: list[tuple[str, str]]) -> str:
    """One warning line for the entries :func:`split_regular` left out."""
    shown = ", ".join(f"{p} ({kind})" for p, kind in skipped[:3]) + (", ..." if len(skipped) > 3 else "")
    what = "entry that is not a regular file" if len(skipped) == 1 else "entries that are not regular files"
    return f"{where}: skipped {len(skipped)} {what} (never opened): {shown}"


def open_regular(path: str | os.PathLike):
    """The regular file ``path`` open for binary reading (the caller closes it); :class:`NotRegularFile`
    for anything else, raised without blocking (opened non-blocking, checked with ``fstat`` before a
    byte is read; ``O_NONBLOCK`` changes nothing for a regular file)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    f = os.fdopen(fd, "rb")
    try:
        kind = special_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise NotRegularFile(f"{os.fspath(path)} is {kind}, not a regular file")
    except BaseException:
        f.close()
        raise
    return f


def read_regular(path: str | os.PathLike) -> bytes:
    """The bytes of the regular file ``path``; :class:`NotRegularFile` for anything else, raised
    without blocking (:func:`open_regular`)."""
    with open_regular(path) as f:
        return f.read()


def require_regular(paths) -> None:
    """:class:`NotRegularFile` naming the first of ``paths`` that exists and is not a regular file."""
    _, skipped = split_regular([os.fspath(p) for p in paths])
    if skipped:
        path, kind = skipped[0]
        raise NotRegularFile(f"{path} is {kind}, not a regular file")


__all__ = ["NotRegularFile", "describe_skipped", "open_regular", "read_regular", "require_regular", "special_kind", "split_regular"]
