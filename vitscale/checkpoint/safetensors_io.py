"""The safetensors file format, written and read here so that bytes are checksummed as they stream.

Format (https://github.com/huggingface/safetensors, README "Format"): 8 bytes little-endian header
length N, N bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{str: str}}`` (space-padded), then the tensors' raw bytes, back to back. Nothing in it is code.

Exported weights (``model.safetensors``, ``vitscale convert`` output) carry ``vitscale.checksum``
in ``__metadata__``: XXH3-64 over the canonical JSON of the header (without that field) followed by
the data bytes, so a file that travels alone can still be verified; :func:`read_safetensors`
verifies it when present. Files from elsewhere (timm, Hugging Face) have none and are read as they
are, after the same structural checks the safetensors library makes (known dtypes, offsets that
tile the data exactly, nothing past the end of the file).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from ..safe_write import open_new
from .geometry import shape_problem
from .integrity import HASH_NAME, CorruptFile, hasher, naming_errors, read_json

CHECKSUM_KEY = "vitscale.checksum"
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip
for _code, _name in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"), ("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64")):
    if hasattr(torch, _name):
        _DTYPES[_code] = getattr(torch, _name)
_CODES = {v: k for k, v in _DTYPES.items()}


def dtype_code(dtype: torch.dtype) -> str:
    if dtype not in _CODES:
        raise TypeError(f"cannot store {dtype} tensors (safetensors dtypes: {', '.join(_DTYPES)})")
    return _CODES[dtype]


def dtype_from_code(code: object) -> torch.dtype | None:
    """The torch dtype of a safetensors dtype name, None when unknown (never a lookup by name)."""
    return _DTYPES.get(code) if isinstance(code, str) else None


def nbytes(shape: Iterable[int], dtype: torch.dtype) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n * dtype.itemsize


def byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


Entry = tuple[str, torch.dtype, tuple[int, ...], Callable[[], torch.Tensor]]


def write_safetensors(
    path: str | os.PathLike, entries: list[Entry], metadata: dict[str, str] | None = None, *, embed_checksum: bool
) -> tuple[int, str | None, dict[str, tuple[int, int]]]:
    """Write ``entries`` (name, dtype, shape, a function giving the tensor: called once, lazily) to
    ``path``, flushed to disk. Returns (file size, XXH3 of the whole file — None when
    ``embed_checksum`` put a content checksum into the header instead —, ``{name: (start, length)}``
    with absolute byte positions)."""
    table: dict[str, dict] = {}
    offset = 0
    for name, dtype, shape, _ in entries:
        n = nbytes(shape, dtype)
        table[name] = {"dtype": dtype_code(dtype), "shape": [int(d) for d in shape], "data_offsets": [offset, offset + n]}
        offset += n
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    content = hasher()
    placeholder = f"{HASH_NAME}:" + "0" * 16
    if embed_checksum:
        content.update(_canonical_header(table, meta))
        meta[CHECKSUM_KEY] = placeholder
    header = json.dumps({"__metadata__": meta, **table}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # the data starts 8-byte aligned, as the library writes it
    prefix = struct.pack("<Q", len(header)) + header
    whole = hasher()
    whole.update(prefix)
    data_start = len(prefix)
    spans = {name: (data_start + e["data_offsets"][0], e["data_offsets"][1] - e["data_offsets"][0]) for name, e in table.items()}
    with naming_errors(path), open_new(path, "wb") as f:  # never through a symbolic link (vitscale.safe_write)
        f.write(prefix)
        for name, dtype, shape, get in entries:
            t = get().detach()
            if t.dtype != dtype or tuple(t.shape) != tuple(shape):
                raise ValueError(f"tensor {name!r} is {t.dtype} {tuple(t.shape)}, planned as {dtype} {tuple(shape)}")
            t = t.to("cpu").contiguous()
            if t.numel():
                view = byte_view(t)
                f.write(view)
                (content if embed_checksum else whole).update(view)
            del t
        if embed_checksum:
            at = prefix.index(placeholder.encode())
            f.seek(at)
            f.write(f"{HASH_NAME}:{content.hexdigest()}".encode())
        f.flush()
        os.fsync(f.fileno())
        size = os.fstat(f.fileno()).st_size
    return size, (None if embed_checksum else whole.hexdigest()), spans


def _canonical_header(table: dict, meta: dict) -> bytes:
    return json.dumps({"__metadata__": meta, **table}, sort_keys=True, separators=(",", ":")).encode()


def _header_bytes(f, path: Path) -> tuple[int, bytes]:
    """The file's size and its header's bytes, ``f`` left after the header (the 8-byte length checked
    against the file and :data:`MAX_HEADER_BYTES` first)."""
    size = os.fstat(f.fileno()).st_size
    head = f.read(8)
    if len(head) < 8:
        raise CorruptFile(path, f"{size} bytes: too short for a safetensors file")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_BYTES or n > size - 8:
        raise CorruptFile(path, f"declares a {n}-byte header in a {size}-byte file")
    return size, f.read(n)


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file as written (``vitscale.checksum`` included: the mark
    of a file vitscale wrote), from its header alone; :class:`CorruptFile` for a malformed header."""
    path = Path(path)
    with open(path, "rb", buffering=0) as f:
        header = read_json(path, MAX_HEADER_BYTES, data=_header_bytes(f, path)[1])
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(header, dict) or not isinstance(meta or {}, dict):
        raise CorruptFile(path, "the header is not a JSON object with a __metadata__ map")
    return {str(k): str(v) for k, v in (meta or {}).items()}


def read_safetensors(path: str | os.PathLike, *, require_checksum: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """All tensors and the ``__metadata__`` of a safetensors file, checked (see the module doc).
    Raises :class:`CorruptFile` for a malformed file or a checksum that does not match."""
    path = Path(path)
    with open(path, "rb", buffering=0) as f:
        size, raw = _header_bytes(f, path)
        header = read_json(path, MAX_HEADER_BYTES, data=raw)
        if not isinstance(header, dict):
            raise CorruptFile(path, "the header is not a JSON object")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise CorruptFile(path, "__metadata__ is not a map of strings")
        entries = _check_table(path, header, size - 8 - len(raw))
        expected = meta.pop(CHECKSUM_KEY, None)
        if expected is None and require_checksum:
            raise CorruptFile(path, f"carries no {CHECKSUM_KEY} (not written by this vitscale)")
        content = hasher()
        if expected is not None:
            content.update(_canonical_header(header, meta))
        out: dict[str, torch.Tensor] = {}
        for name, dtype, shape, _ in entries:
            t = torch.empty(shape, dtype=dtype)
            if t.numel():
                view = byte_view(t)
                _read_exact(f, view, path)
                if expected is not None:
                    content.update(view)
            out[name] = t
    if expected is not None:
        algo, _, value = expected.partition(":")
        if algo != HASH_NAME:
            raise CorruptFile(path, f"unknown checksum algorithm {algo[:40]!r}")
        if content.hexdigest() != value:
            raise CorruptFile(path, f"checksum mismatch ({HASH_NAME} {content.hexdigest()}, recorded {value}): the file changed after it was written")
    return out, meta


def _check_table(path: Path, header: dict, data_len: int) -> list[tuple[str, torch.dtype, list[int], int]]:
    """The header's tensors sorted by position, each checked; they must tile the data exactly."""
    entries = []
    for name, e in header.items():
        if not isinstance(e, dict):
            raise CorruptFile(path, f"header entry {name[:80]!r} is not an object")
        dtype = dtype_from_code(e.get("dtype"))
        shape, offs = e.get("shape"), e.get("data_offsets")
        if dtype is None:
            raise CorruptFile(path, f"tensor {name[:80]!r} has an unknown dtype {str(e.get('dtype'))[:20]!r}")
        if not _ints(shape) or not _ints(offs) or len(offs) != 2 or offs[0] > offs[1]:
            raise CorruptFile(path, f"tensor {name[:80]!r} has a malformed shape or data_offsets")
        why = shape_problem(shape, dtype.itemsize)
        if why:
            raise CorruptFile(path, f"tensor {name[:80]!r}: {why}")
        if offs[1] - offs[0] != nbytes(shape, dtype):
            raise CorruptFile(path, f"tensor {name[:80]!r}: {offs[1] - offs[0]} bytes for shape {shape[:8]} of {dtype}")
        entries.append((name, dtype, shape, offs[0]))
    entries.sort(key=lambda x: x[3])
    at = 0
    for name, dtype, shape, begin in entries:
        if begin != at:
            raise CorruptFile(path, f"tensor {name[:80]!r} starts at byte {begin}, expected {at} (gap or overlap)")
        at += nbytes(shape, dtype)
    if at != data_len:
        raise CorruptFile(path, f"the tensors take {at} bytes, the file holds {data_len} after its header (truncated or padded)")
    return entries


def _ints(x) -> bool:
    return isinstance(x, list) and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62 for v in x)


def _read_exact(f, view: memoryview, path: Path) -> None:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise CorruptFile(path, "ends early (truncated)")
        got += n


__all__ = ["CHECKSUM_KEY", "byte_view", "dtype_code", "dtype_from_code", "nbytes", "read_metadata", "read_safetensors", "write_safetensors"]
