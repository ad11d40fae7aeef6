"""The range checks of config fields, called from each group's ``__post_init__`` (beside the fields they
check) and by ``vitscale.run.checks`` for what needs the model, the layout or the data. Each failure is
one line naming the key, its value and what it means: a :class:`~vitscale.errors.ConfigError` (exit code
2) unless ``error`` says otherwise.

**Every number has a range.** Each config group (a dataclass: the groups of ``Config``, every data
format's, task's and evaluator's) declares the bounds of each of its int / float fields beside them, in
a class attribute ``RANGES``::

    @dataclass
    class MyGroup:
        RANGES: ClassVar[dict[str, Bound]] = {"steps": (0, 10**9), "ratio": (0.0, 1.0)}
        \"\"\"The bounds of its number fields.\"\"\"
        steps: int = 0
        ratio: float = 0.5

        def __post_init__(self):
            check_ranges(self, "my")

A bound is ``(low, high)``, both inclusive (``math.inf`` where a value has no upper bound, said on
purpose); a tuple field's bound holds for each element, and ``None`` (unset) always passes. Sizes,
counts and lengths get a finite upper bound (past it a typo allocates the machine away). Mixins'
tables merge along the class's MRO, so a format's class inherits its field groups'.
:func:`check_ranges` enforces the table; ``tests/unit/test_config_ranges.py`` walks the whole schema
and fails, naming the line to add, on a number field without a bound."""

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


Bound = tuple
"""``(low, high)``: the inclusive bounds of a number field (of each element of a tuple field)."""

COUNT_MAX = 1 << 30
"""Upper bound of a count that only has to be finite (steps, samples): past 10^9 a value is a typo."""


def declared_ranges(cls: type) -> dict[str, Bound]:
    """``RANGES`` of ``cls`` merged along its MRO (a subclass's or a later mixin's entry wins)."""
    out: dict[str, Bound] = {}
    for k in reversed(cls.__mro__):
        out.update(vars(k).get("RANGES", {}))
    return out


def _numbers(name: str, value: Any):
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, (int, float)):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _numbers(f"{name}[{i}]", v)


def _shown(x) -> str:
    return "inf" if x == math.inf else "-inf" if x == -math.inf else f"{x:,}" if isinstance(x, int) and abs(x) >= 10_000 else str(x)


def check_ranges(group: Any, prefix: str | None) -> None:
    """Every declared bound of ``group`` holds (:func:`declared_ranges`): one line naming the key
    (``prefix.field``; ``prefix`` None: the field alone in a ValueError, which the config loader
    prefixes with the entry's path, as for ``evals:`` entries)."""
    for name, bound in declared_ranges(type(group)).items():
        low, high = bound[0], bound[1]
        for key, v in _numbers(name, getattr(group, name, None)):
            if not (low <= v <= high):
                where = f"{prefix}.{key}" if prefix else key
                text = f"{where}={v} is out of range: use {_shown(low)} to {_shown(high)}"
                raise ConfigError(text) if prefix else ValueError(text)


def number_fields(cls: type) -> list[str]:
    """The fields of the dataclass ``cls`` that hold an int or a float (alone, optional, or in a tuple /
    list), bool excluded."""
    import typing

    def numeric(t) -> bool:
        if t in (int, float):
            return True
        return any(numeric(a) for a in typing.get_args(t) if a is not type(None) and a is not Ellipsis)

    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if numeric(hints[f.name])]


def undeclared(cls: type) -> list[str]:
    """The number fields of ``cls`` without a bound in its ``RANGES`` (:func:`number_fields`)."""
    have = declared_ranges(cls)
    return [name for name in number_fields(cls) if name not in have]


__all__ = ["COUNT_MAX", "Bound", "check_ranges", "declared_ranges", "number_fields", "undeclared", "MAX_IMAGE_SIDE", "at_least", "finite", "fraction", "image_side", "nonfinite", "not_finite_message", "positive"]
