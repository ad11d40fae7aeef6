"""WebDataset tar shards: samples are consecutive members sharing a key (``<key>.<ext>``).

:func:`iter_samples` reads a shard front to back (a stream: remote, ``pipe:``); :func:`index_shard`
reads a local shard's headers only and records where every image lies, so a sample is read later by
one seek. Both follow webdataset's convention: the key is the member's path up to the first dot of
its file name, the extension the rest (lower case), e.g. ``n01440764/x.JPEG`` -> (``n01440764/x``,
``jpeg``).
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import CheckError
from .files import open_regular

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "ppm", "bmp")  # image members of a sample, in preference order
CAPTION_EXTS = ("txt", "text", "caption")
MEMBER_MAX = 256 << 20
"""Largest member read whole (an image: past it, decoding refuses its pixel count anyway)."""
SMALL_MEMBER_MAX = 4 << 20
"""Largest label, caption or JSON member read whole (a 2.5 GB ``.cls`` took 15 GB of memory)."""


def member_limit(ext: str) -> int:
    return MEMBER_MAX if ext in IMAGE_EXTS else SMALL_MEMBER_MAX


def too_large(name: str, size: int, ext: str) -> str | None:
    """Why a member is not read whole (its header's size, checked before a byte of it is read), else None."""
    limit = member_limit(ext)
    if size <= limit:
        return None
    kind = "an image" if ext in IMAGE_EXTS else "a label, caption or JSON"
    return f"member {name} is {size} bytes, more than the {limit} {kind} member may hold"


@dataclass(frozen=True)
class TarMember:
    """An image inside a local tar shard: read ``size`` bytes at ``offset`` (no extraction)."""

    shard: str
    offset: int
    size: int
    name: str
    url: str = ""
    """Where the shard came from (the local path itself, or the URL of this local copy)."""

    def __str__(self) -> str:
        return f"{self.url or self.shard}:{self.name}"


class LabelError(ValueError):
    """A sample's label member is missing or not a class index."""


class DuplicateKeyError(CheckError):
    """A shard names one sample twice: a key that comes back after another key's members, or one
    member name twice. Two images under one key would be merged (index mode kept one silently) or
    read as two samples with one key (a stream: token labels found by key put one image's labels on
    the other); a duplicate is refused, never merged or dropped."""


def _duplicate(name: str, key: str, first: str) -> DuplicateKeyError:
    return DuplicateKeyError(f"sample key {key!r} is used twice in one shard ({first}, then {name}): each key must "
                             f"name one sample (its members together, once each); rename or remove the duplicate")  # fmt: skip


def split_key(name: str) -> tuple[str, str]:
    """WebDataset's key / extension split: the extension starts at the first dot of the basename."""
    folder, base = os.path.split(name)
    if "." not in base:
        return name, ""
    stem, ext = base.split(".", 1)
    return os.path.join(folder, stem), ext.lower()


class _Counted:
    """A stream that counts the bytes read from it."""

    def __init__(self, f):
        self.f, self.n = f, 0

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(size)
        self.n += len(data)
        return data


def _check_end(size: int, offset: int, name: str) -> None:
    """A tar ends with zero blocks after its last member; ``tarfile`` quietly stops at a shard cut
    between members (or inside a header): ``ReadError`` when the end-of-archive block is missing."""
    if size < offset + tarfile.BLOCKSIZE:
        raise tarfile.ReadError(f"unexpected end of data after {name or 'the start'} (no end-of-archive block)")


def iter_samples(stream, url: str) -> Iterator[dict]:
    """Samples of a shard read front to back: dicts with ``__key__``, ``__url__`` and one entry (bytes)
    per extension. A cut or corrupt shard raises ``tarfile.ReadError`` where it breaks."""
    current: dict | None = None
    stream = _Counted(stream)
    last = ""
    seen: dict[str, str] = {}  # key -> its first member: a key is one run of consecutive members
    members: set[str] = set()  # the member names of the current sample
    with tarfile.open(fileobj=stream, mode="r|") as tf:
        for m in tf:
            if not m.isfile():
                continue
            key, ext = split_key(m.name)
            last = m.name
            if current is None or current["__key__"] != key:
                if key in seen:
                    raise _duplicate(m.name, key, seen[key])
                seen[key] = m.name
                members = set()
                if current is not None:
                    yield current
                current = {"__key__": key, "__url__": url}
            if m.name in members:
                raise _duplicate(m.name, key, m.name)
            members.add(m.name)
            problem = too_large(m.name, m.size, ext)
            if problem:  # not read: the stream skips its bytes; the sample is bad, with the reason
                current.setdefault("__too_large__", problem)
                continue
            data = tf.extractfile(m).read()
            if len(data) != m.size:
                raise tarfile.ReadError(f"unexpected end of data in {m.name}")
            current.setdefault(ext, data)
        end = tf.offset
    while stream.read(1 << 16):  # the rest: the end-of-archive blocks
        pass
    _check_end(stream.n, end, last)
    if current is not None:
        yield current


def label_of(sample: dict, label_key: str) -> int | None:
    """The class index of a sample: the ASCII integer of member ``label_key`` (``cls``), or a field of
    its ``.json`` member (``json.label``, ``json.meta.label``); None when the member is absent.
    ``LabelError`` when it is not an integer."""
    if label_key.startswith("json."):
        raw = sample.get("json")
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            raise LabelError("its .json member is not JSON") from None
        for part in label_key[len("json."):].split("."):
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise LabelError(f"{label_key} is {value!r}, not a class index")
        raw = str(value).encode()
    else:
        raw = sample.get(label_key)
        if raw is None:
            return None
    try:
        return int(raw.decode("utf-8", errors="replace").strip())
    except ValueError:
        shown = raw[:20].decode("utf-8", errors="replace")
        raise LabelError(f"its .{label_key} member is {shown!r}, not a class index") from None


def image_ext(sample: dict) -> str | None:
    """The image member of a sample (first of ``IMAGE_EXTS`` present), or None."""
    return next((e for e in IMAGE_EXTS if e in sample), None)


def caption_of(sample: dict) -> str | None:
    raw = next((sample[e] for e in CAPTION_EXTS if e in sample), None)
    return raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw


def index_shard(path: str, small_exts: tuple[str, ...], url: str = "") -> list[dict]:
    """Samples of a local shard from its headers: dicts with ``__key__``, ``image`` (a
    :class:`TarMember` or None) and the bytes of the members in ``small_exts`` (labels, captions,
    JSON); images are not read. A cut or corrupt shard raises ``tarfile.ReadError``."""
    samples: list[dict] = []
    by_key: dict[str, dict] = {}
    names: set[str] = set()
    with open_regular(path) as f, tarfile.open(fileobj=f, mode="r:") as tf:  # a FIFO is refused, never blocks
        size = os.fstat(f.fileno()).st_size
        for m in tf:
            if not m.isfile():
                continue
            if m.offset_data + m.size > size:
                raise tarfile.ReadError(f"unexpected end of data in {m.name}")
            key, ext = split_key(m.name)
            g = by_key.get(key)
            if g is not None and (g is not samples[-1] or m.name in names):  # refused, never merged
                raise _duplicate(m.name, key, g["_first"] if m.name not in names else m.name)
            if g is None:
                g = by_key[key] = {"__key__": key, "image": None, "_rank": len(IMAGE_EXTS), "_first": m.name}
                samples.append(g)
                names = set()
            names.add(m.name)
            if ext in IMAGE_EXTS and IMAGE_EXTS.index(ext) < g["_rank"]:
                g["image"], g["_rank"] = TarMember(path, m.offset_data, m.size, m.name, url), IMAGE_EXTS.index(ext)
            elif ext in small_exts and ext not in g:
                problem = too_large(m.name, m.size, ext)
                if problem:
                    raise tarfile.ReadError(problem)
                g[ext] = tf.extractfile(m).read()
        _check_end(size, tf.offset, samples[-1]["__key__"] if samples else "")
    for g in samples:
        del g["_rank"], g["_first"]
    return samples


__all__ = ["CAPTION_EXTS", "IMAGE_EXTS", "MEMBER_MAX", "SMALL_MEMBER_MAX", "DuplicateKeyError", "LabelError", "TarMember", "caption_of", "image_ext", "index_shard",
           "iter_samples", "label_of", "split_key", "too_large"]
