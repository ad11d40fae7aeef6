"""Use the weights you already have: timm and open_clip models <-> vitscale, exactly.

Every function asks the model family's spec for its state-dict adapter (``FamilySpec.adapters``; the
conversions live beside each family's model, ``vitscale/models/<family>/state_dict_adapter.py``): a
family without an adapter to the library is refused in one line ("no timm adapter for family X").

- ``from_timm(timm_model)`` -> the equivalent vitscale model carrying its weights.
- ``to_timm(model)`` -> a state dict that loads with ``strict=True`` into the timm model built by
  ``create_timm_model(model)`` (or from ``timm_kwargs(model)``).
- ``unsupported_timm_vits()`` -> ``{name: reason}`` for the installed timm's registered ViTs that
  vitscale's ViT cannot express; every other one converts exactly (``vitscale/models/vit/timm_registry.py``).
- ``load_timm_checkpoint(path, name)`` -> a vitscale model from a local timm ``.safetensors`` or
  ``.pth``/``.bin`` file (tensors only: never unpickles arbitrary objects; no network).
- open_clip: ``from_open_clip``, ``to_open_clip``, ``load_open_clip_checkpoint`` (``open_clip.py`` also has
  ``create_open_clip_model`` and ``open_clip_config``).
- Hugging Face ``transformers`` snapshot folders (``transformers.py``): ``load_transformers``,
  ``write_transformers_folder``, ``from_transformers``, ``create_transformers_model``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..models.registry import family_of, library_adapter


def from_timm(timm_model: nn.Module) -> nn.Module:
    """The vitscale model equivalent to a timm model (``VisionTransformer``: ViT; ``VOLO``: VOLO), with
    its weights: the adapter of the family that accepts it converts it (TypeError if none does)."""
    return library_adapter("timm", timm_model).from_library(timm_model)  # ValueError naming what cannot be expressed


def to_timm(model: nn.Module) -> dict[str, torch.Tensor]:
    """A state dict that loads with ``strict=True`` into ``create_timm_model(model)``
    (NotImplementedError, one line, for a family without a timm adapter)."""
    return family_of(model).adapter("timm").to_library(model)


def timm_kwargs(model_or_cfg: Any) -> dict[str, Any]:
    """Keyword arguments for the timm model that matches a vitscale model or its variant config (the
    family's timm adapter's ``library_kwargs``)."""
    cfg = model_or_cfg.cfg if isinstance(model_or_cfg, nn.Module) else model_or_cfg
    return family_of(cfg).adapter("timm").library_kwargs(cfg)


def create_timm_model(model: nn.Module, load_weights: bool = True, **timm_overrides: Any) -> nn.Module:
    """The timm model matching a vitscale model (with its weights unless ``load_weights=False``).

    ``timm_overrides`` go to the timm model's class, e.g. ``dynamic_img_size=True`` to feed a timm
    ``VisionTransformer`` other image sizes, as the vitscale model accepts them.
    """
    return family_of(model).adapter("timm").create(model, load_weights, **timm_overrides)


def _read_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    from .pretrained import read_pickle

    sd = read_pickle(path, str(path))  # the one bounded reader: tensors and containers only, views checked
    for key in ("state_dict", "model", "module", "state_dict_ema"):
        if isinstance(sd, dict) and key in sd and isinstance(sd[key], dict):
            sd = sd[key]
            break
    return {k.removeprefix("module."): v for k, v in sd.items() if isinstance(v, torch.Tensor)}


def load_timm_checkpoint(path: str | Path, name: str, **timm_overrides: Any) -> nn.Module:
    """A vitscale model from a timm checkpoint file on disk.

    ``name`` is the timm architecture (e.g. ``"vit_base_patch16_224"``); the timm model is built
    without pretrained weights (no network), filled from ``path`` (``strict=True``), converted. Its
    class count is the file's (the rows of ``head.weight``; none without one) unless ``num_classes``
    is given; weights that do not fit the architecture are a ``UserError`` naming the first tensor.
    """
    import timm

    from ..errors import UserError

    sd = _read_tensors(path)
    if "num_classes" not in timm_overrides and isinstance(sd.get("head.weight"), torch.Tensor):
        timm_overrides = {**timm_overrides, "num_classes": sd["head.weight"].shape[0]}
    elif "num_classes" not in timm_overrides and not any(k.startswith("head.") for k in sd):
        timm_overrides = {**timm_overrides, "num_classes": 0}  # a headless backbone
    tm = timm.create_model(name, pretrained=False, **timm_overrides)
    want = tm.state_dict()
    missing, unused = [k for k in want if k not in sd], [k for k in sd if k not in want]
    wrong = [k for k in want if k in sd and sd[k].shape != want[k].shape]
    if missing or unused or wrong:
        first = (f"{wrong[0]} is {'x'.join(map(str, sd[wrong[0]].shape))} in the file, "
                 f"{'x'.join(map(str, want[wrong[0]].shape))} in timm's {name}" if wrong
                 else f"{(missing or unused)[0]} {'missing from the file' if missing else 'not in timm ' + name}")  # fmt: skip
        given = ", ".join(f"{k}={v!r}" for k, v in timm_overrides.items())
        raise UserError(f"{path}: the weights do not fit timm's {name}({given}): {first} ({len(missing)} missing, "
                        f"{len(unused)} unused, {len(wrong)} of another shape); pass the timm arguments that built them "
                        f"(e.g. img_size=...), or use vitscale.create_model(..., pretrained=path), which adapts")  # fmt: skip
    tm.load_state_dict(sd, strict=True)
    return from_timm(tm)


def unsupported_timm_vits(names: list[str] | None = None) -> dict[str, str]:
    """``{name: reason}`` for the installed timm's ViTs that vitscale cannot express (seconds, no network).

    Every other registered timm ``VisionTransformer`` converts exactly both ways; ``names`` limits the
    check to those timm model names. ``docs/timm_vits.md`` lists them all for the timm it names.
    """
    from ..models.vit.timm_registry import unsupported_timm_vits as _f

    return _f(names)


def from_open_clip(model: nn.Module) -> nn.Module:
    from .open_clip import from_open_clip as _f

    return _f(model)


def to_open_clip(model: nn.Module) -> dict[str, torch.Tensor]:
    from .open_clip import to_open_clip as _f

    return _f(model)


def load_open_clip_checkpoint(path: str | Path, name: str) -> nn.Module:
    from .open_clip import load_open_clip_checkpoint as _f

    return _f(path, name)


__all__ = [
    "create_timm_model",
    "from_open_clip",
    "from_timm",
    "load_open_clip_checkpoint",
    "load_timm_checkpoint",
    "timm_kwargs",
    "to_open_clip",
    "to_timm",
    "unsupported_timm_vits",
]
