"""The map-style dataset the DataLoader workers run, and the batch collation."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from .naflex import pad_batch, patchify
from .transforms import SampleTransform
from .views import ViewSample, collate_views


class KeyedDataset(Dataset):
    """``dataset[(epoch, index)]`` -> one transformed sample dict (uint8 image). Index -1 is a padding
    item (:class:`vitscale.data.sampler.EvalShardSampler`): sample 0, returned with index -1.
    ``dataset[(epoch, index, size)]``: at that step's size (an image side, or a NaFlex sequence
    length: :class:`vitscale.data.sizesampler.SizedBatchSampler`; None: the transform's own), and
    ``dataset[(epoch, index, size, repeat)]``: repeat ``repeat`` of the image, augmented with its own
    keys (``data.repeated_aug``: :class:`vitscale.data.sampler.ShardedBatchSampler`,
    :meth:`SampleTransform.repeated`); ``dataset[(epoch, index, None, repeat, choice)]``: choice
    ``choice`` of a mixture of views (:meth:`vitscale.data.views.ViewTransform.variant`). A NaFlex transform's sample holds
    its ``patches`` ``(N_i, P*P*C)`` uint8, its ``grid`` and the ``seq_len`` its batch pads to."""

    def __init__(self, source, transform: SampleTransform):
        self.source, self.transform = source, transform

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, item):
        epoch, index, *rest = item if isinstance(item, tuple) else (0, item)
        size = rest[0] if rest else None
        tf = self.transform.at(size) if size else self.transform
        if len(rest) > 1 and rest[1]:
            tf = tf.repeated(rest[1])
        if len(rest) > 2:  # a mixture of views: the step's choice (vitscale.data.sampler.ShardedBatchSampler)
            tf = tf.variant(rest[2])
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
    """Stack samples; ``bad`` becomes the list of (path, reason) of files replaced in the batch. A
    batch of views (:class:`~vitscale.data.views.ViewSample`) has their keys instead of ``image``.

    Extra fields of plugin formats are stacked when they are same-shape tensors, made tensors when
    they are numbers, and kept as lists otherwise.
    """
    extra = {k: _collate_extra([s[k] for s in samples]) for k in samples[0] if k not in _KNOWN}
    first = samples[0]["image"]
    image: dict | torch.Tensor | None
    if isinstance(first, ViewSample):  # a task's views (vitscale.data.views): their own keys, no "image"
        extra |= collate_views([s["image"] for s in samples])
        image = None
    elif isinstance(first, dict):  # NaFlex: patches, patch_coord, patch_valid padded to the batch's seq_len
        grids = [s["image"]["grid"] for s in samples]
        image = pad_batch([s["image"]["patches"] for s in samples], grids, first["seq_len"])
        extra["grid"] = torch.tensor(grids, dtype=torch.long)  # (B, 2) each image's patch grid
    else:
        image = torch.stack([s["image"] for s in samples])  # (B, C, H, W) uint8
    return extra | ({"image": image} if image is not None else {}) | {
        "label": torch.tensor([s["label"] for s in samples], dtype=torch.long),
        "index": torch.tensor([s["index"] for s in samples], dtype=torch.long),
        "crop": torch.tensor([s["crop"] for s in samples], dtype=torch.float32),  # (B, 4)
        "flip": torch.tensor([s["flip"] for s in samples], dtype=torch.bool),
        "erase": torch.tensor([s["erase"] for s in samples], dtype=torch.long),  # (B, 6)
        "bad": [b for s in samples for b in s["bad"]],
    }


# A tensor a DataLoader worker sends to the main process travels as a shared-memory file whose
# descriptor crosses a socket (torch.multiprocessing's default ``file_descriptor`` sharing strategy,
# torch/multiprocessing/reductions.py ``rebuild_storage_fd``; docs: pytorch.org/docs/stable/multiprocessing.html):
# a connection per tensor, about half a millisecond of the main process's time each, whatever its
# size. A batch's small per-sample fields (label, index, crop, flip, erase, a NaFlex grid, caption
# tokens) go by value instead, as numpy arrays pickled with the batch, and become tensors again in
# the main process (:func:`from_transfer`); the image batch keeps the shared memory.
BY_VALUE_MAX_BYTES = 64 * 1024


def for_transfer(batch: dict) -> dict:
    """In a DataLoader worker: ``batch`` with its small tensors as numpy arrays (one level of
    nested dicts too); elsewhere ``batch`` unchanged."""
    if get_worker_info() is None:
        return batch

    def small(v):
        if isinstance(v, torch.Tensor) and v.nbytes <= BY_VALUE_MAX_BYTES:
            return v.numpy()
        return {k: small(x) for k, x in v.items()} if isinstance(v, dict) else v

    return {k: small(v) for k, v in batch.items()}


def from_transfer(batch: dict) -> dict:
    """In the main process: the numpy arrays of :func:`for_transfer` as tensors again (no copy)."""

    def tensor(v):
        if isinstance(v, np.ndarray):
            return torch.from_numpy(v)
        return {k: tensor(x) for k, x in v.items()} if isinstance(v, dict) else v

    return {k: tensor(v) for k, v in batch.items()}


def worker_collate(samples: list[dict]) -> dict:
    """:func:`collate`, its small tensors sent by value when it runs in a worker (:func:`for_transfer`)."""
    return for_transfer(collate(samples))
