"""One registry of model families and their variants; the trainer never branches on a model's name.

A family (vit, clip, volo, naflex) registers a :class:`FamilySpec`, as torchtitan's ``TrainSpec`` does: its
model class (which implements :class:`vitscale.models.contract.Model`), its variant table of frozen
config dataclasses, the task it trains with by default, and where its parallel plan is — its TP
plan and its blocks, in its ``parallelize.py``, imported on demand (so ``vitscale.models`` never
imports distributed or training code).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import importlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# Modules whose import registers a family. Order = order in `vitscale models`.
FAMILY_MODULES = ("vitscale.models.vit", "vitscale.models.clip", "vitscale.models.volo", "vitscale.models.naflex")
_FAMILIES: dict[str, FamilySpec] = {}
_loaded = False


@dataclass(frozen=True)
class FamilySpec:
    name: str
    """Family name: ``vit``, ``clip``, ``volo``, ``naflex``."""
    model_cls: type
    """``model_cls(cfg, device=None, dtype=None)`` builds the model (a :class:`~vitscale.models.contract.Model`);
    ``init_weights()`` initialises it."""
    variants: dict[str, Any]
    """Variant name -> frozen config dataclass."""
    parallel_plan: str
    """``"module:NAME"`` of the family's :class:`vitscale.distributed.parallelize.ParallelPlan` (its TP
    plan and its blocks), imported on first use."""
    task: str = "classification"
    """The task this family trains with by default (classification, contrastive, ...)."""


def register_family(spec: FamilySpec) -> None:
    clash = set(spec.variants) & {v for f in _FAMILIES.values() if f.name != spec.name for v in f.variants}
    if clash:
        raise ValueError(f"variant names already registered by another family: {sorted(clash)}")
    _FAMILIES[spec.name] = spec


def _load_families() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for mod in FAMILY_MODULES:
            importlib.import_module(mod)


def families() -> dict[str, FamilySpec]:
    _load_families()
    return dict(_FAMILIES)


def list_models(pattern: str | None = None, family: str | None = None) -> list[str]:
    """Registered variant names, optionally filtered by a glob ``pattern`` or a ``family``."""
    _load_families()
    names = [n for f in _FAMILIES.values() if family in (None, f.name) for n in f.variants]
    return [n for n in names if pattern is None or fnmatch.fnmatch(n, pattern)]


def get_family(name: str) -> FamilySpec:
    """The family of a variant name, or of a family name."""
    _load_families()
    if name in _FAMILIES:
        return _FAMILIES[name]
    for f in _FAMILIES.values():
        if name in f.variants:
            return f
    close = difflib.get_close_matches(name, list_models(), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else " See `vitscale models`."
    raise KeyError(f"unknown model {name!r}.{hint}")


def family_of(model_or_cfg: Any) -> FamilySpec:
    """The family of a model instance (also under FSDP / compile wrappers) or of a variant config."""
    _load_families()
    for f in _FAMILIES.values():
        if isinstance(model_or_cfg, f.model_cls) or any(type(v) is type(model_or_cfg) for v in f.variants.values()):
            return f
    raise KeyError(f"{type(model_or_cfg).__name__} belongs to no registered model family")


def get_model_config(name: str, **overrides: Any) -> Any:
    """The variant's config with ``overrides`` applied (nested dicts for nested configs)."""
    return replace_config(get_family(name).variants[name], overrides)


def replace_config(cfg: Any, overrides: dict[str, Any]) -> Any:
    """``dataclasses.replace`` that recurses into nested dataclass fields given as dicts and names
    the closest valid field when a key is misspelt."""
    if not overrides:
        return cfg
    valid = {f.name for f in dataclasses.fields(cfg)}
    changes = {}
    for key, value in overrides.items():
        if key not in valid:
            close = difflib.get_close_matches(key, sorted(valid), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{type(cfg).__name__} has no field {key!r}{hint}")
        current = getattr(cfg, key)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            value = replace_config(current, value)
        changes[key] = value
    return dataclasses.replace(cfg, **changes)


def create_model(
    name: str,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    init: bool = True,
    **overrides: Any,
) -> nn.Module:
    """Build a registered model, e.g. ``create_model("vit_b16", num_classes=10, img_h=384, img_w=384)``.

    On ``device="meta"`` nothing is allocated or initialised: parallelize the model, ``to_empty()``
    it, then call ``init_weights()``. Elsewhere the weights are initialised unless ``init=False``.
    """
    family = get_family(name)
    cfg = replace_config(family.variants[name], overrides)
    model = family.model_cls(cfg, device=device, dtype=dtype)
    if init and torch.device(device or "cpu").type != "meta":
        model.init_weights()
    return model


def parallel_plan(family: str | FamilySpec) -> Any:
    """The family's :class:`vitscale.distributed.parallelize.ParallelPlan` (imported on demand)."""
    spec = family if isinstance(family, FamilySpec) else get_family(family)
    module, name = spec.parallel_plan.split(":")
    return getattr(importlib.import_module(module), name)
