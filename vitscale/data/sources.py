"""Sample sources: in-memory uint8 tensors (digits), synthetic images, and image files.

A source maps a dataset index to a transformed sample; the dataset adds the batch bookkeeping.
``FileSource`` never fails on a bad file: in training an undecodable file is replaced by the next
decodable sample (index + 1, + 2, ... modulo the dataset size, the same in every epoch); read for an
evaluation (``leave_out_bad``) it is left out — the sample comes back as a blank padding row (index
-1, which evaluations ignore), so no image is counted twice. Either way it is reported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from . import keyed
from .decode import BadImageError
from .transforms import Augmented, SampleTransform

MAX_REPLACEMENTS = 64


def png_bytes(image: torch.Tensor) -> bytes:
    """A uint8 (C, H, W) image as a PNG file."""
    import io

    from PIL import Image

    arr = image.permute(1, 2, 0).numpy()  # (H, W, C)
    buf = io.BytesIO()
    Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr).save(buf, format="PNG")
    return buf.getvalue()


@dataclass
class Sample:
    aug: Augmented
    label: int
    index: int
    bad: list[tuple] = field(default_factory=list)  # (path, reason[, what became of it]) of bad files
    extra: dict = field(default_factory=dict)  # more batch fields from plugin formats (e.g. "text")


class TensorSource:
    """Images held in memory as a uint8 tensor (N, C, H, W), or a list of uint8 (C, H_i, W_i) images
    of their own sizes, with int labels."""

    def __init__(self, images: torch.Tensor | list[torch.Tensor], labels: torch.Tensor):
        assert all(im.dtype == torch.uint8 and im.ndim == 3 for im in images), "uint8 (C, H, W) images"
        self.images, self.labels = images, labels.long()

    def __len__(self) -> int:
        return len(self.images)

    def key(self, index: int) -> str:
        return str(index)

    def raw(self, index: int) -> tuple[bytes, str]:
        """Image ``index`` encoded (PNG), for ``vitscale data convert``."""
        return png_bytes(self.images[index]), "png"

    def sample(self, index: int, epoch: int, tf: SampleTransform) -> Sample:
        img = self.images[index]
        aug = tf.tensor_train(img, epoch, index) if tf.train else tf.tensor_eval(img)
        return Sample(aug, int(self.labels[index]), index)


class SyntheticSource:
    """``n`` random uint8 images keyed by (seed, index) with labels keyed the same way."""

    def __init__(self, n: int, num_classes: int, size: tuple[int, int], num_channels: int, seed: int):
        self.n, self.num_classes, self.size, self.num_channels = n, num_classes, size, num_channels
        self.seed = seed
        g = keyed.torch_gen(seed, keyed.STREAM_SYNTHETIC)
        self.labels = torch.randint(0, num_classes, (n,), generator=g)

    def __len__(self) -> int:
        return self.n

    def key(self, index: int) -> str:
        return str(index)

    def raw(self, index: int) -> tuple[bytes, str]:
        return png_bytes(self.image(index)), "png"

    def image(self, index: int) -> torch.Tensor:
        g = keyed.torch_gen(self.seed, index, keyed.STREAM_SYNTHETIC)
        return torch.randint(0, 256, (self.num_channels, *self.size), generator=g, dtype=torch.uint8)

    def sample(self, index: int, epoch: int, tf: SampleTransform) -> Sample:
        img = self.image(index)
        aug = tf.tensor_train(img, epoch, index) if tf.train else tf.tensor_eval(img)
        return Sample(aug, int(self.labels[index]), index)


class FileSource:
    """Image files with int labels, decoded with PIL (fast reduced-size JPEG decoding optional)."""

    leave_out_bad = False
    """True when read for an evaluation: a bad file is left out, not replaced (see the module)."""

    def __init__(self, paths: list[str], labels: list[int], fast_decode: bool = True):
        self.paths, self.labels, self.fast_decode = list(paths), list(labels), fast_decode
        self._bad: dict[int, str] = {}  # index -> reason, per process (worker)

    def __len__(self) -> int:
        return len(self.paths)

    def key(self, index: int) -> str:
        """What names sample ``index`` in messages (its file)."""
        return self.paths[index]

    def raw(self, index: int) -> tuple[bytes, str]:
        """The encoded image of sample ``index`` and its extension, as stored (``vitscale data convert``)."""
        from .remote import open_file

        with open_file(self.paths[index]) as f:
            return f.read(), os.path.splitext(self.paths[index])[1].lstrip(".").lower()

    def _load(self, j: int, slot: int, epoch: int, tf: SampleTransform) -> Augmented:
        """Decode file ``j`` with the augmentation randomness of dataset slot ``slot``."""
        return tf.decode(self.paths[j], epoch, slot, fast=self.fast_decode)

    def sample(self, index: int, epoch: int, tf: SampleTransform) -> Sample:
        if self.leave_out_bad:
            return self._sample_or_blank(index, epoch, tf)
        bad: list[tuple] = []
        n = len(self.paths)
        for k in range(min(n, MAX_REPLACEMENTS)):
            j = (index + k) % n
            if j in self._bad:
                bad.append((self.paths[j], self._bad[j]))
                continue
            try:
                # augmentation stays keyed by the requested slot, so a replacement is deterministic
                aug = self._load(j, index, epoch, tf)
            except BadImageError as e:
                self._bad[j] = str(e)
                bad.append((self.paths[j], str(e)))
                continue
            return Sample(aug, int(self.labels[j]), j, bad)
        raise RuntimeError(
            f"{len(bad)} consecutive undecodable images starting at {self.paths[index]!r}; is the data folder corrupt?"
        )

    def _sample_or_blank(self, index: int, epoch: int, tf: SampleTransform) -> Sample:
        try:
            return Sample(self._load(index, index, epoch, tf), int(self.labels[index]), index)
        except BadImageError as e:
            blank = torch.zeros((tf.num_channels, *tf.out_size(*tf.img_size)), dtype=torch.uint8)  # (C, H, W), never evaluated
            return Sample(Augmented(blank, (0.0, 0.0, 1.0, 1.0), False, [0] * 6), 0, -1,
                          [(self.paths[index], str(e), "left out")])  # fmt: skip
