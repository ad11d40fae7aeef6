"""Image-caption samples for CLIP: a caption file source, and the digits as captioned shards
(``vitscale data digits-captions``).

:class:`CaptionSource` is the image-file source of the classification pipeline (keyed sampling and
augmentation, resumable loader, bad-sample replacement and counting) with a caption per sample: its
samples carry ``extra["text"]``, the caption's token ids (the model family's tokenizer, given to
``build_loaders`` as ``tokenize``), which the loader stacks into ``batch["text"]`` (B, L). An undecodable image, a missing image or a missing / empty caption makes a
sample bad: it is replaced by the next good one and counted in ``batch["skipped"]``, exactly like an
undecodable file in classification. Formats: ``vitscale.data.webdataset`` (tar shards) and
``vitscale.data.csv`` (CSV / TSV of image path + caption).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .decode import BadImageError
from .digits import DIGIT_CAPTION_TEMPLATES
from .files import read_regular
from .sources import FileSource, Sample
from .transforms import Augmented, SampleTransform

CLASSNAMES_FILE = "classnames.txt"
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "ppm", "bmp")  # image members of a WebDataset sample


@dataclass(frozen=True)
class TarMember:
    """An image inside a tar shard: read ``size`` bytes at ``offset`` (no extraction)."""

    shard: str
    offset: int
    size: int
    name: str

    def __str__(self) -> str:
        return f"{self.shard}:{self.name}"


class CaptionSource(FileSource):
    """Images (file paths or tar members) with a caption and an optional class label (-1 = none)."""

    def __init__(self, images: list, captions: list[str | None], labels: list[int] | None = None, *,
                 fast_decode: bool = True, tokenize=None):  # fmt: skip
        labels = labels if labels is not None else [-1] * len(images)
        super().__init__(
            [str(p) if p is not None else "<missing image>" for p in images], labels, fast_decode
        )
        self.images, self.captions = list(images), list(captions)
        self.tokenize = tokenize  # texts -> token ids (N, L): the model family's tokenizer; None: no tokens
        self._files: dict[tuple[int, str], object] = {}  # (pid, shard) -> open file, per worker process

    def _bytes(self, j: int) -> bytes:
        loc = self.images[j]
        if loc is None:
            raise BadImageError("missing image")
        if isinstance(loc, TarMember):
            key = (os.getpid(), loc.shard)
            f = self._files.get(key)
            if f is None:
                f = self._files[key] = open(loc.shard, "rb")  # noqa: SIM115 - kept open per worker
            f.seek(loc.offset)
            return f.read(loc.size)
        try:
            return read_regular(loc)  # a FIFO or device: skipped like an undecodable file, never blocks
        except OSError as e:
            raise BadImageError(f"{type(e).__name__}: {e}") from None

    def _load(self, j: int, slot: int, epoch: int, tf: SampleTransform) -> Augmented:
        cap = self.captions[j]
        if cap is None or not cap.strip():
            raise BadImageError("missing or empty caption")
        return tf.decode(self._bytes(j), epoch, slot, fast=self.fast_decode)

    def tokens(self, j: int) -> torch.Tensor:
        return self.tokenize([self.captions[j]])[0]  # (L,)

    def sample(self, index: int, epoch: int, tf: SampleTransform) -> Sample:
        s = super().sample(index, epoch, tf)
        if self.tokenize is not None:
            extra = dict(getattr(s, "extra", None) or {})
            extra["text"] = self.tokens(s.index)
            s.extra = extra
        return s


def read_class_names(path: str | None) -> list[str] | None:
    """``classnames.txt`` (one name per line) in the folder of ``path`` (a folder, file or pattern)."""
    if not path:
        return None
    folder = path if os.path.isdir(path) else os.path.dirname(path.split("{")[0].split("*")[0]) or "."
    for cand in (
        os.path.join(folder, CLASSNAMES_FILE),
        os.path.join(os.path.dirname(folder.rstrip("/")), CLASSNAMES_FILE),
    ):
        if os.path.isfile(cand):
            with open(cand) as f:
                return [line.strip() for line in f if line.strip()]
    return None


def class_names_for(cfg_data) -> list[str] | None:
    """Class names of a caption dataset (its ``classnames.txt``), or None."""
    return read_class_names(cfg_data.train_path)


# ----------------------------------------------------------------------------- digits-captions

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def write_digits_captions(
    out_dir: str, size: int = 32, shard_size: int = 500, templates=DIGIT_CAPTION_TEMPLATES
) -> dict:
    """Write the digits (fixed 1,497 / 300 split) as WebDataset shards ``OUT/{train,val}/digits-%06d.tar``;
    each sample is ``<key>.png`` + ``<key>.txt`` (a caption from ``templates``, the template chosen by
    the sample index) + ``<key>.cls``. ``OUT/classnames.txt`` lists the class words."""
    import io

    import webdataset as wds
    from PIL import Image

    from .digits import load_digits_split

    counts = {}
    for split in ("train", "val"):
        os.makedirs(os.path.join(out_dir, split), exist_ok=True)
        images, labels = load_digits_split(split, num_channels=1)  # (N, 1, 8, 8) uint8
        pattern = os.path.join(out_dir, split, "digits-%06d.tar")
        with wds.ShardWriter(pattern, maxcount=shard_size, verbose=0) as sink:
            for n, (img, y) in enumerate(zip(images, labels.tolist())):
                pil = Image.fromarray(img[0].numpy(), mode="L")
                if size and size != 8:
                    pil = pil.resize((size, size), Image.Resampling.BICUBIC)
                buf = io.BytesIO()
                pil.save(buf, format="PNG")
                caption = templates[(n * 7 + y) % len(templates)].format(DIGIT_WORDS[y])
                sink.write(
                    {"__key__": f"{split}{n:05d}", "png": buf.getvalue(), "txt": caption, "cls": str(y)}
                )
        counts[split] = len(labels)
    for folder in (out_dir, os.path.join(out_dir, "train"), os.path.join(out_dir, "val")):
        with open(os.path.join(folder, CLASSNAMES_FILE), "w") as f:
            f.write("\n".join(DIGIT_WORDS) + "\n")
    return counts


__all__ = ["CaptionSource", "TarMember", "class_names_for", "read_class_names", "write_digits_captions"]
