"""The torch-2.11 workaround of the sequence-parallel plans (``GATHER_NEEDS_CONTIGUOUS``): after an
all-gather of unevenly sharded tokens, inputs and gradients get contiguous local tensors. CI runs
the newest torch, where the plans leave the workaround out, so this test applies it explicitly and
checks that a sequence-parallel MLP block with an odd token count still computes the one-process
outputs and gradients (on torch 2.11 the same block without it fails in forward and backward)."""

from __future__ import annotations

import pytest
from _launch import run_distributed

TOKENS = 17  # 9 + 8 over 2 ranks: uneven shards


def _block():
    import torch
    from torch import nn

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

        def forward(self, x):
            return self.fc2(torch.nn.functional.gelu(self.fc1(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.mlp = nn.LayerNorm(8), Mlp()

        def forward(self, x):
            return x + self.mlp(self.norm(x))

    torch.manual_seed(0)
    return Block()


def _run(forced: bool):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

    from vitscale.distributed import tensor_parallel as T

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    block = _block()
    x = torch.randn(3, TOKENS, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    gather = PrepareModuleInput(input_layouts=(T.Shard(1),), desired_input_layouts=(T.Replicate(),), use_local_output=False)
    fc2 = RowwiseParallel(output_layouts=T.Shard(1), use_local_output=False)
    plan = {
        "norm": T.sequence_parallel(),
        "mlp": [gather, T.ContiguousLocalInputs()] if forced else gather,
        "mlp.fc1": ColwiseParallel(),
        "mlp.fc2": [T.ContiguousOutputGrad(), fc2] if forced else fc2,
        "": [T.enter_sequence_parallel(), T.exit_sequence_parallel()],
    }
    T.apply_plan(block, mesh, plan)
    y = block(x)
    y.pow(2).sum().backward()
    grads = {n: (p.grad.full_tensor() if isinstance(p.grad, T.DTensor) else p.grad) for n, p in block.named_parameters()}
    # numpy copies travel by value through the result queue (tensors would go through shared memory)
    return y.detach().numpy().copy(), x.grad.numpy().copy(), {n: g.numpy().copy() for n, g in grads.items()}


@pytest.mark.multiprocess
def test_contiguous_styles_keep_the_one_process_result():
    import torch

    ref_block = _block()
    x = torch.randn(3, TOKENS, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    y_ref = ref_block(x)
    y_ref.pow(2).sum().backward()
    for y, gx, grads in run_distributed(_run, 2, True):
        torch.testing.assert_close(torch.from_numpy(y), y_ref.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.from_numpy(gx), x.grad, rtol=1e-5, atol=1e-6)
        for n, p in ref_block.named_parameters():
            torch.testing.assert_close(torch.from_numpy(grads[n]), p.grad, rtol=1e-5, atol=1e-6, msg=n)


def test_plans_use_the_workaround_exactly_where_torch_needs_it():
    from vitscale.distributed import tensor_parallel as T

    styles = T.rowwise()
    if T.GATHER_NEEDS_CONTIGUOUS:
        assert isinstance(styles, list) and isinstance(styles[0], T.ContiguousOutputGrad)
        assert isinstance(T.gather_sequence_input()[1], T.ContiguousLocalInputs)
    else:
        assert not isinstance(styles, list) and not isinstance(T.gather_sequence_input(), list)
