"""The range checks of a setting, one line each: the key, its value, the range and what the setting
means. The run's up-front checks (:mod:`vitscale.run.checks`) and the config groups' own
``__post_init__`` (a task's ``distill``, ``clip``, ``token_label``, ``teacher``) raise them alike.
Beside :mod:`vitscale.errors`, importing only it: any layer may use it.
"""

from __future__ import annotations

import math

from .errors import CheckError

MAX_IMAGE_SIDE = 8192
"""Largest image side (pixels) a run may ask for: 8192 px is 262,144 patch-16 tokens, past what any
attention fits; a larger value is a typo (``data.img_size=22400``) that would fail allocating."""


def at_least(key: str, value, low, meaning: str) -> None:
    if value is None or value < low:
        raise CheckError(f"{key}={value} must be at least {low} ({meaning})")


def fraction(key: str, value: float, meaning: str, *, closed_high: bool = False) -> None:
    ok = 0.0 <= value <= 1.0 if closed_high else 0.0 <= value < 1.0
    if not ok or not math.isfinite(value):
        raise CheckError(f"{key}={value} must be in [0, 1{']' if closed_high else ')'} ({meaning})")


def positive(key: str, value, meaning: str) -> None:
    if not value > 0:
        raise CheckError(f"{key}={value} must be greater than 0 ({meaning})")


def image_side(key: str, value: int | None) -> None:
    """An image side of 1 to :data:`MAX_IMAGE_SIDE` pixels (None: unset, nothing to check)."""
    if value is None:
        return
    if not 1 <= value <= MAX_IMAGE_SIDE:
        raise CheckError(f"{key}={value} is not a usable image side: use 1 to {MAX_IMAGE_SIDE} pixels (e.g. 224)")


__all__ = ["MAX_IMAGE_SIDE", "at_least", "fraction", "image_side", "positive"]
