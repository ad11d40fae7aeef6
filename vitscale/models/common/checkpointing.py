"""A model's own gradient checkpointing (``set_grad_checkpointing``): one block at a time."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def run_block(block: nn.Module, x: torch.Tensor, checkpointing: bool, **kwargs: Any) -> torch.Tensor:
    """``block(x, **kwargs)`` (e.g. ``attn_mask=``), recomputed in backward when ``checkpointing`` and
    autograd is recording."""
    if checkpointing and torch.is_grad_enabled():
        return checkpoint(block, x, use_reentrant=False, **kwargs)
    return block(x, **kwargs)


def run_blocks(blocks: Iterable[nn.Module], x: torch.Tensor, checkpointing: bool, **kwargs: Any) -> torch.Tensor:
    """The blocks in order, each through :func:`run_block` with the same ``kwargs``."""
    for block in blocks:
        x = run_block(block, x, checkpointing, **kwargs)
    return x


__all__ = ["run_block", "run_blocks"]
