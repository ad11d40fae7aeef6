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

    Used for the ViT-22B ``ParallelBlock.mlp_bias`` of shape ``(H, F/H)``: it is added to this
    rank's slice of the column-parallel ``in_proj`` output, a plain local tensor, so the block's
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


def gather_sequence_input() -> ParallelStyle:
    """Module input: token-sharded -> replicated (the all-gather before a column-parallel matmul)."""
    return PrepareModuleInput(
        input_layouts=(Shard(SEQ_DIM),), desired_input_layouts=(Replicate(),), use_local_output=False
    )


def colwise(input_sharded_on_tokens: bool = False) -> ParallelStyle:
    """Column-parallel Linear; its output is this rank's columns (heads / hidden units) as a local tensor."""
    if input_sharded_on_tokens:
        return ColwiseParallel(input_layouts=Shard(SEQ_DIM))
    return ColwiseParallel()


def rowwise(sequence_parallel_output: bool = True) -> ParallelStyle:
    """Row-parallel Linear: reduce-scatter onto token shards (SP) or all-reduce to a replicated output."""
    if sequence_parallel_output:
        return RowwiseParallel(output_layouts=Shard(SEQ_DIM), use_local_output=False)
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
    "DTensor",
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
