"""One rename table per model family, read in both directions.

A family's adapter lists, once, how each of its parameters is named (and laid out) in another
library's state dict; :func:`convert` reads that table towards vitscale (``to="ours"``) or towards
the library (``to="theirs"``), so an entry written once converts both ways — the pattern of
torchtitan's ``torchtitan/models/*/model/state_dict_adapter.py``, whose ``to_hf`` inverts its
``from_hf_map``.

Patterns are dotted keys in which ``*`` stands for one part of a name (no dot: a block index,
``weight``) and ``**`` for one or more parts (the rest of a key). Both sides of an entry hold the
same wildcards in the same order; what one side's wildcards matched fills the other side's. The first
entry that matches a key wins, in either direction, so a specific entry (a fused QKV with its row
permutation) stands before a general one (the rest of its block), and :data:`PASS_THROUGH`, last,
keeps every other key as it is. A key no entry matches is refused in one line.

Layout changes stay functions: an entry names the pair (to ours, to theirs), e.g. :func:`per_head`
for fused projections; what joins or splits several tensors (prefix tokens, ViT-22B output
projections) the family does around :func:`convert`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, partial
from typing import Literal

import torch

Layout = Callable[[torch.Tensor], torch.Tensor]

_WILDCARD = re.compile(r"(\*\*|\*)")


def _wildcards(pattern: str) -> list[str]:
    return _WILDCARD.findall(pattern)


@cache
def _regex(pattern: str) -> re.Pattern[str]:
    parts = _WILDCARD.split(pattern)  # literal, wildcard, literal, ...
    body = "".join(
        {"**": "(.+)", "*": r"([^.]+)"}[p] if i % 2 else re.escape(p) for i, p in enumerate(parts)
    )  # fmt: skip
    return re.compile(body)


def _fill(pattern: str, values: Sequence[str]) -> str:
    it = iter(values)
    return _WILDCARD.sub(lambda _: next(it), pattern)


@dataclass(frozen=True)
class Rename:
    """One entry: our key pattern, theirs, and the layout change each way (``None``: the same tensor).

    A side of ``None`` has no such key: a key of the other side is dropped on the way there (a buffer
    an old checkpoint stored, say)."""

    ours: str | None
    theirs: str | None
    to_ours: Layout | None = None
    to_theirs: Layout | None = None

    def __post_init__(self) -> None:
        if (self.to_ours is None) != (self.to_theirs is None):
            raise ValueError(f"rename {self.ours!r} <-> {self.theirs!r}: give the layout change both ways or neither")
        if self.ours is not None and self.theirs is not None and _wildcards(self.ours) != _wildcards(self.theirs):
            raise ValueError(f"rename {self.ours!r} <-> {self.theirs!r}: both sides need the same wildcards in order")


PASS_THROUGH = Rename("**", "**")
"""The last entry of a table whose other keys are named the same on both sides."""


@dataclass(frozen=True)
class RenameTable:
    """A family's renames to and from ``library`` (named in errors); ``unsupported`` ends the error for
    a key of the library's that no entry matches (say what is not supported)."""

    library: str
    entries: tuple[Rename, ...]
    unsupported: str = ""


def convert(
    sd: Mapping[str, torch.Tensor], table: RenameTable, to: Literal["ours", "theirs"]
) -> dict[str, torch.Tensor]:
    """``sd`` renamed (and re-laid-out) by ``table`` into vitscale's naming (``to="ours"``) or the
    library's (``to="theirs"``); KeyError naming a key that no entry matches, or two keys that
    would become one."""
    if to not in ("ours", "theirs"):
        raise ValueError(f"convert(to={to!r}): 'ours' or 'theirs'")
    toward_ours = to == "ours"
    src_name, dst_name = (table.library, "vitscale") if toward_ours else ("vitscale", table.library)
    out: dict[str, torch.Tensor] = {}
    came_from: dict[str, str] = {}
    for key, t in sd.items():
        for e in table.entries:
            src, dst, layout = (e.theirs, e.ours, e.to_ours) if toward_ours else (e.ours, e.theirs, e.to_theirs)
            m = None if src is None else _regex(src).fullmatch(key)
            if m is None:
                continue
            if dst is not None:
                new = _fill(dst, m.groups())
                if new in out:
                    raise KeyError(f"{src_name} keys {came_from[new]!r} and {key!r} both become {dst_name} key {new!r}")
                out[new], came_from[new] = (t if layout is None else layout(t)), key
            break
        else:
            why = f" ({table.unsupported})" if toward_ours and table.unsupported else ""
            raise KeyError(f"{src_name} key {key!r} has no {dst_name} equivalent{why}")
    return out


# ----------------------------------------------------------------------------- fused projections


def heads_first(t: torch.Tensor, parts: int, heads: int) -> torch.Tensor:
    """Rows ``(parts, H, Dh)`` -> ``(H, parts, Dh)`` (weights ``(rows, in)`` or biases ``(rows,)``)."""
    return t.reshape(parts, heads, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def parts_first(t: torch.Tensor, parts: int, heads: int) -> torch.Tensor:
    """Rows ``(H, parts, Dh)`` -> ``(parts, H, Dh)``."""
    return t.reshape(heads, parts, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def per_head(parts: int, heads: int) -> tuple[Layout, Layout]:
    """The layout pair of a fused projection (``parts`` = 3 for QKV, 2 for KV): the libraries stack
    its rows ``(parts, H, Dh)`` (``[q; k; v]``), vitscale per head ``(H, parts, Dh)`` (Megatron's
    layout, so that a tensor-parallel shard of rows holds whole heads)."""
    return partial(heads_first, parts=parts, heads=heads), partial(parts_first, parts=parts, heads=heads)


def transposed(t: torch.Tensor) -> torch.Tensor:
    """A matrix transposed into its own memory (``x @ P`` <-> ``nn.Linear`` weight ``P.T``)."""
    return t.t().contiguous()


__all__ = ["PASS_THROUGH", "Rename", "RenameTable", "convert", "heads_first", "parts_first", "per_head", "transposed"]
