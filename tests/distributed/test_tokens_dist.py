"""A backbone's tokens through the call under FSDP2 on 2 gloo processes: ``model(x, tokens=True,
keep=..., mask=...)`` of a ViT sharded per block and at the root (resharded after forward) gives the
gradients of one process, the mask token's (a root parameter) included — the ``Tokens`` output is a
pytree node, so FSDP2 finds its tensors and gathers the root's parameters again for backward."""

from __future__ import annotations

import pytest
from _launch import needs_cpu_fsdp, run_distributed

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # 12 s on 2 cores: process start-up

OVER = dict(mask_token=True, pool="avg", class_token_length=5)  # fc_norm after pooling, 1 + 4 prefix tokens


def _loss(t, images: int):
    return (t.pooled.square().sum() + t.patches.square().sum() + t.prefix.sum()) / images


def _tokens_grads_match():
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from vitscale.distributed.fsdp import apply_fsdp
    from vitscale.models.registry import create_model

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    ref = create_model("vit_debug", **OVER)
    with torch.no_grad():
        ref.mask_token.normal_()  # a trained token: its gradient flows through the masked patches
    model = create_model("vit_debug", **OVER)
    model.load_state_dict(ref.state_dict(), strict=True)
    apply_fsdp(model, model.blocks, init_device_mesh("cpu", (2,)))
    g = torch.Generator().manual_seed(5)
    x, mask = torch.randn(4, 3, 32, 32, generator=g), torch.rand(4, 16, generator=g) < 0.5
    keep = torch.arange(16)[None].expand(4, -1)
    mine = slice(2 * rank, 2 * rank + 2)
    _loss(model(x[mine], tokens=True, keep=keep[mine], mask=mask[mine]), 2).backward()  # FSDP2 averages the ranks
    _loss(ref(x, tokens=True, keep=keep, mask=mask), 4).backward()
    got = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}
    want = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    assert set(got) == set(want) and "mask_token" in got
    return max(float((got[n] - w).abs().max() / w.abs().max().clamp(min=1e-12)) for n, w in want.items())


@needs_cpu_fsdp
def test_tokens_under_fsdp2_give_one_process_gradients():
    assert all(worst < 1e-5 for worst in run_distributed(_tokens_grads_match, 2))
