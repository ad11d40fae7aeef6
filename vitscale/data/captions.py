"""Samples read from bytes (tar members, files) with an optional caption, a class label and a key;
the digits as captioned shards (``vitscale data digits-captions``).

:class:`CaptionSource` is the image-file source of the classification pipeline (keyed sampling and
augmentation, resumable loader, bad-sample replacement and counting) for samples of shards and
caption files: with captions and a tokenizer (``tokenize``: the model family's, handed to
``build_loader`` by the run assembly), its samples carry ``extra["text"]``, the caption's token ids,
which the loader stacks into ``batch["text"]`` (B, L); with keys, ``extra["key"]`` (the sample's key,
by which token labels are found). An undecodable image, a missing image or, when captions are
tokenized, a missing / empty caption makes a sample bad: it is replaced by the next good one
(training) or left out (evaluation) and counted in ``batch["skipped"]``, exactly like an undecodable
file in classification. Formats: ``vitscale.data.webdataset`` (tar shards) and ``vitscale.data.csv``
(CSV / TSV of image path + caption).
"""

from __future__ import annotations

import os

import torch

from .classes import CLASSNAMES_FILE, read_class_names
from .decode import BadImageError
from .digits import DIGIT_CAPTION_TEMPLATES
from .files import read_regular
from .remote import open_file
from .sources import FileSource, Sample
from .tar import IMAGE_EXTS, TarMember, split_key, too_large
from .transforms import Augmented, SampleTransform


class CaptionSource(FileSource):
    """Images (file paths or tar members) with an optional caption (``captions`` None: a dataset
    without captions), a class label (-1 = none) and an optional key per sample."""

    def __init__(self, images: list, captions: list[str | None] | None, labels: list[int] | None = None, *,
                 keys: list[str] | None = None, fast_decode: bool = True, tokenize=None):  # fmt: skip
        labels = labels if labels is not None else [-1] * len(images)
        super().__init__(
            [str(p) if p is not None else "<missing image>" for p in images], labels, fast_decode
        )
        self.images = list(images)
        self.captions = list(captions) if captions is not None else None
        self.keys = list(keys) if keys is not None else None
        # texts -> token ids (N, L): the model family's tokenizer; None (or no captions): no tokens
        self.tokenize = tokenize if self.captions is not None else None
        self._files: dict[tuple[int, str], object] = {}  # (pid, shard) -> open file, per worker process

    def key(self, index: int) -> str:
        return self.keys[index] if self.keys is not None else super().key(index)

    def raw(self, j: int) -> tuple[bytes, str]:
        """The encoded image of sample ``j`` and its extension."""
        loc = self.images[j]
        name = loc.name if isinstance(loc, TarMember) else str(loc)
        return self._bytes(j), os.path.splitext(name)[1].lstrip(".").lower()

    def _bytes(self, j: int) -> bytes:
        loc = self.images[j]
        if loc is None:
            raise BadImageError("missing image")
        if isinstance(loc, TarMember):
            key = (os.getpid(), loc.shard)
            f = self._files.get(key)
            if f is None:
                f = self._files[key] = open_file(loc.shard)  # kept open per worker
            problem = too_large(loc.name, loc.size, split_key(loc.name)[1])
            if problem:  # skipped like an undecodable image, never read whole
                raise BadImageError(problem)
            f.seek(loc.offset)
            return f.read(loc.size)
        try:
            return read_regular(loc)  # a FIFO or device: skipped like an undecodable file, never blocks
        except OSError as e:
            raise BadImageError(f"{type(e).__name__}: {e}") from None

    def _load(self, j: int, slot: int, epoch: int, tf: SampleTransform) -> Augmented:
        if self.tokenize is not None:
            cap = self.captions[j]
            if cap is None or not cap.strip():
                raise BadImageError("missing or empty caption")
        return tf.decode(self._bytes(j), epoch, slot, fast=self.fast_decode)

    def tokens(self, j: int) -> torch.Tensor:
        return self.tokenize([self.captions[j]])[0]  # (L,)

    def sample(self, index: int, epoch: int, tf: SampleTransform) -> Sample:
        s = super().sample(index, epoch, tf)
        if s.index < 0:  # left out (evaluation): a blank row, but with the batch's fields
            s.extra = ({"text": torch.zeros_like(self.tokenize([""])[0])} if self.tokenize is not None else {}) | (
                {"key": ""} if self.keys is not None else {})
            return s
        extra = dict(s.extra or {})
        if self.tokenize is not None:
            extra["text"] = self.tokens(s.index)
        if self.keys is not None:
            extra["key"] = self.keys[s.index]
        s.extra = extra
        return s


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


__all__ = ["IMAGE_EXTS", "CaptionSource", "TarMember", "read_class_names", "write_digits_captions"]
