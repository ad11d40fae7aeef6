"""The range checks of config fields, called from each group's ``__post_init__`` (beside the fields they
check) and by ``vitscale.run.checks`` for what needs the model, the layout or the data. Each failure is
one line naming the key, its value and what it means: a :class:`~vitscale.errors.ConfigError` (exit code
2) unless ``error`` says otherwise."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..errors import ConfigError

MAX_IMAGE_SIDE = 8192
"""Largest image side (pixels) a run may ask for: 8192 px is 262,144 patch-16 tokens, past what any
attention fits; a larger value is a typo (``data.img_size=22400``) that would fail allocating."""


def at_least(key: str, value, low, meaning: str, *, error: type[Exception] = ConfigError) -> None:
    if value is None or value < low:
        raise error(f"{key}={value} must be at least {low} ({meaning})")


def positive(key: str, value, meaning: str, *, error: type[Exception] = ConfigError) -> None:
    if not value > 0:
        raise error(f"{key}={value} must be greater than 0 ({meaning})")


def fraction(key: str, value: float, meaning: str, *, closed_high: bool = False, error: type[Exception] = ConfigError) -> None:
    ok = 0.0 <= value <= 1.0 if closed_high else 0.0 <= value < 1.0
    if not ok or not math.isfinite(value):
        raise error(f"{key}={value} must be in [0, 1{']' if closed_high else ')'} ({meaning})")


def image_side(key: str, value: int | None, *, error: type[Exception] = ConfigError) -> None:
    """An image side of 1 to :data:`MAX_IMAGE_SIDE` pixels (None: unset, nothing to check)."""
    if value is None:
        return
    if not 1 <= value <= MAX_IMAGE_SIDE:
        raise error(f"{key}={value} is not a usable image side: use 1 to {MAX_IMAGE_SIDE} pixels (e.g. 224)")


def nonfinite(tree: Any, prefix: str = "") -> tuple[str, float] | None:
    """(dotted key, value) of the first float at any depth of ``tree`` that is NaN or infinite."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = ((f"[{i}]", v) for i, v in enumerate(tree))
    else:
        return (prefix, tree) if isinstance(tree, float) and not math.isfinite(tree) else None
    for k, v in items:
        key = f"{prefix}{k}" if str(k).startswith("[") or not prefix else f"{prefix}.{k}"
        found = nonfinite(v, key)
        if found:
            return found
    return None


def not_finite_message(key: str, value: float) -> str:
    return f"{key.replace('model.overrides.', 'model.')}={value} is not a finite number: set a number, or leave the key out for its default"


def finite(group: Any, prefix: str) -> None:
    """No field of the dataclass ``group`` (its tuples included) is NaN or infinite: a NaN passes every
    ``<`` comparison (``train.grad_clip=.nan`` was "no clipping")."""
    found = nonfinite({f.name: getattr(group, f.name) for f in dataclasses.fields(group)}, prefix.rstrip("."))
    if found:
        raise ConfigError(not_finite_message(*found))


__all__ = ["MAX_IMAGE_SIDE", "at_least", "finite", "fraction", "image_side", "nonfinite", "not_finite_message", "positive"]
