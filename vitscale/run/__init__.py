"""From a config to a running job: :func:`assemble` resolves a config once into a :class:`Run`
(device, layout, data, model); :func:`build_model` builds a model on the meta device, parallelizes,
materialises and initialises it."""

from .assemble import Run, assemble, head_classes, model_overrides
from .build import build_model

__all__ = ["Run", "assemble", "build_model", "head_classes", "model_overrides"]
