"""Checksums, sealed JSON and guarded file access for checkpoints and exported weights.

The checksum is xxHash's XXH3-64 (https://github.com/Cyan4973/xxHash, python package ``xxhash``). It
guards against accidental damage (a torn copy, a truncated file, bytes changed on disk), not against
someone who can rewrite the file: such a person can rewrite the recorded checksum too. What keeps a
hostile file from running code is the format itself (tensors as raw bytes, everything else JSON;
see docs/trust.md). Measured on this project's 2-core CPU (``benchmarks/checkpoint_checksum.py``,
figures in docs/trust.md): XXH3-64 hashes ~20x faster than zlib's CRC-32 and ~45x faster than
SHA-256, about 1.5% of the time a 512 MiB save takes; SHA-256 would add ~70%.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..safe_write import open_new

HASH_NAME = "xxh3_64"
# File names a checkpoint may list: plain names inside its own folder (no separators, no "..",
# nothing hidden), so an index can never point outside the folder it lives in.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


class CheckpointError(UserError, ValueError):
    """A checkpoint or weights file that vitscale will not use; the message is one line."""


class CorruptFile(CheckpointError):
    """One file fails its checks (missing, truncated, changed, malformed)."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason}")

    def __reduce__(self):  # DCP sends a rank's exception to the others (pickled in memory)
        return (type(self), (self.path, self.reason))


def hasher():
    import xxhash

    return xxhash.xxh3_64()


def digest(data: bytes | memoryview) -> str:
    h = hasher()
    h.update(data)
    return h.hexdigest()


def check_name(folder: str | os.PathLike, name: Any) -> Path:
    """``folder/name`` if ``name`` is a plain file name (no separator, no "..", not hidden)."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise CorruptFile(Path(folder) / str(name)[:80], "not a plain file name inside the checkpoint folder")
    return Path(folder) / name


def member(folder: str | os.PathLike, name: Any) -> Path:
    """``folder/name`` for a name read from a checkpoint file: a plain file name (no path, no
    symlink), so nothing a checkpoint says can make vitscale read outside its folder."""
    path = check_name(folder, name)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise CorruptFile(path, "missing") from None
    if stat.S_ISLNK(st.st_mode):
        raise CorruptFile(path, "is a symbolic link (a checkpoint holds regular files only)")
    if not stat.S_ISREG(st.st_mode):
        raise CorruptFile(path, "not a regular file")
    return path


def open_member(path: Path):
    """Open a file :func:`member` returned, refusing a symlink swapped in since (``O_NOFOLLOW``)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    return os.fdopen(fd, "rb", buffering=0)


# ------------------------------------------------------------------------------------- sealed JSON
def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def seal_json(obj: dict) -> bytes:
    """``obj`` as JSON text carrying ``"checksum"``: the XXH3 of its canonical form without it."""
    body = {k: v for k, v in obj.items() if k != "checksum"}
    return json.dumps({**body, "checksum": f"{HASH_NAME}:{digest(_canonical(body))}"}, indent=1, allow_nan=False).encode()


def read_json(path: Path, max_bytes: int, data: bytes | None = None) -> Any:
    """Parse a JSON file of at most ``max_bytes`` (strict JSON: no NaN); :class:`CorruptFile` if not."""
    if data is None:
        size = os.lstat(path).st_size
        if size > max_bytes:
            raise CorruptFile(path, f"{size} bytes, more than the {max_bytes} a file of this kind may hold")
        with open_member(path) as f:
            data = f.read(max_bytes + 1)

    def no_constants(name: str):
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(data.decode("utf-8"), parse_constant=no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CorruptFile(path, f"not valid JSON ({str(e).splitlines()[0][:120]})") from None


def read_sealed_json(path: Path, max_bytes: int) -> dict:
    """A file :func:`seal_json` wrote, its checksum verified."""
    obj = read_json(path, max_bytes)
    if not isinstance(obj, dict) or not isinstance(obj.get("checksum"), str):
        raise CorruptFile(path, "no checksum field (not a file this vitscale wrote)")
    algo, _, value = obj.pop("checksum").partition(":")
    if algo != HASH_NAME:
        raise CorruptFile(path, f"unknown checksum algorithm {algo[:40]!r}")
    if digest(_canonical(obj)) != value:
        raise CorruptFile(path, "checksum mismatch: the file changed after it was written")
    return obj


def write_file(path: Path, data: bytes) -> tuple[int, str]:
    """Write ``data`` (flushed to disk); returns (size, checksum)."""
    with naming_errors(path), open_new(path, "wb") as f:  # never through a symbolic link (vitscale.safe_write)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return len(data), digest(data)


@contextlib.contextmanager
def naming_errors(path: str | os.PathLike):
    """An OSError from writing (``No space left on device``) names no file: add ``path``."""
    try:
        yield
    except OSError as e:
        if e.filename is None and e.errno is not None:
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


__all__ = [
    "HASH_NAME",
    "CheckpointError",
    "CorruptFile",
    "check_name",
    "digest",
    "hasher",
    "member",
    "naming_errors",
    "open_member",
    "read_json",
    "read_sealed_json",
    "seal_json",
    "write_file",
]
