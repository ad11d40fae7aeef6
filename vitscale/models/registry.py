"""One registry of model families and their variants; the trainer never branches on a model's name.

A family (vit, clip, volo, naflex) registers a :class:`~vitscale.models.spec.FamilySpec`, as torchtitan's
``TrainSpec`` does: its model class (which implements :class:`vitscale.models.contract.Model`), its
variant table of frozen config dataclasses, the task it trains with by default, its parallel plan,
state-dict adapters, tokenizer, FLOP count, memory model and serving graphs (``spec.py``). A family's
package is imported when the family is first asked for (``vitscale.registry.FAMILIES``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import Any

import torch
from torch import nn

from ..registry import FAMILIES, model_family
from .spec import FamilySpec, StateDictAdapter, replace_config


def register_family(spec: FamilySpec) -> None:
    clash = set(spec.variants) & {v for n, f in FAMILIES.entries.items() if n != spec.name for v in f.variants}
    if clash:
        raise ValueError(f"variant names already registered by another family: {sorted(clash)}")
    FAMILIES.register(spec.name, spec)


def families() -> dict[str, FamilySpec]:
    return dict(FAMILIES.items())


def list_models(pattern: str | None = None, family: str | None = None) -> list[str]:
    """Registered variant names, optionally filtered by a glob ``pattern`` or a ``family``."""
    names = [n for _, f in FAMILIES.items() if family in (None, f.name) for n in f.variants]
    return [n for n in names if pattern is None or fnmatch.fnmatch(n, pattern)]


def get_family(name: str) -> FamilySpec:
    """The family of a variant name, or of a family name; ConfigError naming the closest variant."""
    return model_family(name)


def family_of(model_or_cfg: Any) -> FamilySpec:
    """The family of a model instance (also under FSDP / compile wrappers) or of a variant config."""
    for _, f in FAMILIES.items():
        if isinstance(model_or_cfg, f.model_cls) or any(type(v) is type(model_or_cfg) for v in f.variants.values()):
            return f
    raise KeyError(f"{type(model_or_cfg).__name__} belongs to no registered model family")


def library_adapter(library: str, foreign: nn.Module) -> StateDictAdapter:
    """The state-dict adapter (of the registered family whose counterpart it is) that converts
    ``foreign``, a model of ``library`` (``timm``, ``open_clip``); TypeError naming the families
    with an adapter to that library when none accepts it."""
    known = []
    for _, f in FAMILIES.items():
        if library in f.adapters:
            adapter = f.adapter(library)
            if adapter.accepts(foreign):
                return adapter
            known.append(f"{f.name}")
    cls = type(foreign)
    raise TypeError(
        f"no vitscale family converts {library}'s {cls.__module__}.{cls.__name__} "
        f"(families with a {library} adapter: {', '.join(known) or 'none'})"
    )


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
    """A variant resolved once: its name, its family (registry entry), the overrides and the variant's
    config with them applied. A run resolves its model at the top of :func:`vitscale.run.assemble` and
    hands this record on (to its checks, its data, its model builder), so nothing asks the registry
    for the same config again."""

    name: str
    """The variant's name (``model.name``)."""
    family: FamilySpec
    """Its family."""
    overrides: dict[str, Any]
    """The overrides applied to the variant's config."""
    cfg: Any
    """The variant's config with :attr:`overrides` applied."""

    @property
    def fields(self) -> frozenset[str]:
        """The names of the config's fields (``num_classes``, ``img_h``, ...: a headless or
        fixed-size variant lacks some)."""
        return frozenset(f.name for f in dataclasses.fields(self.cfg))

    def with_overrides(self, overrides: dict[str, Any]) -> ResolvedModel:
        """The same variant with ``overrides`` instead of :attr:`overrides` (e.g. the data's class
        count filled in); the family is not looked up again."""
        return ResolvedModel(self.name, self.family, dict(overrides), replace_config(self.family.variants[self.name], overrides))

    def create(self, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None, init: bool = True) -> nn.Module:
        """The model of :attr:`cfg` (see :func:`create_model`)."""
        model = self.family.model_cls(self.cfg, device=device, dtype=dtype)
        if init and torch.device(device or "cpu").type != "meta":
            model.init_weights()
        return model


def resolve_model(name: str, **overrides: Any) -> ResolvedModel:
    """Variant ``name`` resolved with ``overrides``: ConfigError naming the closest variant for an unknown
    name, TypeError naming the closest field for a misspelt override."""
    family = get_family(name)
    return ResolvedModel(name, family, dict(overrides), replace_config(family.variants[name], overrides))


def get_model_config(name: str, **overrides: Any) -> Any:
    """The variant's config with ``overrides`` applied (nested dicts for nested configs)."""
    return resolve_model(name, **overrides).cfg


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
    return resolve_model(name, **overrides).create(device=device, dtype=dtype, init=init)


def parallel_plan(family: str | FamilySpec) -> Any:
    """The family's :class:`vitscale.distributed.parallelize.ParallelPlan` (imported on demand)."""
    return (family if isinstance(family, FamilySpec) else get_family(family)).plan()


def forward_flops(model: Any, img_size: int | tuple[int, int] | None = None, *, training: bool = False) -> int:
    """Forward FLOPs of one sample of ``model`` (a variant name, a variant config or a model) at
    ``img_size`` (None = its own): the one count behind ``vitscale models`` (``training=False``) and
    the TFLOP/s and MFU of training runs and ``vitscale bench`` (``training`` as the step runs). See
    :meth:`FamilySpec.forward_flops` for what is counted."""
    if isinstance(model, str):
        resolved = resolve_model(model)
        return resolved.family.forward_flops(resolved.cfg, img_size, training=training)
    cfg = model.cfg if isinstance(model, nn.Module) else model
    return family_of(model).forward_flops(cfg, img_size, training=training)
