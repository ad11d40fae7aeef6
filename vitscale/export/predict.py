"""A trained run in Python: ``vitscale.load_run(RUN_FOLDER)`` gives the model, its evaluation transform
and its class names — what prediction needs, without an export and without copying preprocessing
constants by hand (docs/using.md, "In Python").

The transform is the run's own evaluation preprocessing (:class:`vitscale.data.transforms.SampleTransform`
with ``train=False``, then ``data.mean`` / ``data.std``), as ``vitscale eval`` and ``vitscale export``
apply it; the class names are the run's data's (digits: ``zero`` … ``nine``; an image folder: its
folder names), read without the images.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn


class EvalTransform:
    """Image (a path, a PIL image, or a uint8 tensor ``(C, H, W)``) -> the normalised float tensor
    ``(C, H, W)`` the model takes: decode, RGB / L, the run's evaluation resize and crop, ``/255``,
    ``(x - mean) / std``."""

    def __init__(self, cfg: Any, image_size: tuple[int, int], channels: int, mean: list[float], std: list[float]):
        from vitscale.data.transforms import SampleTransform

        self.tf = SampleTransform(cfg.data, image_size, channels, cfg.train.seed, train=False)
        self.channels, self.image_size = channels, tuple(image_size)
        self.mean = torch.tensor(mean).view(channels, 1, 1)
        self.std = torch.tensor(std).view(channels, 1, 1)

    def __call__(self, image) -> torch.Tensor:
        from PIL import Image

        from vitscale.data.decode import convert_mode, open_image, pil_to_uint8_tensor

        if isinstance(image, (str, Path)):
            image = open_image(image)
        if isinstance(image, Image.Image):
            image = pil_to_uint8_tensor(convert_mode(image, self.channels))
        if not (isinstance(image, torch.Tensor) and image.dtype == torch.uint8 and image.ndim == 3):
            raise TypeError("expected an image path, a PIL image or a uint8 tensor (C, H, W)")
        crop = self.tf.tensor_eval(image.contiguous()).image  # (C, H, W) uint8
        return (crop.float() / 255.0 - self.mean) / self.std


@dataclass
class LoadedRun:
    """What :func:`load_run` returns."""

    model: nn.Module
    """The model in eval mode, fp32, on the CPU, with the run's final weights (``model_ema`` with ``ema``)."""
    transform: EvalTransform
    """The run's evaluation preprocessing: an image -> the normalised tensor ``(C, H, W)``."""
    class_names: list[str] | None
    """The classifier's class names, in output order (None when the run's data cannot say)."""
    config: Any
    """The run's :class:`vitscale.config.Config` (``config.yaml``)."""

    def predict(self, images, k: int = 5) -> list[list[tuple[str, float]]]:
        """The top-``k`` (class name, probability) of each image (paths, PIL images or uint8 tensors)."""
        x = torch.stack([self.transform(im) for im in images])  # (B, C, H, W)
        with torch.no_grad():
            probs = self.model(x).float().softmax(-1)
        top = probs.topk(min(k, probs.shape[-1]), dim=-1)
        names = self.class_names or [str(i) for i in range(probs.shape[-1])]
        return [[(names[int(i)], float(p)) for p, i in zip(ps, idx)] for ps, idx in zip(top.values, top.indices)]


def load_run(folder: str | Path, *, ema: bool = False, allow_shell_from_config: bool = False) -> LoadedRun:
    """The trained model of a run folder (``model.safetensors``, else its newest checkpoint; with
    ``ema``: ``model_ema.safetensors``), its evaluation transform and class names.
    ``allow_shell_from_config``: accept a ``config.yaml`` whose ``pipe:`` data paths would run shell
    commands (refused otherwise: ``vitscale.config.load_config``)."""
    from .source import load_source
    from .spec import class_names, preprocess_spec

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such run folder")
    source = load_source(folder, ema=ema, allow_shell=allow_shell_from_config)
    pre = preprocess_spec(source)
    transform = EvalTransform(source.cfg, tuple(pre["image_size"]), pre["channels"], pre["mean"], pre["std"])
    names = class_names(source, source.model.num_classes) if source.model.num_classes else None
    return LoadedRun(source.model, transform, names, source.cfg)


__all__ = ["EvalTransform", "LoadedRun", "load_run"]
