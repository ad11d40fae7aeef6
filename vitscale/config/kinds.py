"""Groups typed by their kind: a base class (``DataConfig``, ``EvaluatorConfig``) names its kind field
(``KIND``: ``format``, ``kind``) and lists its kinds' classes (``kinds()``); a key one kind's class lacks
is named with the kinds whose classes have it."""

from __future__ import annotations

import dataclasses
from typing import Any


def kind_owners(base: type, key: str) -> list[tuple[str, Any]]:
    """``(kind, default)`` of every kind of ``base`` whose class has the field ``key``."""
    out = []
    for kind, cls in base.kinds():
        f = next((f for f in dataclasses.fields(cls) if f.name == key), None)
        if f is not None:
            out.append((kind, f.default if f.default is not dataclasses.MISSING else f.default_factory()))  # type: ignore[misc]
    return out


def unknown_kind_field(base: type, cls: type, path: str, key: str, owners: list | None = None) -> str | None:
    """The one-line error for ``<path>.<key>`` in a group of class ``cls`` (chosen by its kind), which
    lacks it: the kinds whose classes have it; None when none has it (an unknown key)."""
    owners = kind_owners(base, key) if owners is None else owners
    if not owners:
        return None
    kind_key, names = f"{path}.{base.KIND}", [k for k, _ in owners]
    kind = cls.__dataclass_fields__[base.KIND].default
    return (f"{path}.{key} is read by {kind_key}={' / '.join(names)}, not by {kind_key}={kind}: set {kind_key} to "
            f"{'it' if len(names) == 1 else 'one of them'}, or remove {path}.{key}")  # fmt: skip


__all__ = ["kind_owners", "unknown_kind_field"]
