"""Contrastive losses on 2 gloo processes equal the 1-process loss on the concatenated batch.

Gradients follow the data-parallel convention: each rank's gradient on its own features, averaged
over ranks the way DDP / FSDP average parameter gradients (i.e. divided by the world size), equals
the 1-process gradient of those rows.
"""

from __future__ import annotations

import pytest
import torch
from _launch import run_distributed

pytestmark = pytest.mark.multiprocess

N, D = 8, 6  # global batch, feature width


def _global_inputs():
    g = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(N, D, generator=g, dtype=torch.float64), dim=-1)
    txt = torch.nn.functional.normalize(torch.randn(N, D, generator=g, dtype=torch.float64), dim=-1)
    return img, txt


def _make(kind: str, group=None):
    from vitscale.tasks.contrastive_loss import ClipLoss, SigLipLoss

    if kind == "siglip":
        return SigLipLoss(group=group)
    local, gwg = {"clip": (False, True), "clip_local": (True, True)}[kind]
    return ClipLoss(local_loss=local, gather_with_grad=gwg, group=group)


def _run(kind: str, img, txt, rank: int, world: int, group=None):
    n = img.shape[0] // world
    sl = slice(rank * n, (rank + 1) * n)
    i, t = img[sl].clone().requires_grad_(), txt[sl].clone().requires_grad_()
    scale = torch.tensor(7.0, dtype=torch.float64, requires_grad=True)
    bias = torch.tensor(-3.0, dtype=torch.float64, requires_grad=True) if kind == "siglip" else None
    loss = _make(kind, group)(i, t, scale, bias)
    loss.backward()
    grads = [i.grad, t.grad, scale.grad] + ([bias.grad] if bias is not None else [])
    return loss.detach(), grads


def _worker(kind: str):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    img, txt = _global_inputs()
    loss, grads = _run(kind, img, txt, rank, world)
    # average over ranks as DDP does; feature gradients are gathered to compare all rows
    dist.all_reduce(loss)
    loss /= world
    out = []
    for gr in grads[:2]:
        parts = [torch.empty_like(gr) for _ in range(world)]
        dist.all_gather(parts, gr / world)
        out.append(torch.cat(parts))
    for gr in grads[2:]:
        dist.all_reduce(gr)
        out.append(gr / world)
    return loss.item(), [o.tolist() for o in out]  # plain Python values through the result queue


@pytest.mark.parametrize("kind", ["clip", "clip_local", "siglip"])
def test_two_process_loss_and_grads_equal_one_process(kind):
    img, txt = _global_inputs()
    ref_loss, ref_grads = _run(kind, img, txt, 0, 1)
    results = run_distributed(_worker, 2, kind)
    for loss, grads in results:
        assert abs(loss - ref_loss.item()) < 1e-12, (kind, loss, ref_loss)
        for a, b in zip(grads, ref_grads):
            assert torch.allclose(torch.tensor(a, dtype=torch.float64), b, atol=1e-10), (kind, a, b)
