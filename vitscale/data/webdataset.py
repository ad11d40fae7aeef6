"""``data.format=webdataset``: WebDataset tar shards, local or remote, for every task.

A sample is the members sharing a key: an image (``<key>.jpg|jpeg|png|webp``, mixed in one shard),
optionally a class label (``<key>.cls``: an ASCII integer; ``data.label_key`` names another member,
or a field of the ``.json`` member: ``json.label``) and a caption (``<key>.txt``) — timm's
``imagenet-1k-wds`` (``.jpg`` + ``.cls`` + ``.json``), img2dataset's LAION / CC12M (``.jpg`` + ``.txt``),
``vitscale data convert`` and ``vitscale data digits-captions``. ``classnames.txt`` beside the shards
names the classes (else their count comes from the labels).

``data.train_path`` / ``data.val_path``: a folder of ``*.tar``, a glob, a brace pattern
(``train-{000000..000099}.tar``), several joined with ``::``, on local disk or at any URL fsspec
opens (``s3://``, ``gs://``, ``az://``, ``https://``, ``hf://``) or a ``pipe:`` command
(``pipe:aws s3 cp s3://bucket/train-{000000..000099}.tar -``); see ``vitscale.data.remote``.

- ``data.webdataset_mode=index`` (default; the validation split always): every shard's headers are
  read at start-up (a remote shard is first copied into ``data.shard_cache``), then a sample is read
  by one seek: exact keyed epochs, the same batches for any number of ranks or workers, resumable.
  Whatever is wrong is found here and stops the run with one line before any model is built: an
  unreadable or cut shard, a sample without its label, a label outside the classes.
- ``data.webdataset_mode=stream``: shards streamed by rank and worker (``vitscale.data.stream``),
  nothing indexed; bad samples and unreadable shards are skipped, counted and named instead.
"""

from __future__ import annotations

import logging
import tarfile
from dataclasses import dataclass
from typing import Literal

from ..config.data import CaptionFields, DataConfig, PathFields, RemoteFields, StreamFields
from ..errors import CheckError
from .captions import CaptionSource
from .classes import classes_from_labels, read_class_names
from .formats import DataFormat, Split, register_format
from .remote import RemoteOptions, check_urls, describe_error, expand, local_copy, open_stream, read_retrying
from .stream import StreamSource, UnitReader
from .tar import (
    CAPTION_EXTS,
    DuplicateKeyError,
    LabelError,
    caption_of,
    image_ext,
    index_shard,
    iter_samples,
    label_of,
)

log = logging.getLogger("vitscale.data")

EXTS = (".tar",)


@dataclass
class WebDatasetData(RemoteFields, StreamFields, CaptionFields, PathFields, DataConfig):
    """``data.format=webdataset``."""

    format: str = "webdataset"
    webdataset_mode: Literal["index", "stream"] = "index"
    """``index`` (read every shard's tar headers at start-up, then seek samples: exact keyed epochs, the
    same batches for any rank / worker count, everything checked before the run; remote shards are
    copied into ``data.shard_cache`` first) or ``stream`` (shards read front to back, split by rank
    then DataLoader worker or resampled, with a shuffle buffer; nothing read at start-up but the first
    sample: LAION-400M-scale data, remote data without local copies). Validation is always indexed."""
    label_key: str = "cls"
    """The member holding a sample's class: ``cls`` (an ASCII integer, ``<key>.cls``), another
    extension, or a field of the ``.json`` member (``json.label``, ``json.meta.label``)."""


def _field(name: str) -> str:
    return "data.train_path" if name == "train" else "data.val_path"


def _small_exts(label_key: str) -> tuple[str, ...]:
    return (("json",) if label_key.startswith("json.") else (label_key,)) + CAPTION_EXTS


def _label(sample: dict, label_key: str) -> int | None:
    return label_of(sample, label_key)


def _index(cfg, name: str, path: str, classes, opts: RemoteOptions, tokenize) -> Split:
    field = _field(name)
    images, captions, labels, keys = [], [], [], []
    missing = None  # (url, key) of the first sample without a label
    for url in expand(path, EXTS, field, opts):
        try:
            local = local_copy(url, opts)
            samples = index_shard(local, _small_exts(cfg.label_key), url=url if local != url else "")
        except DuplicateKeyError as e:
            raise CheckError(f"{field}: shard {url}: {e}") from None
        except (tarfile.ReadError, EOFError, OSError) as e:
            raise CheckError(f"{field}: shard {url} cannot be read ({describe_error(e)}): replace or remove it") from None
        except Exception as e:  # an HTTP error answer, ...
            raise CheckError(f"{field}: shard {url} cannot be read ({describe_error(e)})") from None
        for s in samples:
            try:
                y = _label(s, cfg.label_key)
            except LabelError as e:
                raise CheckError(f"{field}: sample {s['__key__']} in {url}: {e}") from None
            if y is None and missing is None:
                missing = (url, s["__key__"])
            images.append(s["image"])
            captions.append(caption_of(s))
            labels.append(-1 if y is None else y)
            keys.append(s["__key__"])
    labelled = any(y != -1 for y in labels)
    if labelled and missing is not None:
        raise CheckError(f"{field}: sample {missing[1]} in {missing[0]} has no {_what(cfg.label_key)} while others "
                         f"have one: add it, or remove the sample (data.label_key={cfg.label_key})")  # fmt: skip
    names = list(classes) if classes is not None else read_class_names(path) or []
    count = classes_from_labels(labels, f"{field}={path}", len(names) or cfg.num_classes)
    names = names or [str(i) for i in range(count)]
    has_captions = any(c is not None for c in captions)
    src = CaptionSource(images, captions if has_captions else None, labels, keys=keys, fast_decode=cfg.fast_decode,
                        tokenize=tokenize)  # fmt: skip
    return Split(src, names, info={"shards": len(set(m.shard for m in images if m is not None)),
                                   "members": "image" + (" + caption" if has_captions else "")
                                   + (f" + label ({cfg.label_key})" if labelled else "")})  # fmt: skip


def _what(label_key: str) -> str:
    return f"{label_key} field in its .json member" if label_key.startswith("json.") else f".{label_key} member"


class ShardReader(UnitReader):
    """Shards streamed front to back (local, fsspec URLs, ``pipe:``)."""

    def __init__(self, urls: list[str], label_key: str, opts: RemoteOptions):
        self.units, self.label_key, self.opts = urls, label_key, opts

    def name(self, unit: str) -> str:
        return unit

    def read(self, url: str):
        with open_stream(url, self.opts) as f:
            for s in iter_samples(f, url):
                yield self.raw(s)

    def raw(self, s: dict) -> dict:
        out = {"key": s["__key__"], "image": s.get(image_ext(s) or "", None), "caption": caption_of(s)}
        try:
            out["label"] = _label(s, self.label_key)
        except LabelError as e:
            out["label"], out["label_error"] = None, str(e)
        if s.get("__too_large__"):  # a member not read: the sample is bad, with the reason
            out["label"], out["label_error"] = None, s["__too_large__"]
        if out["label"] is None:
            out["label_missing"] = f"no {_what(self.label_key)}"
        return out


def _stream(cfg, path: str, opts: RemoteOptions, tokenize) -> Split:
    urls = expand(path, EXTS, "data.train_path", opts)
    reader = ShardReader(urls, cfg.label_key, opts)
    first = _first_shard(reader, urls[0], whole=not cfg.samples_per_epoch)
    if not first:
        raise CheckError(f"data.train_path: the first shard {urls[0]} has no samples")
    labelled = any(r.get("label") is not None for r in first)
    names = read_class_names(path) or []
    count = len(names) or cfg.num_classes or 0
    if labelled and not count:
        raise CheckError(f"data.train_path={path}: the shards have labels ({_what(cfg.label_key)}) but stream mode "
                         f"reads none at start-up: set data.num_classes or put classnames.txt beside the shards")  # fmt: skip
    n = cfg.samples_per_epoch or len(urls) * len(first)
    if not cfg.samples_per_epoch:
        log.info("data.samples_per_epoch unset: %d shards x %d samples in the first = %d", len(urls), len(first), n)
    captions = any(r.get("caption") is not None for r in first)
    src = StreamSource(reader, cfg, samples_per_epoch=n, num_classes=count, captions=captions, tokenize=tokenize)
    return Split(src, names or [str(i) for i in range(count)], info={"shards": len(urls)})


def _first_shard(reader: ShardReader, url: str, whole: bool) -> list[dict]:
    """The raw samples of the first shard: all of them (to count them), or only the first."""
    out = []
    try:
        for raw in read_retrying(lambda: reader.read(url), url, reader.opts):
            out.append(raw)
            if not whole:
                break
    except DuplicateKeyError as e:
        raise CheckError(f"data.train_path: the first shard {url}: {e}") from None
    except Exception as e:
        raise CheckError(f"data.train_path: the first shard {url} cannot be read: {describe_error(e)}") from None
    return out


def webdataset_split(cfg, name: str, *, img_size=None, num_channels: int = 3, seed: int = 0,
                     classes=None, tokenize=None) -> Split | None:  # fmt: skip
    """The ``train`` split (indexed or streamed) or the ``val`` split (always indexed); ``tokenize``: the
    model family's tokenizer for the captions (None: none read)."""
    path = cfg.train_path if name == "train" else cfg.val_path
    if not path:
        return None
    opts = RemoteOptions.of(cfg)
    if name == "train" and cfg.webdataset_mode == "stream":
        return _stream(cfg, path, opts, tokenize)
    return _index(cfg, name, path, classes, opts, tokenize)


def check(cfg) -> None:
    """Up-front: a train path is set; each path expands to shards whose schemes are readable here and
    whose first shard opens."""
    if not cfg.train_path and not cfg.val_path:
        raise CheckError("data.format=webdataset needs data.train_path (a folder of .tar shards, a glob, a brace "
                         "pattern or a URL)")  # fmt: skip
    opts = RemoteOptions.of(cfg)
    for name, path in (("train", cfg.train_path), ("val", cfg.val_path)):
        if path:
            check_urls(expand(path, EXTS, _field(name), opts), _field(name), opts)


def _detect(path: str) -> bool:
    try:
        return all(p.endswith(EXTS) or p.startswith("pipe:") for p in expand(path, EXTS))
    except (CheckError, OSError):
        return False


FORMAT = register_format(DataFormat(
    "webdataset", webdataset_split, config=WebDatasetData, captions=True, check=check, detect=_detect,
    class_names=lambda cfg: read_class_names(cfg.train_path),
    summary="WebDataset tar shards (local, fsspec URLs, pipe:): <key>.<image ext> + .cls / .json / .txt",
))  # fmt: skip

__all__ = ["FORMAT", "ShardReader", "WebDatasetData", "check", "webdataset_split"]
