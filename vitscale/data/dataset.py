"""The map-style dataset the DataLoader workers run, and the batch collation."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from .naflex import pad_batch, patchify
from .transforms import SampleTransform


class KeyedDataset(Dataset):
    """``dataset[(epoch, index)]`` -> one transformed sample dict (uint8 image). Index -1 is a padding
    item (:class:`vitscale.data.sampler.EvalShardSampler`): sample 0, returned with index -1.
    ``dataset[(epoch, index, size)]``: at that step's size (an image side, or a NaFlex sequence
    length: :class:`vitscale.data.sizesampler.SizedBatchSampler`). A NaFlex transform's sample holds
    its ``patches`` ``(N_i, P*P*C)`` uint8, its ``grid`` and the ``seq_len`` its batch pads to."""

    def __init__(self, source, transform: SampleTransform):
        self.source, self.transform = source, transform

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, item):
        epoch, index, *size = item if isinstance(item, tuple) else (0, item)
        tf = self.transform.at(size[0]) if size else self.transform
        pad = int(index) < 0  # an evaluation sampler's padding item: sample 0, marked by index -1
        s = self.source.sample(0 if pad else int(index), int(epoch), tf)
        image: dict | torch.Tensor = s.aug.image
        if tf.seq_len:  # NaFlex: the patches of the image, padded to seq_len when batched
            gh, gw = image.shape[-2] // tf.patch, image.shape[-1] // tf.patch
            image = {"patches": patchify(image, tf.patch), "grid": (gh, gw), "seq_len": tf.seq_len}
        return s.extra | {
            "image": image,
            "label": s.label,
            "index": -1 if pad else s.index,
            "crop": s.aug.crop,
            "flip": s.aug.flip,
            "erase": s.aug.erase,
            "bad": s.bad,
        }


_KNOWN = ("image", "label", "index", "crop", "flip", "erase", "bad")


def _collate_extra(values: list):
    if all(isinstance(v, torch.Tensor) for v in values) and len({tuple(v.shape) for v in values}) == 1:
        return torch.stack(values)
    if all(isinstance(v, (bool, int)) for v in values):
        return torch.tensor(values)
    if all(isinstance(v, (bool, int, float)) for v in values):
        return torch.tensor(values, dtype=torch.float32)
    return list(values)


def collate(samples: list[dict]) -> dict:
    """Stack samples; ``bad`` becomes the list of (path, reason) of files replaced in the batch.

    Extra fields of plugin formats are stacked when they are same-shape tensors, made tensors when
    they are numbers, and kept as lists otherwise.
    """
    extra = {k: _collate_extra([s[k] for s in samples]) for k in samples[0] if k not in _KNOWN}
    first = samples[0]["image"]
    if isinstance(first, dict):  # NaFlex: patches, patch_coord, patch_valid padded to the batch's seq_len
        grids = [s["image"]["grid"] for s in samples]
        image = pad_batch([s["image"]["patches"] for s in samples], grids, first["seq_len"])
        extra["grid"] = torch.tensor(grids, dtype=torch.long)  # (B, 2) each image's patch grid
    else:
        image = torch.stack([s["image"] for s in samples])  # (B, C, H, W) uint8
    return extra | {
        "image": image,
        "label": torch.tensor([s["label"] for s in samples], dtype=torch.long),
        "index": torch.tensor([s["index"] for s in samples], dtype=torch.long),
        "crop": torch.tensor([s["crop"] for s in samples], dtype=torch.float32),  # (B, 4)
        "flip": torch.tensor([s["flip"] for s in samples], dtype=torch.bool),
        "erase": torch.tensor([s["erase"] for s in samples], dtype=torch.long),  # (B, 6)
        "bad": [b for s in samples for b in s["bad"]],
    }
