"""timm models on the meta device and the comparison of two module trees: what the conversions
from timm (``timm_registry.py`` for timm's ``VisionTransformer``, ``timm_eva.py`` for its ``Eva``) build
their reference with and hold a model against, so that a conversion is exact or an error."""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

# Attributes that describe how a model was initialised or runs, not what it computes.
_NOT_ARCHITECTURE = {"training", "weight_init_mode", "fix_init", "grad_checkpointing", "fused_attn", "inplace"}
_SCALARS = (bool, int, float, str, tuple, list, type(None))


def build_meta(fn: Any, **kwargs: Any) -> nn.Module:
    """Build a timm model on the meta device without running its weight init (fast: no values).

    ``device="meta"`` where timm takes it (1.0.2x), else under ``torch.device("meta")`` (slower: every
    torch call goes through the device mode); ``weight_init="skip"`` where timm knows it.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for extra in ({"device": "meta", "weight_init": "skip"}, {"device": "meta"}, {}):
            try:
                with torch.device("meta") if "device" not in extra else nullcontext():
                    return fn(**kwargs, **extra)
            except (AssertionError, TypeError, ValueError):  # an older timm without these options
                if not extra:
                    raise
    raise AssertionError("unreachable")


def _layout(model: nn.Module) -> list[tuple[str, str, tuple]]:
    """(path, type, settings) of every module: scalar attributes and parameter / buffer shapes."""
    out = []
    for path, m in model.named_modules():
        attrs = [(k, v) for k, v in vars(m).items() if not k.startswith("_") and k not in _NOT_ARCHITECTURE and isinstance(v, _SCALARS)]
        attrs += [(k, tuple(p.shape)) for k, p in m.named_parameters(recurse=False)]
        attrs += [(k, tuple(b.shape)) for k, b in m.named_buffers(recurse=False)]
        out.append((path, type(m).__name__, tuple(sorted(attrs, key=lambda kv: kv[0]))))
    return out


def layout_differences(tm: nn.Module, ref: nn.Module, limit: int = 3) -> list[str]:
    """Where the module trees of ``tm`` and ``ref`` (the timm model vitscale's equivalent would build)
    differ: module types and paths, scalar settings, parameter and buffer shapes (empty: nowhere)."""
    a, b = _layout(tm), _layout(ref)
    diffs = []
    for (pa, ta, sa), (pb, tb, sb) in zip(a, b):
        if pa != pb or ta != tb:
            diffs.append(f"{pa or 'model'}: {ta} where vitscale's equivalent has {pb or 'model'}: {tb}")
        elif sa != sb:
            da, db = dict(sa), dict(sb)
            keys = [k for k in sorted(set(da) | set(db)) if da.get(k, "-") != db.get(k, "-")]
            diffs.append(f"{pa or 'model'}: " + ", ".join(f"{k}={da.get(k, '-')!r} (vitscale: {db.get(k, '-')!r})" for k in keys))
        if len(diffs) >= limit:
            return diffs
    if len(a) != len(b) and len(diffs) < limit:
        diffs.append(f"{len(a)} modules where vitscale's equivalent has {len(b)}")
    return diffs


__all__ = ["build_meta", "layout_differences"]
