"""The input pipeline: datasets (digits, image folders, synthetic), keyed transforms, resumable loaders.

``build_loaders(cfg.data, img_size=..., num_channels=..., seed=..., micro_batch_size=...,
eval_batch_size=..., rank=..., world_size=...) -> Loaders``; see ``docs/data.md``.
"""

from .build import Loaders, build_loaders, register_format
from .config import IMAGENET_MEAN, IMAGENET_STD, DataConfig

__all__ = ["DataConfig", "Loaders", "build_loaders", "register_format", "IMAGENET_MEAN", "IMAGENET_STD"]
