"""Per-block ``torch.compile``: each transformer block compiled in place (``nn.Module.compile``),
so parameter names are unchanged and identical blocks reuse one compiled graph."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def apply_compile(blocks: Sequence[nn.Module], fullgraph: bool = False, **kwargs) -> None:
    """Compile every block in place; call after activation checkpointing and before FSDP."""
    for block in blocks:
        block.compile(fullgraph=fullgraph, **kwargs)


__all__ = ["apply_compile"]
