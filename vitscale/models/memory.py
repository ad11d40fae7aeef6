"""The default memory model of a family (its ``FamilySpec.memory`` left unset): measured on the meta device.

One training forward pass of one sample runs on the meta device (nothing is allocated) under
``torch.autograd.graph.saved_tensors_hooks``, and every distinct storage autograd saves for backward
(parameters excluded) is counted, attributed to the block of the family's parallel plan that saved
it, or to the rest of the model. From that:

- no checkpointing (and ``selective``, which this model does not refine): everything saved;
- ``full``: the rest, plus each block's input (all a checkpointed block keeps), plus the largest
  block's own saved tensors rebuilt during its backward;
- tensor parallelism: what the blocks save is divided by ``tp`` (the TP plan shards the blocks'
  matmuls and their outputs); the parameters of the blocks' linear layers are the TP-sharded ones.

Exact for one process without checkpointing (``tests/integration/test_new_family.py`` compares it with
the tensors autograd saves on the CPU for the toy family); the TP terms are an approximation a family
replaces by its own model when it needs better (the ViT's: :mod:`vitscale.models.vit.memory`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """(identity, elements) of the storage under ``t`` (views share it; meta storages too)."""
    s = t.untyped_storage()
    return s._cdata, s.nbytes() // max(t.element_size(), 1)


def saved_by_region(model: nn.Module, blocks: list[nn.Module]) -> tuple[float, list[float], list[float]]:
    """One training forward of one sample of ``model`` (on its device, the meta device for a plan):
    (elements saved outside the blocks, elements saved inside each block, elements of each block's input)."""
    params = {_storage(p)[0] for p in model.parameters()}
    region: list[int | None] = [None]
    seen: dict[int, tuple[int, int | None]] = {}
    inputs = [0.0] * len(blocks)

    def pack(t: torch.Tensor) -> torch.Tensor:
        key, n = _storage(t)
        if key not in params and key not in seen:
            seen[key] = (n, region[0])
        return t

    def enter(i: int):
        def hook(module, args):
            region[0] = i
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            inputs[i] = float(first.numel()) if first is not None else 0.0

        return hook

    def leave(module, args, out):
        region[0] = None

    handles = []
    for i, block in enumerate(blocks):
        handles += [block.register_forward_pre_hook(enter(i)), block.register_forward_hook(leave)]
    device = next(iter(model.parameters())).device
    was_training = model.training
    try:
        model.train()
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(*model.example_inputs(1, device))
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    outside = float(sum(n for n, r in seen.values() if r is None))
    inside = [float(sum(n for n, r in seen.values() if r == i)) for i in range(len(blocks))]
    return outside, inside, inputs


@dataclass(frozen=True)
class MeasuredMemory:
    """:class:`vitscale.models.spec.MemoryModel` of any family: measured on the meta-device model."""

    def param_counts(self, model: nn.Module, plan: Any) -> tuple[int, int, int]:
        blocks = [b for stack in plan.blocks(model) for b in stack]
        units = blocks + list(plan.fsdp_units(model))
        total = sum(p.numel() for p in model.parameters())
        biggest = max((sum(p.numel() for p in u.parameters()) for u in units), default=0)
        sharded = sum(p.numel() for b in blocks for m in b.modules() if isinstance(m, nn.Linear) for p in m.parameters())
        return total, sharded, biggest

    def activation_elems(self, model: nn.Module, plan: Any, tp: int, ac: str) -> tuple[float, float]:
        blocks = [b for stack in plan.blocks(model) for b in stack]
        outside, inside, inputs = saved_by_region(model, blocks)
        if ac == "full":
            return outside + sum(inputs), max(inside, default=0.0) / tp
        return outside + sum(inside) / tp, 0.0


__all__ = ["MeasuredMemory", "saved_by_region"]
