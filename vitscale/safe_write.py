"""Writing a run's files, never through a symbolic link: the one way a run folder's files are written.

Everything a run writes in its folder — ``config.yaml``, ``metrics.jsonl``, ``train.log``,
``summary.json``, ``report.html``, ``model.safetensors``, the checkpoints' files, ``trackers.json``,
``classnames.txt``, ``run-id.json``, ``hang-rank<r>.txt``, ``export.json`` — and every temporary name it
writes first (``.config.yaml.tmp``, ``model.safetensors.tmp``, ...) is opened here with ``O_NOFOLLOW``:
a symbolic link planted at any of those names (to another run's file, or a file outside) is refused in
one line naming it (:class:`FolderLink`), never written through. A temporary file is then renamed over
its name, which replaces a link there and writes nothing through it (docs/trust.md, "Symbolic links in
a run folder").
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .errors import UserError

_WRITE = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class FolderLink(UserError):
    """A file or folder of the run is a symbolic link: nothing inside a run folder is followed."""

    @classmethod
    def at(cls, path: str | os.PathLike) -> FolderLink:
        try:
            target = f" (to {os.readlink(path)})"
        except OSError:
            target = ""
        return cls(f"{path} is a symbolic link{target}: nothing inside a run folder is followed (its files are its own, "
                   f"docs/trust.md); remove the link, or set another train.output_dir")  # fmt: skip


def _open(path: str | os.PathLike, flags: int) -> int:
    try:
        return os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP or (e.errno == errno.EMLINK and os.path.islink(path)):  # BSDs say EMLINK
            raise FolderLink.at(path) from None
        raise


def open_new(path: str | os.PathLike, mode: str = "w"):
    """``open(path, mode)`` for writing (``"w"`` UTF-8 text or ``"wb"``; created or truncated) that
    refuses a symbolic link at ``path`` (:class:`FolderLink`)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"open_new: mode {mode!r} (use 'w' or 'wb')")
    fd = _open(path, _WRITE | os.O_TRUNC)
    return os.fdopen(fd, "wb") if mode == "wb" else os.fdopen(fd, "w", encoding="utf-8", errors="replace")


def open_append(path: str | os.PathLike):
    """``open(path, "a")`` (UTF-8 text) that refuses a symbolic link at ``path`` (:class:`FolderLink`):
    what a run appends to (metrics.jsonl, train.log) is its own file."""
    return os.fdopen(_open(path, _WRITE | os.O_APPEND), "a", encoding="utf-8", errors="replace")


def write_atomic(path: str | os.PathLike, data: str | bytes, tmp: str | os.PathLike | None = None) -> Path:
    """Write ``data`` to ``tmp`` (default ``.<name>.tmp`` beside ``path``) with :func:`open_new`, then
    rename it over ``path``: a reader never sees half a file; a write that fails (a full disk) or is
    interrupted removes the temporary file and leaves the old ``path``. Returns ``path``."""
    path = Path(path)
    tmp = Path(tmp) if tmp is not None else path.with_name(f".{path.name}.tmp")
    try:
        with open_new(tmp, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except FolderLink:
        raise  # the link is someone else's: left where it is
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


__all__ = ["FolderLink", "open_append", "open_new", "write_atomic"]
