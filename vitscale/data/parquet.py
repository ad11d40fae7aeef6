"""``data.format=parquet``: images and labels (or captions) in Parquet files, read with pyarrow.

The layout of the Hugging Face Hub's image datasets: an image column (``data.image_column``,
default ``image``) holding the encoded file, as binary or as the ``{bytes, path}`` struct the
``datasets`` library writes, and a label column (``data.label_column``, default ``label``) of integers
or strings — or, for CLIP, a caption column (``data.caption_column``). Class names come from the
column's ``ClassLabel`` names in the files' ``huggingface`` schema metadata, a ``classnames.txt``
beside the files, or the labels: string labels are mapped to indices in sorted order (the map is the
run's ``class_names``, written to its folder as ``classnames.txt`` and read back by ``vitscale eval``
and ``vitscale export``).

``data.train_path`` / ``data.val_path``: a folder of ``*.parquet``, a glob, a brace pattern, a file,
several joined with ``::``; local, or at a URL fsspec opens — ``s3://``, ``gs://``, ``az://`` read
by range requests, ``http(s)://`` copied into ``data.shard_cache`` first —, or
``hf://datasets/<owner>/<name>/<path>`` through huggingface_hub (with ``HF_HUB_OFFLINE=1``: its
local cache only). At start-up every file's footer and its label (caption) column are read: a
corrupt file, a missing column, a missing label or one outside the classes stops the run there with
one line.

- ``data.parquet_mode=stream`` (default for training): row groups are the units of
  ``vitscale.data.stream`` — dealt to ranks and workers, shuffled through a buffer, resumed exactly.
- ``data.parquet_mode=index`` (the validation split always): rows read by index through a per-worker
  cache of row groups: exact keyed epochs like an image folder; fast when the row groups are small
  or few (validation reads them in order).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from ..config.data import CaptionFields, DataConfig, PathFields, RemoteFields, StreamFields
from ..errors import CheckError
from .classes import classes_from_labels, read_class_names
from .decode import BadImageError
from .formats import DataFormat, Split, register_format
from .remote import (
    RemoteOptions,
    check_urls,
    describe_error,
    expand,
    local_copy,
    name_of,
    open_file,
    open_random,
    scheme,
)
from .sources import FileSource, Sample
from .stream import StreamSource, UnitReader
from .transforms import Augmented, SampleTransform

EXTS = (".parquet",)
CACHE_BYTES = 256 << 20  # row groups of images kept per worker process (index mode)


@dataclass
class ParquetData(RemoteFields, StreamFields, CaptionFields, PathFields, DataConfig):
    """``data.format=parquet``."""

    format: str = "parquet"
    parquet_mode: Literal["index", "stream"] = "stream"
    """Training: ``stream`` (row groups dealt to ranks and workers, read front to back through a shuffle
    buffer: any size, remote) or ``index`` (rows read by index through a cache of row groups: exact
    keyed epochs, the same batches for any rank / worker count; for small row groups or data that fits
    the cache). Validation is always read by index, in order."""
    image_column: str = "image"
    """The column of encoded images: binary, or a struct with a ``bytes`` field (``{bytes, path}``, as
    the ``datasets`` library writes)."""
    label_column: str | None = "label"
    """The column of class labels: integers, or strings (mapped to indices in sorted order); None = no
    labels (a caption dataset)."""
    caption_column: str | None = None
    """CLIP: the column of captions (then ``label_column`` is optional: used when the files have it)."""


# ------------------------------------------------------------------------------------------ files
def _readable(url: str, opts: RemoteOptions):
    """A seekable file of ``url``: local, by range requests (object stores, the Hub), or a local copy
    (http(s), pipe:, which may not serve ranges)."""
    if scheme(url) in ("http", "https", "pipe"):
        return open_file(local_copy(url, opts))
    return open_random(url, opts)


@dataclass
class Table:
    """The files of one split: row groups, columns, labels, captions."""

    urls: list[str]
    groups: list[tuple[int, int, int]]  # (file, row group, rows)
    labels: list[int]
    captions: list[str | None] | None
    class_names: list[str]
    columns: list[str]


def _hf_names(schema, column: str) -> list[str] | None:
    """The ``ClassLabel`` names of ``column`` in a file written by the ``datasets`` library."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return None
    try:
        feature = json.loads(raw)["info"]["features"][column]
    except (ValueError, KeyError, TypeError):
        return None
    names = feature.get("names") if isinstance(feature, dict) else None
    return [str(n) for n in names] if isinstance(names, list) else None


def read_table(cfg, name: str, path: str, classes: list[str] | None, opts: RemoteOptions) -> Table:
    """Footers and label / caption columns of the split's files; ``CheckError`` for what is wrong."""
    import pyarrow.parquet as pq

    field = "data.train_path" if name == "train" else "data.val_path"
    urls = expand(path, EXTS, field, opts)
    groups, raw_labels, captions, hf_names, columns = [], [], [], None, []
    want_labels = cfg.label_column is not None
    for i, url in enumerate(urls):
        try:
            with _readable(url, opts) as f:
                pf = pq.ParquetFile(f)
                schema = pf.schema_arrow
                columns = schema.names
                if cfg.image_column not in columns:
                    raise CheckError(f"{field}: {url} has no column {cfg.image_column!r} (data.image_column); "
                                     f"its columns: {', '.join(columns)}")  # fmt: skip
                if cfg.caption_column is not None and cfg.caption_column not in columns:
                    raise CheckError(f"{field}: {url} has no column {cfg.caption_column!r} (data.caption_column); "
                                     f"its columns: {', '.join(columns)}")  # fmt: skip
                has_label = want_labels and cfg.label_column in columns
                if want_labels and not has_label and cfg.caption_column is None:
                    raise CheckError(f"{field}: {url} has no column {cfg.label_column!r} (data.label_column); its "
                                     f"columns: {', '.join(columns)}; set data.label_column (null: no labels)")  # fmt: skip
                _check_rows(pf, f, field, url)
                hf_names = hf_names or (_hf_names(schema, cfg.label_column) if has_label else None)
                for g in range(pf.metadata.num_row_groups):
                    groups.append((i, g, pf.metadata.row_group(g).num_rows))
                read = [c for c in (cfg.label_column if has_label else None, cfg.caption_column) if c]
                table = pf.read(columns=read) if read else None
        except CheckError:
            raise
        except Exception as e:  # not Parquet, cut short, unreadable
            raise CheckError(f"{field}: {url} cannot be read as Parquet ({describe_error(e)}): replace or remove it") from None
        n = sum(r for f_, _, r in groups if f_ == i)
        if table is not None and has_label:
            raw_labels += table.column(cfg.label_column).to_pylist()
        else:
            raw_labels += [None] * n
        if cfg.caption_column is not None:
            captions += [None if c is None else str(c) for c in table.column(cfg.caption_column).to_pylist()]
    labels, names = _labels(cfg, field, path, urls, groups, raw_labels, classes, hf_names)
    return Table(urls, groups, labels, captions if cfg.caption_column is not None else None, names, columns)


def _check_rows(pf, f, field: str, url: str) -> None:
    """A file's footer declares its row count: believed only as far as its bytes can hold rows (one
    byte a row at the least; an image row takes hundreds). A 1.4 MB file declaring 10^8 rows took 92 s
    and 4.9 GB reading its label column before the first check."""
    size = f.seek(0, os.SEEK_END)
    rows = pf.metadata.num_rows
    if rows > max(size, 0) or any(pf.metadata.row_group(g).num_rows < 0 for g in range(pf.metadata.num_row_groups)):
        raise CheckError(f"{field}: {url} declares {rows} rows in {size} bytes (fewer than one byte a row): not a "
                         "table of images; replace or remove it")  # fmt: skip


def _labels(cfg, field, path, urls, groups, raw, classes, hf_names) -> tuple[list[int], list[str]]:
    present = [y for y in raw if y is not None]
    if not present:
        return [-1] * len(raw), list(classes) if classes is not None else []
    if len(present) < len(raw) and cfg.caption_column is None:
        row = raw.index(None)
        raise CheckError(f"{field}: row {row} of {_where(urls, groups, row)} has no label "
                         f"(data.label_column={cfg.label_column}): fill it or remove the row")  # fmt: skip
    if any(isinstance(y, str) for y in present):  # names: mapped to indices
        names = list(classes) if classes is not None else hf_names or read_class_names(path) or sorted(set(map(str, present)))
        index = {n: i for i, n in enumerate(names)}
        out = []
        for row, y in enumerate(raw):
            if y is not None and str(y) not in index:
                raise CheckError(f"{field}: row {row} of {_where(urls, groups, row)}: label {y!r} is not one of the "
                                 f"{len(names)} training classes")  # fmt: skip
            out.append(-1 if y is None else index[str(y)])
        return out, names
    if not all(isinstance(y, int) and not isinstance(y, bool) for y in present):
        bad = next(y for y in present if not isinstance(y, int) or isinstance(y, bool))
        raise CheckError(f"{field}: label column {cfg.label_column!r} holds {bad!r}: expected integers or strings")
    labels = [-1 if y is None else int(y) for y in raw]
    names = list(classes) if classes is not None else hf_names or read_class_names(path) or []
    count = classes_from_labels(labels, f"{field}={path}", len(names) or cfg.num_classes)
    return labels, names or [str(i) for i in range(count)]


def _where(urls, groups, row: int) -> str:
    for f, _, n in groups:
        if row < n:
            return urls[f]
        row -= n
    return urls[-1]


def _image_bytes(value) -> bytes | None:
    """The encoded image of a cell: binary, or the ``bytes`` of a ``{bytes, path}`` struct."""
    if isinstance(value, dict):
        value = value.get("bytes")
    return bytes(value) if value is not None else None


# ------------------------------------------------------------------------------------------ index mode
class _RowNames:
    """``url#row`` of every row, made on demand (a list of a million strings is not needed)."""

    def __init__(self, urls: list[str], starts: list[int], files: list[int], n: int):
        self.urls, self.starts, self.files, self.n = urls, starts, files, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, j: int) -> str:
        import bisect

        g = bisect.bisect_right(self.starts, j) - 1
        return f"{self.urls[self.files[g]]}#{j}"


class ParquetSource(FileSource):
    """Rows read by index (keyed sampling, bad-image replacement / leaving out, like image files)."""

    def __init__(self, table: Table, cfg, opts: RemoteOptions, tokenize=None):
        self.table, self.image_column, self.opts = table, cfg.image_column, opts
        # texts -> token ids (N, L): the model family's tokenizer; None (or no captions): no tokens
        self.tokenize = tokenize if table.captions is not None else None
        self.starts, total = [], 0
        for _, _, n in table.groups:
            self.starts.append(total)
            total += n
        names = _RowNames(table.urls, self.starts, [f for f, _, _ in table.groups], total)
        super().__init__([], table.labels, cfg.fast_decode)
        self.paths = names  # what names a row in messages (FileSource reads len() and [j])
        self.captions = table.captions
        self._cache: OrderedDict = OrderedDict()  # (pid, group) -> list of encoded images, per worker process
        self._files: dict = {}

    def key(self, index: int) -> str:
        return f"{name_of(self.paths[index].rsplit('#', 1)[0])}#{index}"

    def _group_images(self, g: int) -> list:
        import pyarrow.parquet as pq

        ck = (os.getpid(), g)
        if ck in self._cache:
            self._cache.move_to_end(ck)
            return self._cache[ck]
        f, rg, _ = self.table.groups[g]
        fk = (os.getpid(), f)
        if fk not in self._files:
            self._files[fk] = pq.ParquetFile(_readable(self.table.urls[f], self.opts))
        images = [_image_bytes(v) for v in self._files[fk].read_row_group(rg, columns=[self.image_column])
                  .column(self.image_column).to_pylist()]  # fmt: skip
        self._cache[ck] = images
        while len(self._cache) > 1 and sum(sum(len(b or b"") for b in v) for v in self._cache.values()) > CACHE_BYTES:
            self._cache.popitem(last=False)
        return images

    def raw(self, j: int) -> tuple[bytes, str]:
        import bisect

        g = bisect.bisect_right(self.starts, j) - 1
        data = self._group_images(g)[j - self.starts[g]]
        if data is None:
            raise BadImageError("no image in this row")
        return data, ""

    def _load(self, j: int, slot: int, epoch: int, tf: SampleTransform) -> Augmented:
        if self.tokenize is not None and not (self.captions[j] or "").strip():
            raise BadImageError("missing or empty caption")
        try:
            data, _ = self.raw(j)
        except BadImageError:
            raise
        except Exception as e:  # the file went away, a row group cannot be read
            raise BadImageError(describe_error(e)) from None
        return tf.decode(data, epoch, slot, fast=self.fast_decode)

    def sample(self, index: int, epoch: int, tf: SampleTransform) -> Sample:
        s = super().sample(index, epoch, tf)
        if self.tokenize is not None:
            text = self.captions[s.index] if s.index >= 0 else ""
            s.extra = dict(s.extra or {}) | {"text": self.tokenize([text or ""])[0]}
        return s


# ------------------------------------------------------------------------------------------ stream mode
class RowGroupReader(UnitReader):
    """Row groups read whole, one at a time (the units of ``vitscale.data.stream``)."""

    def __init__(self, table: Table, cfg, opts: RemoteOptions):
        self.table, self.opts = table, opts
        self.units = list(range(len(table.groups)))
        self.image_column, self.caption_column = cfg.image_column, cfg.caption_column
        self.starts, total = [], 0
        for _, _, n in table.groups:
            self.starts.append(total)
            total += n

    def name(self, unit: int) -> str:
        f, rg, _ = self.table.groups[unit]
        return f"{self.table.urls[f]}#rowgroup{rg}"

    def read(self, unit: int):
        import pyarrow.parquet as pq

        f, rg, _ = self.table.groups[unit]
        with _readable(self.table.urls[f], self.opts) as fh:
            images = pq.ParquetFile(fh).read_row_group(rg, columns=[self.image_column]).column(self.image_column)
            start = self.starts[unit]
            for r, value in enumerate(images.to_pylist()):
                row = start + r
                label = self.table.labels[row]
                yield {"key": f"{name_of(self.table.urls[f])}#{row}", "image": _image_bytes(value),
                       "label": None if label < 0 else label,
                       "caption": self.table.captions[row] if self.table.captions is not None else None}  # fmt: skip


# ------------------------------------------------------------------------------------------ the format
def parquet_split(cfg, name: str, *, img_size=None, num_channels: int = 3, seed: int = 0,
                  classes=None, tokenize=None) -> Split | None:  # fmt: skip
    """The ``train`` split (streamed or indexed) or the ``val`` split (indexed); ``tokenize``: the model
    family's tokenizer for the captions (None: none read)."""
    path = cfg.train_path if name == "train" else cfg.val_path
    if not path:
        return None
    opts = RemoteOptions.of(cfg)
    table = read_table(cfg, name, path, classes, opts)
    count = len(table.class_names) if table.class_names else 0
    info = {"files": len(table.urls), "row_groups": len(table.groups), "columns": ", ".join(table.columns)}
    if name == "train" and cfg.parquet_mode == "stream":
        reader = RowGroupReader(table, cfg, opts)
        n = cfg.samples_per_epoch or sum(r for _, _, r in table.groups)
        src = StreamSource(reader, cfg, samples_per_epoch=n, num_classes=count, captions=table.captions is not None,
                           tokenize=tokenize, exact=not cfg.samples_per_epoch)  # fmt: skip
        return Split(src, table.class_names, info=info)
    return Split(ParquetSource(table, cfg, opts, tokenize), table.class_names, info=info)


def check(cfg) -> None:
    """Up-front: a path is set, it expands to files, their schemes are readable here, the first opens."""
    if not cfg.train_path and not cfg.val_path:
        raise CheckError("data.format=parquet needs data.train_path (a folder, glob or URL of .parquet files)")
    opts = RemoteOptions.of(cfg)
    for field, path in (("data.train_path", cfg.train_path), ("data.val_path", cfg.val_path)):
        if path:
            urls = expand(path, EXTS, field, opts)
            if scheme(urls[0]) not in ("http", "https", "pipe"):
                check_urls(urls, field, opts)


def _class_names(cfg) -> list[str] | None:
    return read_class_names(cfg.train_path)


def _detect(path: str) -> bool:
    try:
        return all(p.endswith(EXTS) for p in expand(path, EXTS))
    except (CheckError, OSError):
        return False


FORMAT = register_format(DataFormat(
    "parquet", parquet_split, config=ParquetData, captions=True, check=check, detect=_detect, class_names=_class_names,
    summary="Parquet files with an image column (binary or {bytes, path}) and a label or caption column",
))  # fmt: skip

__all__ = ["FORMAT", "ParquetData", "ParquetSource", "RowGroupReader", "check", "parquet_split", "read_table"]
