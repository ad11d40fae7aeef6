"""A model's own gradient checkpointing (``set_grad_checkpointing``): one block at a time."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def run_block(block: nn.Module, x: torch.Tensor, checkpointing: bool) -> torch.Tensor:
    """``block(x)``, recomputed in backward when ``checkpointing`` and autograd is recording."""
    if checkpointing and torch.is_grad_enabled():
        return checkpoint(block, x, use_reentrant=False)
    return block(x)


def run_blocks(blocks: Iterable[nn.Module], x: torch.Tensor, checkpointing: bool) -> torch.Tensor:
    """The blocks in order, each through :func:`run_block`."""
    for block in blocks:
        x = run_block(block, x, checkpointing)
    return x


__all__ = ["run_block", "run_blocks"]
