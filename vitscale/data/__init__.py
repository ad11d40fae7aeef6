"""The input pipeline: data formats, keyed transforms, resumable loaders.

``build_loaders(cfg.data, img_size=..., num_channels=..., seed=..., micro_batch_size=...,
eval_batch_size=..., rank=..., world_size=...) -> Loaders``; ``build_loader(cfg.data, split, ...)`` for
one split of any format; a format is a plug-in (``vitscale.data.formats``). See ``docs/data.md``.
"""

from ..config.data import IMAGENET_MEAN, IMAGENET_STD, DataConfig, data_config
from .build import Loaders, SplitLoader, build_loader, build_loaders
from .formats import DataFormat, Split, get_format, register_format

__all__ = ["DataConfig", "DataFormat", "Loaders", "Split", "SplitLoader", "build_loader", "build_loaders",
           "data_config", "get_format", "register_format", "IMAGENET_MEAN", "IMAGENET_STD"]
