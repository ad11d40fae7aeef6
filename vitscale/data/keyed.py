"""Keyed randomness: every random draw of the input pipeline comes from a key, never from shared state.

The epoch permutation is keyed by ``(seed, epoch)`` and each sample's augmentation by
``(seed, epoch, index)`` (``index`` = the sample's position in the dataset), so the batches are the
same with any number of DataLoader workers or ranks, and after a resume.
"""

from __future__ import annotations

import random

import torch

_MASK64 = (1 << 64) - 1

# Stream tags keep independent draws for the same (seed, epoch, index) apart: every tag of the project's
# index-keyed draws is allotted here (the tasks' too), and :data:`STREAMS` checks that none is used twice.
STREAM_PERM = 1
STREAM_SAMPLE = 2
STREAM_AUGMENT = 3
STREAM_ERASE = 4
STREAM_MIXUP = 5
STREAM_SYNTHETIC = 6
STREAM_SPLIT = 7
STREAM_SIZE = 8
STREAM_INTERPOLATION = 9
STREAM_MIX_TOKEN = 11  # token labeling's MixToken boxes (vitscale.tasks.token_labeling)
STREAM_MAE_MASK = 12  # MAE's random masks (vitscale.tasks.mae)
STREAM_MAE_INIT = 13  # MAE's decoder initialisation
STREAM_VIEW_CROP = 14  # a task's views: each crop's box and augmentation (vitscale.data.views)
STREAM_VIEW_MASK = 15  # a task's views: the block masks of its crops
STREAM_DINO_INIT = 16  # DINO's heads' initialisation (vitscale.tasks.dino)
STREAM_VIEW_PAIR = 17  # a task's views: which of its mixture's crop sizes an optimizer step cuts (vitscale.data.views)

STREAMS = {k: v for k, v in globals().items() if k.startswith("STREAM_")}
"""Every stream tag by name; a tag allotted twice fails the import."""
if len(set(STREAMS.values())) != len(STREAMS):
    raise RuntimeError(f"vitscale.data.keyed: a stream tag is allotted twice: {STREAMS}")


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def key(*parts: int) -> int:
    """Mix integers into one 63-bit seed (stable across processes and Python versions)."""
    h = 0x6A09E667F3BCC908
    for p in parts:
        h = _splitmix64(h ^ (int(p) & _MASK64))
    return h & ((1 << 63) - 1)


def py_rng(*parts: int) -> random.Random:
    """A ``random.Random`` keyed by ``parts``."""
    return random.Random(key(*parts))


def torch_gen(*parts: int) -> torch.Generator:
    """A CPU ``torch.Generator`` keyed by ``parts``."""
    return torch.Generator().manual_seed(key(*parts))


def epoch_permutation(n: int, seed: int, epoch: int, shuffle: bool = True) -> torch.Tensor:
    """The order of the ``n`` samples in ``epoch``: a permutation keyed by (seed, epoch)."""
    if not shuffle:
        return torch.arange(n)
    return torch.randperm(n, generator=torch_gen(seed, epoch, STREAM_PERM))
