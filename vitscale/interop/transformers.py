"""Hugging Face ``transformers`` snapshot folders <-> vitscale models, both ways.

A snapshot folder is ``config.json`` (its ``model_type``: ``vit``, ``vit_mae``, ``dinov2``,
``dinov2_with_registers``, ``dinov3_vit``, ``clip_vision_model`` / ``clip``, ``siglip_vision_model`` /
``siglip``) beside ``model.safetensors`` (or ``pytorch_model.bin``, read with
``torch.load(weights_only=True)``). ``checkpoint.init_from``, ``distill.teacher`` and
``vitscale.create_model(name, pretrained=folder)`` read one with no flag: the folder's ``config.json``
tells transformers' from timm's (``model_type``; timm's names an ``architecture``), and its settings
are compared with the model's (:func:`check_config`). The conversions are the ViT family's
(``vitscale/models/vit/transformers_adapter.py``).

- ``load_transformers(folder)`` -> the vitscale ViT the folder describes, with its weights.
- ``write_transformers_folder(model, out)`` -> ``out/config.json`` + ``out/model.safetensors``, a folder
  ``transformers.AutoModel.from_pretrained(out)`` loads (``vitscale convert ... --to transformers``).
- ``create_transformers_model(model)`` -> the transformers model itself (needs ``transformers``).

Nothing here imports ``transformers`` but :func:`create_transformers_model` and :func:`from_transformers`
(``pip install 'vitscale[hf]'``).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import UserError
from ..models.vit.transformers_adapter import (
    ARCHITECTURES,
    MODEL_TYPES,
    config_differences,
    config_from_transformers,
    state_dict_from_transformers,
    state_dict_to_transformers,
    transformers_config,
)

CONFIG = "config.json"
WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def is_transformers_config(cfg: Any) -> bool:
    """Whether a ``config.json`` (parsed) is a transformers model's: it names a ``model_type``
    (timm's Hub configs name an ``architecture`` and no model type)."""
    return isinstance(cfg, Mapping) and isinstance(cfg.get("model_type"), str)


def check_config(hf: Mapping[str, Any], cfg: Any, where: str, key_prefix: str = "model.overrides.") -> None:
    """One-line :class:`UserError` when the folder's ``config.json`` describes a network other than
    ``cfg`` (a ViT config): the first setting that differs, and what to set; or what vitscale's ViT
    cannot express of it."""
    try:
        diffs = config_differences(hf, cfg)
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{where}: its config.json describes a model vitscale's ViT cannot express: {e}") from None
    if diffs:
        name, value, have = diffs[0]
        more = f" (and {len(diffs) - 1} more: {', '.join(d[0] for d in diffs[1:4])})" if len(diffs) > 1 else ""
        raise UserError(f"{where}: its config.json gives {name}={value!r}, the model has {name}={have!r}{more}: "
                        f"set {key_prefix}{name}={json.dumps(value)}")  # fmt: skip


def read_config(folder: str | os.PathLike) -> dict[str, Any]:
    """A snapshot folder's ``config.json`` (a transformers one; UserError otherwise)."""
    from .pretrained import _read_json

    path = Path(folder) / CONFIG
    if not path.is_file():
        raise UserError(f"{folder}: no {CONFIG} (a transformers snapshot folder holds config.json and model.safetensors)")
    cfg = _read_json(path, str(folder))
    if not is_transformers_config(cfg):
        raise UserError(f"{path}: no model_type: not a transformers config")
    return cfg


def _weights_file(folder: Path) -> Path:
    found = next((folder / f for f in WEIGHTS if (folder / f).is_file()), None)
    if found is None:
        raise UserError(f"{folder}: no {' or '.join(WEIGHTS)} beside its config.json")
    return found


def load_transformers(folder: str | os.PathLike, **overrides: Any) -> nn.Module:
    """The vitscale ViT a transformers snapshot folder describes (``config.json``), carrying its
    weights (``overrides``: ViTConfig fields changed on top, e.g. ``num_classes``). One-line
    :class:`UserError` for a model vitscale cannot express or weights that do not fit the config."""
    import dataclasses

    from ..checkpoint import load_model_weights
    from ..models.registry import get_family
    from ..models.vit import VisionTransformer
    from .pretrained import read_source

    folder = Path(folder)
    hf = read_config(folder)
    where = str(folder)
    if hf.get("model_type") == "clip" and isinstance(hf.get("text_config"), Mapping):  # CLIPModel: both towers
        return _load_clip(folder, hf, overrides)
    src = read_source(folder, get_family("vit"), "transformers", setting="pretrained", format_key="pretrained_format")
    head = src.tensors.get("classifier.weight")
    try:
        cfg = config_from_transformers(hf, num_classes=int(head.shape[0]) if head is not None else 0)
        cfg = dataclasses.replace(cfg, pre_logits=any(k.endswith("pooler.dense.weight") for k in src.tensors), **overrides)
        sd = state_dict_from_transformers(src.tensors, cfg)
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{where}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    model = VisionTransformer(cfg)
    load_model_weights(model, sd, strict=True, source=where)
    return model.eval()


def _load_clip(folder: Path, hf: Mapping[str, Any], overrides: dict[str, Any]) -> nn.Module:
    from ..checkpoint import load_model_weights
    from ..models.clip import CLIP
    from ..models.clip.transformers_adapter import config_from_transformers as clip_config
    from ..models.clip.transformers_adapter import state_dict_from_transformers as clip_from
    from ..models.registry import get_family
    from ..models.spec import replace_config
    from .pretrained import read_source

    src = read_source(folder, get_family("clip"), "transformers", setting="pretrained", format_key="pretrained_format")
    try:
        cfg = replace_config(clip_config(hf), overrides)
        sd = clip_from(src.tensors, cfg)
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{folder}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    model = CLIP(cfg)
    load_model_weights(model, sd, strict=True, source=str(folder))
    return model.eval()


def write_transformers_folder(model: nn.Module, out: str | os.PathLike, model_type: str | None = None,
                              meta: Mapping[str, str] | None = None) -> Path:  # fmt: skip
    """``model`` (a vitscale ViT) as a transformers snapshot folder ``out`` (``config.json`` and
    ``model.safetensors``); ``model_type``: None = the one that expresses the model. Checked before
    anything is written: a model transformers' cannot express is a one-line :class:`UserError`."""
    from ..checkpoint.weights import write_weights

    cfg = getattr(model, "cfg", None)
    if type(cfg).__name__ not in ("ViTConfig", "CLIPConfig"):
        raise UserError(f"--to transformers converts ViT and CLIP models (a {type(model).__name__} is neither)")
    try:
        if type(cfg).__name__ == "CLIPConfig":  # CLIPModel
            from ..models.clip import transformers_adapter as clip_hf

            hf, sd = clip_hf.transformers_config(cfg), clip_hf.state_dict_to_transformers(model.state_dict(), cfg)
        else:
            hf = transformers_config(cfg, model_type)
            sd = state_dict_to_transformers(model.state_dict(), cfg, hf["model_type"])
    except ValueError as e:
        raise UserError(str(e)) from None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().contiguous() for k, v in sd.items()}
    write_weights(sd, out / WEIGHTS[0], {"format": "pt", "library": "transformers", **(meta or {})})
    (out / CONFIG).write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    return out


def write_transformers_file(weights: str | os.PathLike, out: str | os.PathLike) -> Path:
    """A vitscale ``.safetensors`` file (its header names its model, as ``vitscale convert`` and
    ``vitscale train`` write them) as the transformers snapshot folder ``out``: ``vitscale convert ...
    --to transformers``."""
    from ..export.source import load_source

    source = load_source(weights)  # the model the header names, its weights loaded strictly
    return write_transformers_folder(source.model, out, meta={"converted_from": source.name})


def create_transformers_model(model: nn.Module, load_weights: bool = True, **config_overrides: Any) -> nn.Module:
    """The transformers model matching a vitscale ViT (with its weights unless ``load_weights=False``),
    built through a snapshot folder written by :func:`write_transformers_folder`."""
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        write_transformers_folder(model, tmp)
        hf = json.loads((Path(tmp) / CONFIG).read_text())
        hf.update(config_overrides)
        (Path(tmp) / CONFIG).write_text(json.dumps(hf))
        cls = getattr(transformers, hf["architectures"][0])
        if not load_weights:
            return cls(transformers.AutoConfig.from_pretrained(tmp))
        return cls.from_pretrained(tmp).eval()


def from_transformers(hf_model: nn.Module) -> nn.Module:
    """The vitscale ViT equivalent to a transformers model (``ViTModel``, ``Dinov2Model``, ...), with its
    weights (through a snapshot folder its ``save_pretrained`` writes)."""
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(tmp)
        return load_transformers(tmp)


def to_transformers(model: nn.Module) -> dict[str, torch.Tensor]:
    """A vitscale ViT's state dict in the names and layouts of a transformers snapshot's ``model.safetensors``."""
    return state_dict_to_transformers(model.state_dict(), model.cfg)


__all__ = [
    "ARCHITECTURES", "MODEL_TYPES", "check_config", "create_transformers_model", "from_transformers",
    "is_transformers_config", "load_transformers", "read_config", "to_transformers", "write_transformers_file",
    "write_transformers_folder",
]  # fmt: skip
