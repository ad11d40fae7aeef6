"""``data.format=webdataset``: image-text pairs from WebDataset tar shards (``<key>.jpg|png|webp`` +
``<key>.txt`` [+ ``<key>.cls``]), the layout written by img2dataset and ``vitscale data digits-captions``.

Shards are indexed once at start-up (tar headers only: the offset and size of every member), so a
sample is read by one seek and the shards plug into the keyed pipeline: the epoch order is a
permutation keyed by (seed, epoch), split by rank (strided micro-batches) and by DataLoader worker
(whole batches), identical for any number of workers or ranks and resumable at the next unseen batch
(``{epoch, batch_index}``). ``data.train_path`` / ``data.val_path``: a folder of ``*.tar``, a glob, or
a brace pattern (``shards/{00000..00099}.tar``, expanded with ``braceexpand`` from the ``webdataset``
package's dependencies).
"""

from __future__ import annotations

import glob
import os
import tarfile
from dataclasses import dataclass
from typing import Literal

from .captions import IMAGE_EXTS, CaptionSource, TarMember, read_class_names
from .config import CaptionFields
from .formats import DataFormat, Split, register_format


def expand_shards(spec: str) -> list[str]:
    """Shard paths of a folder, glob or brace pattern (several specs may be joined with ``::``)."""
    out: list[str] = []
    for part in spec.split("::"):
        if os.path.isdir(part):
            out += sorted(glob.glob(os.path.join(part, "*.tar")))
            continue
        if "{" in part:
            from braceexpand import braceexpand

            out += [p for p in braceexpand(part)]
        elif any(c in part for c in "*?["):
            out += sorted(glob.glob(part))
        else:
            out.append(part)
    if not out:
        raise FileNotFoundError(f"no .tar shards found for {spec!r}")
    missing = [p for p in out if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"{len(missing)} shard(s) missing, e.g. {missing[0]!r}")
    return out


def _split_key(name: str) -> tuple[str, str]:
    """WebDataset's key / extension split: the extension starts at the first dot of the basename."""
    folder, base = os.path.split(name)
    if "." not in base:
        return name, ""
    stem, ext = base.split(".", 1)
    return os.path.join(folder, stem), ext.lower()


def index_shards(shards: list[str]) -> tuple[list, list, list]:
    """-> (images: TarMember | None, captions: str | None, labels: int) for every sample key, in
    shard order then member order."""
    images, captions, labels = [], [], []
    for shard in shards:
        groups: dict[str, dict] = {}
        with tarfile.open(shard, "r:") as tf:
            for m in tf:
                if not m.isfile():
                    continue
                key, ext = _split_key(m.name)
                g = groups.setdefault(key, {})
                if ext in IMAGE_EXTS and "image" not in g:
                    g["image"] = TarMember(shard, m.offset_data, m.size, m.name)
                elif ext in ("txt", "text", "caption"):
                    g["caption"] = tf.extractfile(m).read().decode("utf-8", errors="replace")
                elif ext == "cls":
                    try:
                        g["label"] = int(tf.extractfile(m).read().decode().strip())
                    except ValueError:
                        pass
        for g in groups.values():  # dicts keep the members' order
            images.append(g.get("image"))
            captions.append(g.get("caption"))
            labels.append(g.get("label", -1))
    return images, captions, labels


@dataclass
class WebDatasetOptions(CaptionFields):
    webdataset_mode: Literal["index", "stream"] = "index"
    """``index`` (read every shard's tar headers at start-up, then seek samples: exact keyed epochs,
    same batches for any rank / worker count; up to millions of samples) or ``stream``
    (``vitscale/data/webdataset_stream.py``: shards read sequentially, split by rank then DataLoader
    worker or resampled, with a shuffle buffer; nothing read at start-up, for LAION-400M-scale data).
    Validation sets are always indexed. See docs/clip.md."""
    samples_per_epoch: int | None = None
    """Stream mode: samples per epoch (all ranks), which sets the loader length and so
    ``train.epochs``; None = number of shards x samples in the first shard (reads one shard)."""
    resampled: bool = False
    """Stream mode: draw shards with replacement per (rank, worker), keyed by (seed, epoch) (open_clip's
    ``--dataset-resampled``): every worker always has data, epochs are ``samples_per_epoch`` long, and
    samples may repeat or be missed within an epoch."""
    webdataset_shuffle_buffer: int = 1000
    """Stream mode: samples held by each worker's shuffle buffer (raw bytes, before decoding);
    <= 1 = shard order."""


def webdataset_split(cfg, name: str, *, img_size=None, num_channels: int = 3, seed: int = 0,
                     classes=None) -> Split | None:  # fmt: skip
    """The ``train`` split (indexed or streamed) or the ``val`` split (always indexed)."""
    if not cfg.train_path and not cfg.val_path:
        raise ValueError(
            "data.format=webdataset needs data.train_path (a folder of .tar shards, a glob or a brace pattern)"
        )
    path = cfg.train_path if name == "train" else cfg.val_path
    if not path:
        return None
    kw = dict(fast_decode=cfg.fast_decode, context_length=cfg.caption_context_length)
    if name == "train" and cfg.webdataset_mode == "stream":  # nothing indexed: shards streamed
        from .webdataset_stream import StreamSource

        src = StreamSource(cfg, expand_shards(path))
    else:
        src = CaptionSource(*index_shards(expand_shards(path)), **kw)
    names = list(classes) if classes is not None else read_class_names(path) or []
    n_cls = len(names) or (max(src.labels) + 1 if max(src.labels, default=-1) >= 0 else 0)
    return Split(src, names or [str(i) for i in range(n_cls)])


def _detect(path: str) -> bool:
    try:
        return all(p.endswith(".tar") for p in expand_shards(path))
    except (FileNotFoundError, OSError):
        return False


FORMAT = register_format(DataFormat(
    "webdataset", webdataset_split, options=WebDatasetOptions, detect=_detect,
    class_names=lambda cfg: read_class_names(cfg.train_path),
    summary="WebDataset tar shards: <key>.<image ext> + <key>.txt / .cls members",
))  # fmt: skip

__all__ = ["FORMAT", "WebDatasetOptions", "expand_shards", "index_shards", "webdataset_split"]
