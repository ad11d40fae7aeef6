"""Activation checkpointing from outside the model, NeMo's granularity and methods.

``mode``: ``none`` | ``full`` (recompute the whole block in backward; keep only its input) |
``selective`` (keep the outputs of matmuls and attention, recompute the cheap element-wise ops:
LayerNorm, GELU, adds, dropout; most of the memory saving of ``full`` at a fraction of the
recompute).
``method`` (which blocks, NeMo ``activations_checkpoint_method``): ``block`` = the first
``num_layers`` blocks (0 = all); ``uniform`` = every ``num_layers``-th block (0 or 1 = all).

The block's ``forward`` is wrapped in place (no wrapper module), so parameter names, state dicts
and checkpoints are the same with and without activation checkpointing.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config import ACMethod, ACMode

MODES = typing.get_args(ACMode)
METHODS = typing.get_args(ACMethod)

# Ops whose outputs selective checkpointing keeps (compute-bound); everything else is recomputed.
_SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.baddbmm.default,
    torch.ops.aten.convolution.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
}
for _name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention"):
    if hasattr(torch.ops.aten, _name):
        _SAVE_OPS.add(getattr(torch.ops.aten, _name).default)


def selected_layers(num_blocks: int, method: str = "block", num_layers: int = 0) -> list[int]:
    """Indices of the blocks to checkpoint."""
    if method not in METHODS:
        raise ValueError(f"parallel.ac_method must be one of {METHODS}, got {method!r}")
    if num_layers < 0:
        raise ValueError(f"parallel.ac_num_layers must be >= 0, got {num_layers}")
    if method == "block":
        n = num_blocks if num_layers == 0 else min(num_layers, num_blocks)
        return list(range(n))
    k = max(num_layers, 1)
    return [i for i in range(num_blocks) if i % k == 0]


def _selective_context():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def checkpoint_module(module: nn.Module, mode: str = "full") -> nn.Module:
    """Make ``module`` recompute its activations in backward (in place, names unchanged)."""
    if mode not in MODES:
        raise ValueError(f"parallel.activation_checkpointing must be one of {MODES}, got {mode!r}")
    if mode == "none":
        return module
    inner = module.forward
    kw = {"context_fn": _selective_context} if mode == "selective" else {}

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            return inner(*args, **kwargs)
        return checkpoint(inner, *args, use_reentrant=False, **kw, **kwargs)

    module.forward = forward
    module._vitscale_ac = mode
    return module


def apply_activation_checkpointing(
    blocks: Sequence[nn.Module], mode: str = "none", method: str = "block", num_layers: int = 0
) -> list[int]:
    """Checkpoint the chosen blocks; returns their indices."""
    if mode not in MODES:
        raise ValueError(f"parallel.activation_checkpointing must be one of {MODES}, got {mode!r}")
    if mode == "none":
        return []
    idx = selected_layers(len(blocks), method, num_layers)
    for i in idx:
        checkpoint_module(blocks[i], mode)
    return idx


__all__ = ["METHODS", "MODES", "apply_activation_checkpointing", "checkpoint_module", "selected_layers"]
