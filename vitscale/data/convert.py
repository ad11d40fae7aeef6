"""``vitscale data convert SRC OUT --to webdataset|parquet``: a dataset of any readable format (an image
folder, shards, Parquet, CSV, the digits) rewritten as classification (or caption) shards or Parquet.

The images are copied as they are stored (no re-encoding; the digits, held as pixels, become PNG),
with their labels and captions, in a random order keyed by ``seed`` (a stream reads files front to back
and shuffles only within its buffer, so files of one class each — an image folder's order — would
give batches of few classes), or with ``shuffle=False`` in the source's order:

- ``webdataset``: ``OUT/<prefix>-000000.tar`` ... with ``<key>.<ext>`` + ``<key>.cls`` (+ ``<key>.txt``),
  a new shard after ``--max-count`` samples or ``--max-shard-mb``;
- ``parquet``: ``OUT/<prefix>-00000.parquet`` ... with an ``image`` column of ``{bytes, path}`` structs,
  a ``label`` column (+ ``caption``) and a ``key`` column, ``--row-group`` rows per row group, a new
  file after ``--max-shard-mb``; the class names also as the ``ClassLabel`` names of the ``datasets``
  library's ``huggingface`` schema metadata.

``OUT/classnames.txt`` holds the class names in index order. An image that cannot be read is left out
and counted.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Literal

from .classes import CLASSNAMES_FILE
from .formats import get_format
from .keyed import epoch_permutation

log = logging.getLogger("vitscale.data")

Target = Literal["webdataset", "parquet"]


def sniff_ext(data: bytes) -> str:
    """The file extension of encoded image bytes (by their signature)."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:2] == b"BM":
        return "bmp"
    if data[:1] == b"P" and data[1:2] in (b"5", b"6"):
        return "ppm"
    return "jpg"


def _samples(cfg, shuffle: bool, seed: int):
    """(key, bytes, ext, label, caption) of every sample of ``cfg``'s training split (in a keyed random
    order, or the source's); the class names; the number of images that could not be read (a
    one-element list, filled while reading)."""
    fmt = get_format(cfg.format)
    split = fmt.split(cfg, "train", img_size=(224, 224), num_channels=3, seed=0, classes=None)
    src, bad = split.source, [0]
    if hasattr(src, "reader"):  # a stream: its units front to back (in order: a random one costs a full read)
        return _streamed(src.reader, bad), list(split.class_names), bad
    if not hasattr(src, "raw"):
        raise ValueError(f"data.format={cfg.format}: its samples cannot be read as stored (its source has no raw())")
    captions = getattr(src, "captions", None)
    labels = getattr(src, "labels", None)

    order = epoch_permutation(len(src), seed, 0, shuffle).tolist()

    def gen():
        for i in order:
            try:
                data, ext = src.raw(i)
            except Exception as e:  # a missing or unreadable file
                log.warning("skipped %s: %s", src.key(i), e)
                bad[0] += 1
                continue
            label = int(labels[i]) if labels is not None else -1
            yield f"{i:08d}", data, _ext(ext, data), label, (captions[i] if captions is not None else None)

    return gen(), list(split.class_names), bad


def _streamed(reader, bad):
    n = 0
    for unit in reader.units:
        for raw in reader.read(unit):
            if raw.get("image") is None:
                log.warning("skipped %s:%s: no image", reader.name(unit), raw.get("key"))
                bad[0] += 1
                continue
            label = raw.get("label")
            yield f"{n:08d}", raw["image"], _ext("", raw["image"]), -1 if label is None else int(label), raw.get("caption")
            n += 1


def _ext(ext: str, data: bytes) -> str:
    return ext if ext in ("jpg", "jpeg", "png", "webp", "ppm", "bmp") else sniff_ext(data)


def convert(cfg, out: str, to: Target, *, prefix: str | None = None, max_count: int = 10_000,
            max_shard_mb: float = 1024.0, row_group: int = 100, shuffle: bool = True, seed: int = 0) -> dict:  # fmt: skip
    """Write the training split of ``cfg`` (``data.train_path`` = SRC) to ``out``; returns a summary."""
    if to not in ("webdataset", "parquet"):
        raise ValueError(f"--to must be webdataset or parquet, got {to!r}")
    prefix = prefix or os.path.basename(str(getattr(cfg, "train_path", None) or cfg.format).rstrip("/")).split(".")[0] or "data"
    os.makedirs(out, exist_ok=True)
    samples, names, bad = _samples(cfg, shuffle, seed)
    write = _write_webdataset if to == "webdataset" else _write_parquet
    files, n = write(samples, names, out, prefix, max_count, int(max_shard_mb * (1 << 20)), row_group)
    if names:
        with open(os.path.join(out, CLASSNAMES_FILE), "w", encoding="utf-8") as f:
            f.write("".join(f"{c}\n" for c in names))
    return {"to": to, "out": out, "files": files, "samples": n, "classes": len(names), "skipped": bad[0]}


def _write_webdataset(samples, names, out, prefix, max_count, max_bytes, row_group):
    import webdataset as wds

    n = 0
    pattern = os.path.join(out, f"{prefix}-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=max_count, maxsize=max_bytes, verbose=0) as sink:
        for key, data, ext, label, caption in samples:
            sample = {"__key__": key, ext: data}
            if label >= 0:
                sample["cls"] = str(label)
            if caption is not None:
                sample["txt"] = caption
            sink.write(sample)
            n += 1
        files = sink.shard
    return [os.path.basename(pattern % i) for i in range(files)], n


def _write_parquet(samples, names, out, prefix, max_count, max_bytes, row_group):
    import pyarrow as pa
    import pyarrow.parquet as pq

    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    files, n, rows, size, writer = [], 0, [], 0, None
    features = {"image": {"_type": "Image"}, "key": {"dtype": "string", "_type": "Value"}}
    meta_done = {"schema": None}

    def flush(final: bool = False):
        nonlocal writer, rows, size
        if rows:
            cols = {"image": pa.array([{"bytes": d, "path": f"{k}.{e}"} for k, d, e, _, _ in rows], type=image_type),
                    "key": pa.array([k for k, *_ in rows], type=pa.string())}  # fmt: skip
            if any(y >= 0 for *_, y, _ in rows) or names:
                cols["label"] = pa.array([y for *_, y, _ in rows], type=pa.int64())
                features["label"] = {"names": names, "_type": "ClassLabel"}
            if any(c is not None for *_, c in rows):
                cols["caption"] = pa.array([c for *_, c in rows], type=pa.string())
                features["caption"] = {"dtype": "string", "_type": "Value"}
            table = pa.table(cols)
            meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
            table = table.replace_schema_metadata(meta)
            if writer is None:
                files.append(f"{prefix}-{len(files):05d}.parquet")
                writer = pq.ParquetWriter(os.path.join(out, files[-1]), table.schema)
                meta_done["schema"] = table.schema
            writer.write_table(table.cast(meta_done["schema"]), row_group_size=row_group)
            rows = []
        if writer is not None and (final or size >= max_bytes):
            writer.close()
            writer, size = None, 0

    for item in samples:
        rows.append(item)
        size += len(item[1])
        n += 1
        if len(rows) == row_group:
            flush()
    flush(final=True)
    return files, n


__all__ = ["convert", "sniff_ext"]
