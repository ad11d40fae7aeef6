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
import logging
import os
import tarfile

from .build import register_format
from .captions import IMAGE_EXTS, CaptionSource, TarMember, read_class_names
from .files import describe_skipped, split_regular

log = logging.getLogger("vitscale.data")


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
    out, special = split_regular(out)  # a FIFO named x.tar would block the first read forever
    if special:
        log.warning("%s", describe_skipped(f"shards {spec}", special))
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


def webdataset_sources(cfg, img_size, num_channels: int, seed: int, tokenize=None):
    """-> (train CaptionSource, val CaptionSource or None, num_classes, class_names)."""
    if not cfg.train_path:
        raise ValueError(
            "data.format=webdataset needs data.train_path (a folder of .tar shards, a glob or a brace pattern)"
        )
    kw = dict(fast_decode=cfg.fast_decode, tokenize=tokenize)
    mode = cfg.webdataset_mode
    if mode == "stream":  # nothing indexed: shards streamed through the webdataset package
        from .webdataset_stream import StreamSource

        train = StreamSource(cfg, expand_shards(cfg.train_path), tokenize)
    elif mode == "index":
        train = CaptionSource(*index_shards(expand_shards(cfg.train_path)), **kw)
    else:
        raise ValueError(f"data.webdataset_mode must be 'index' or 'stream', got {mode!r}")
    val = CaptionSource(*index_shards(expand_shards(cfg.val_path)), **kw) if cfg.val_path else None
    names = read_class_names(cfg.train_path) or []
    labels = train.labels or (val.labels if val is not None else [])
    n_cls = len(names) or (max(labels) + 1 if max(labels, default=-1) >= 0 else 0)
    return train, val, n_cls, names or [str(i) for i in range(n_cls)]


register_format("webdataset", webdataset_sources, captions=True)

__all__ = ["expand_shards", "index_shards", "webdataset_sources"]
