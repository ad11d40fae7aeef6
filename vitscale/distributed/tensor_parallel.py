"""Generic tensor / sequence parallel helpers on DTensor (reused by every model family's plan).

A family's ``parallelize.py`` writes a readable per-block plan, a dict ``submodule path -> style``
(Megatron: QKV / fc1 ``ColwiseParallel``, output projections ``RowwiseParallel``, LayerNorms
``SequenceParallel``), and hands it to :func:`apply_plan`, which skips entries whose module is
absent or an ``nn.Identity`` (e.g. LayerScale off, no QK norm) so one plan covers every variant.

The residual stream between blocks is a DTensor sharded on the token dimension (``Shard(1)``),
which keeps its global length, so sequences that do not split evenly (197 tokens of a B/16 with
a class token) are fine: only the collectives see uneven shards.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

try:  # torch >= 2.5
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
except ImportError:  # pragma: no cover - older torch
    from torch.distributed._tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

SEQ_DIM = 1  # (B, N, D) token dimension sharded by sequence parallelism


class ShardedLocalParams(ParallelStyle):
    """Shard a module's own parameters (not a submodule's) and let its forward see the local shard.

    Used for the ViT-22B ``ParallelBlock.mlp_bias_per_head`` of shape ``(H, F/H)``: it is added to this
    rank's slice of the column-parallel ``in_proj_per_head`` output, a plain local tensor, so the block's
    forward must see its local ``(H/tp, F/H)`` rows. The parameter stays a ``Shard(dim)`` DTensor
    (optimizer, FSDP and checkpoints see the global tensor); during forward it is swapped for
    ``to_local()``, which is differentiable, so the gradient lands on the DTensor parameter.
    The swap wraps ``module.forward`` (called after FSDP's pre-forward unshard hook), so it also
    holds under activation-checkpoint recomputation.
    """

    def __init__(self, params: dict[str, int]):
        super().__init__()
        self.params = dict(params)

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        names = []
        for name, dim in self.params.items():
            p = module._parameters.get(name)
            if p is None:
                continue
            if p.shape[dim] % device_mesh.size():
                raise ValueError(f"{name} dim {dim} of size {p.shape[dim]} is not divisible by tp={device_mesh.size()}")
            dt = distribute_tensor(p.data, device_mesh, [Shard(dim)])
            module.register_parameter(name, nn.Parameter(dt, requires_grad=p.requires_grad))
            names.append(name)
        if not names:
            return module
        inner = module.forward

        @functools.wraps(inner)
        def forward(*args, **kwargs):
            saved = {}
            for n in names:
                p = module._parameters.get(n)
                if isinstance(p, DTensor):
                    saved[n] = p
                    module._parameters[n] = p.to_local()  # this rank's rows; grad flows to the DTensor
            try:
                return inner(*args, **kwargs)
            finally:
                module._parameters.update(saved)

        module.forward = forward
        return module


def enter_sequence_parallel() -> ParallelStyle:
    """For the first block: full (replicated) tokens in -> DTensor sharded on tokens."""
    return PrepareModuleInput(
        input_layouts=(Replicate(),), desired_input_layouts=(Shard(SEQ_DIM),), use_local_output=False
    )


def exit_sequence_parallel() -> ParallelStyle:
    """For the last block: token-sharded DTensor out -> the full tokens as a plain local tensor."""
    return PrepareModuleOutput(
        output_layouts=(Shard(SEQ_DIM),), desired_output_layouts=(Replicate(),), use_local_output=True
    )


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


# torch 2.11 (the GPU image's; fixed by 2.15, versions between unchecked) all-gathers unevenly
# sharded tokens (197 over 2 ranks) into a padded buffer and cuts the padding off with narrow(),
# leaving a non-contiguous local tensor on which DTensor's linear fails ("view size is not
# compatible with input tensor's size and stride").
GATHER_NEEDS_CONTIGUOUS = _torch_version() < (2, 15)


def _contiguous_dtensor(t: Any) -> Any:
    """``t`` with a contiguous local tensor if it is a DTensor whose local tensor is not (the copy is
    differentiable: the gradient flows back to ``t``); anything else unchanged."""
    if isinstance(t, DTensor) and not t.to_local().is_contiguous():
        local = t.to_local().contiguous()
        return DTensor.from_local(local, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())
    return t


def _contiguous_local_inputs(module: nn.Module, args: tuple) -> tuple | None:
    out = tuple(_contiguous_dtensor(a) for a in args)
    return out if any(o is not a for o, a in zip(out, args)) else None


class ContiguousLocalInputs(ParallelStyle):
    """After an input all-gather: give DTensor inputs a contiguous local tensor (a copy only where the
    gather left it non-contiguous, see ``GATHER_NEEDS_CONTIGUOUS``)."""

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        module.register_forward_pre_hook(_contiguous_local_inputs)
        return module


def _then_contiguous(style: ParallelStyle) -> ParallelStyle | list[ParallelStyle]:
    return [style, ContiguousLocalInputs()] if GATHER_NEEDS_CONTIGUOUS else style


class _ContiguousGrad(torch.autograd.Function):
    """Identity forward; the gradient's local tensor made contiguous on the way back."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _contiguous_dtensor(g)


class ContiguousOutputGrad(ParallelStyle):
    """Before a row-parallel Linear's reduce-scatter onto token shards: the backward of that
    reduce-scatter all-gathers the gradient, which leaves it non-contiguous on the torch versions of
    ``GATHER_NEEDS_CONTIGUOUS``, and the Linear's backward then fails. Applied *before* the
    ``RowwiseParallel`` style, so its hook sees the Linear's own output."""

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        module.register_forward_hook(lambda mod, args, out: _ContiguousGrad.apply(out) if isinstance(out, DTensor) else None)
        return module


def gather_sequence_input() -> ParallelStyle | list[ParallelStyle]:
    """Module input: token-sharded -> replicated (the all-gather before a column-parallel matmul)."""
    return _then_contiguous(
        PrepareModuleInput(input_layouts=(Shard(SEQ_DIM),), desired_input_layouts=(Replicate(),), use_local_output=False)
    )


def colwise(input_sharded_on_tokens: bool = False) -> ParallelStyle | list[ParallelStyle]:
    """Column-parallel Linear; its output is this rank's columns (heads / hidden units) as a local tensor."""
    if input_sharded_on_tokens:
        return _then_contiguous(ColwiseParallel(input_layouts=Shard(SEQ_DIM)))
    return ColwiseParallel()


def rowwise(sequence_parallel_output: bool = True) -> ParallelStyle | list[ParallelStyle]:
    """Row-parallel Linear: reduce-scatter onto token shards (SP) or all-reduce to a replicated output."""
    if sequence_parallel_output:
        style = RowwiseParallel(output_layouts=Shard(SEQ_DIM), use_local_output=False)
        return [ContiguousOutputGrad(), style] if GATHER_NEEDS_CONTIGUOUS else style
    return RowwiseParallel()


def sequence_parallel() -> ParallelStyle:
    """LayerNorm / LayerScale / dropout on token shards; the parameters are replicated DTensors."""
    return SequenceParallel(sequence_dim=SEQ_DIM)


def head_parallel_norm(head_dim_index: int = 1) -> ParallelStyle:
    """QK-norm on ``(B, H_local, N, Dh)``: the heads are sharded, the norm weight is shared, so the
    input is annotated ``Shard(head dim)`` and the weight's gradient is summed over TP ranks."""
    return SequenceParallel(sequence_dim=head_dim_index, use_local_output=True)


def _resolve(root: nn.Module, path: str) -> nn.Module | None:
    try:
        return root.get_submodule(path) if path else root
    except AttributeError:
        return None


def apply_plan(module: nn.Module, tp_mesh, plan: dict[str, Any]) -> None:
    """``parallelize_module`` for every ``path -> style`` in ``plan`` whose module exists and is no Identity.

    A value may be a list of styles (applied in order, e.g. an input and an output preparation).
    """
    for path, styles in plan.items():
        target = _resolve(module, path)
        if target is None or isinstance(target, nn.Identity):
            continue
        for style in styles if isinstance(styles, (list, tuple)) else [styles]:
            parallelize_module(target, tp_mesh, style)


__all__ = [
    "ContiguousLocalInputs",
    "ContiguousOutputGrad",
    "DTensor",
    "GATHER_NEEDS_CONTIGUOUS",
    "Replicate",
    "SEQ_DIM",
    "Shard",
    "ShardedLocalParams",
    "apply_plan",
    "colwise",
    "enter_sequence_parallel",
    "exit_sequence_parallel",
    "gather_sequence_input",
    "head_parallel_norm",
    "rowwise",
    "sequence_parallel",
]
