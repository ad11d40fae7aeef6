"""Contrastive image-text losses across data-parallel ranks: CLIP InfoNCE and SigLIP sigmoid.

Gradient convention (the same as open_clip's): on every rank the loss is a function of the local
features, and gradients reaching other ranks' features are sent back and summed there. DDP / FSDP
then average parameter gradients over the ranks, so a W-rank step equals the 1-process step on the
concatenated batch — tested on 2 gloo processes in ``tests/distributed/test_clip_dist_loss.py``.

- :class:`ClipLoss` (NeMo / open_clip ``local_loss``, ``gather_with_grad``): features are all-gathered;
  with ``local_loss`` each rank scores only its own rows against the global batch (B x W*B logits
  instead of W*B x W*B). ``gather_with_grad=False`` gathers without a backward path (only the local
  slot carries gradients), which under-weights the gradient by W — NeMo warns this may hurt convergence.
- :class:`SigLipLoss`: the pairwise sigmoid loss (Zhai et al. 2023). Text chunks travel around a ring of
  ranks one hop at a time, forward and backward, inside one autograd function that keeps only the
  local features: its memory is O(B x D + B x B) whatever the world size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _f32(x: torch.Tensor | None) -> torch.Tensor | None:
    """Half-precision features are scored in fp32; fp32 / fp64 stay as they are."""
    return x.float() if x is not None and x.dtype in (torch.float16, torch.bfloat16) else x


def _world(group) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


# ----------------------------------------------------------------------------- all-gather with grad


class _AllGatherWithGrad(torch.autograd.Function):
    """Concatenate ``x`` from every rank along dim 0; backward sums the gradients of each slot onto
    its owner (reduce-scatter; all-reduce + slice on backends without reduce-scatter, e.g. gloo)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        rank, world = _world(group)
        ctx.rank, ctx.world = rank, world
        out = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(out, x.contiguous(), group=group)
        return torch.cat(out, dim=0)  # (W*B, ...)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        n = grad.shape[0] // ctx.world
        if dist.get_backend(ctx.group) == "nccl":
            out = grad.new_empty((n, *grad.shape[1:]))
            dist.reduce_scatter_tensor(out, grad, group=ctx.group)
            return out, None
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.rank * n : (ctx.rank + 1) * n].clone(), None


def gather_features(x: torch.Tensor, group=None, with_grad: bool = True) -> torch.Tensor:
    """All ranks' ``x`` concatenated in rank order. Without grad, the local slot still carries the
    local tensor (so the local features keep their gradient path)."""
    rank, world = _world(group)
    if world == 1:
        return x
    if with_grad:
        return _AllGatherWithGrad.apply(x, group)
    with torch.no_grad():
        out = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(out, x.contiguous(), group=group)
    out[rank] = x
    return torch.cat(out, dim=0)


# ----------------------------------------------------------------------------- CLIP InfoNCE


class ClipLoss(nn.Module):
    """Symmetric InfoNCE over image-text pairs (CLIP). Inputs are L2-normalised features ``(B, E)``
    and the temperature ``logit_scale`` (already exponentiated), as ``CLIP.forward`` returns them."""

    def __init__(self, local_loss: bool = False, gather_with_grad: bool = True, group=None):
        super().__init__()
        self.local_loss = local_loss
        self.gather_with_grad = gather_with_grad
        self.group = group

    def logits(self, image_features, text_features, logit_scale):
        rank, world = _world(self.group)
        if world == 1:
            li = logit_scale * image_features @ text_features.t()
            return li, li.t(), 0
        all_img = gather_features(image_features, self.group, self.gather_with_grad)
        all_txt = gather_features(text_features, self.group, self.gather_with_grad)
        if self.local_loss:
            li = logit_scale * image_features @ all_txt.t()  # (B, W*B)
            lt = logit_scale * text_features @ all_img.t()  # (B, W*B)
            return li, lt, rank * image_features.shape[0]
        li = logit_scale * all_img @ all_txt.t()  # (W*B, W*B)
        return li, li.t(), 0

    def forward(self, image_features, text_features, logit_scale, logit_bias=None) -> torch.Tensor:
        image_features, text_features = _f32(image_features), _f32(text_features)
        li, lt, offset = self.logits(image_features, text_features, _f32(logit_scale))
        labels = torch.arange(li.shape[0], device=li.device) + offset
        return (F.cross_entropy(li, labels) + F.cross_entropy(lt, labels)) / 2


# ----------------------------------------------------------------------------- SigLIP


def _ring_pass(tensors: list[torch.Tensor], group, rank: int, world: int) -> list[torch.Tensor]:
    """Send ``tensors`` to the next rank, receive the previous rank's (one ring hop)."""
    to_rank = dist.get_global_rank(group, (rank + 1) % world) if group is not None else (rank + 1) % world
    from_rank = dist.get_global_rank(group, (rank - 1) % world) if group is not None else (rank - 1) % world
    recv = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), to_rank, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, r, from_rank, group) for r in recv]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return recv


def _sigmoid_block(img, txt, scale, bias, positive: bool):
    """Logits and labels of one (local images) x (one text chunk) block."""
    z = scale * img @ txt.t()  # (B, Bj)
    if bias is not None:
        z = z + bias
    y = -torch.ones_like(z)
    if positive:
        y = y + 2 * torch.eye(z.shape[0], z.shape[1], device=z.device, dtype=z.dtype)
    return z, y


class _SigLipRing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, img, txt, scale, bias, group):
        rank, world = _world(group)
        ctx.group, ctx.rank, ctx.world = group, rank, world
        ctx.has_bias = bias is not None
        B = img.shape[0]
        total = img.new_zeros(())
        chunk = txt
        for step in range(world):
            if step > 0:
                (chunk,) = _ring_pass([chunk], group, rank, world)
            z, y = _sigmoid_block(img, chunk, scale, bias, positive=step == 0)
            total = total - F.logsigmoid(y * z).sum()
        ctx.save_for_backward(img, txt, scale, bias if bias is not None else scale.new_zeros(()))
        return total / B

    @staticmethod
    def backward(ctx, grad_out):
        img, txt, scale, bias = ctx.saved_tensors
        bias = bias if ctx.has_bias else None
        group, rank, world = ctx.group, ctx.rank, ctx.world
        B = img.shape[0]
        g_img = torch.zeros_like(img)
        g_scale = torch.zeros_like(scale)
        g_bias = torch.zeros_like(scale)
        chunk, g_chunk = txt, torch.zeros_like(txt)  # a text chunk travels with the gradient owed to it
        for step in range(world):
            if step > 0:
                chunk, g_chunk = _ring_pass([chunk, g_chunk], group, rank, world)
            z, y = _sigmoid_block(img, chunk, scale, bias, positive=step == 0)
            dz = -y * torch.sigmoid(-y * z) * (grad_out / B)  # d(-logsigmoid(y z))/dz
            g_img += scale * dz @ chunk
            g_chunk = g_chunk + scale * dz.t() @ img
            g_scale += (dz * (img @ chunk.t())).sum()
            g_bias += dz.sum()
        if world > 1:  # one more hop brings every chunk's gradient home
            (g_txt,) = _ring_pass([g_chunk], group, rank, world)
        else:
            g_txt = g_chunk
        return g_img, g_txt, g_scale, (g_bias if ctx.has_bias else None), None


class SigLipLoss(nn.Module):
    """Pairwise sigmoid loss: ``-sum log sigmoid(y_ij (t x_i.y_j + b)) / B_local`` with y = +1 on the
    matching pairs, -1 elsewhere, over all W*B texts (a ring exchange between ranks)."""

    def __init__(self, group=None):
        super().__init__()
        self.group = group

    def forward(self, image_features, text_features, logit_scale, logit_bias=None) -> torch.Tensor:
        img, txt = _f32(image_features), _f32(text_features)
        scale = _f32(logit_scale).to(img.dtype).reshape(())
        bias = _f32(logit_bias).to(img.dtype).reshape(()) if logit_bias is not None else None
        return _SigLipRing.apply(img, txt, scale, bias, self.group)


def build_contrastive_loss(
    name: str, *, local_loss: bool = False, gather_with_grad: bool = True, group=None
) -> nn.Module:
    """``softmax`` (CLIP InfoNCE) or ``sigmoid`` (SigLIP)."""
    if name in ("softmax", "clip", "infonce"):
        return ClipLoss(local_loss=local_loss, gather_with_grad=gather_with_grad, group=group)
    if name in ("sigmoid", "siglip"):
        return SigLipLoss(group=group)
    raise ValueError(f"unknown contrastive loss {name!r}: use softmax or sigmoid")


__all__ = ["ClipLoss", "SigLipLoss", "build_contrastive_loss", "gather_features"]
