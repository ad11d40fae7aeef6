"""The losses, targets and schedules of DINOv2 (Oquab et al. 2023, arXiv 2304.07193), as functions of
tensors: facebookresearch/dinov2 at b8931f7 (file and line for each below). :mod:`vitscale.tasks.dino`
composes them; the tests check each against a float64 formula.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _all_reduce(x: torch.Tensor, group=None) -> torch.Tensor:
    """``x`` summed over the data-parallel ranks (in place; as it is on one process)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(x, group=group)
    return x


# ------------------------------------------------------------------------------------------ targets
@torch.no_grad()
def sinkhorn_knopp(logits: torch.Tensor, temp: float, iterations: int = 3, group=None,
                   count: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """The teacher's targets ``(B, K)`` by Sinkhorn-Knopp (``dinov2/loss/dino_clstoken_loss.py`` lines
    35-61; ``ibot_patch_loss.py`` lines 62-90 with ``count``): ``Q = exp(logits / temp)`` normalised to
    sum 1, then ``iterations`` times each prototype's row to ``1 / K`` and each sample's column to
    ``1 / B``, finally each column to 1. The total and the row sums are summed over the ranks of
    ``group``; ``B`` is the global number of rows (``count``: this rank's row count to sum, else
    ``logits.shape[0]`` x the world size). In float32. (``exp`` without the max subtracted, as the
    reference: logits of a weight-normalised layer on a unit vector are bounded by the prototype norm.)"""
    q = torch.exp(logits.float() / temp).t()  # (K, B)
    if count is None:
        world = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
        b = float(q.shape[1] * world)
    else:
        b = _all_reduce(count.clone().float(), group)  # a device tensor: no read by the host
    k = q.shape[0]
    q /= _all_reduce(q.sum(), group)
    for _ in range(iterations):
        q /= _all_reduce(q.sum(dim=1, keepdim=True), group)
        q /= k
        q /= q.sum(dim=0, keepdim=True)
        q /= b
    q *= b
    return q.t()


@torch.no_grad()
def softmax_centered(logits: torch.Tensor, center: torch.Tensor, temp: float) -> torch.Tensor:
    """``softmax((logits - center) / temp)`` (``dino_clstoken_loss.py`` lines 29-32), in float32."""
    return F.softmax((logits.float() - center) / temp, dim=-1)


@torch.no_grad()
def update_center(center: torch.Tensor, logits: torch.Tensor, momentum: float, group=None) -> None:
    """The running centre, in place: ``center * m + mean(logits) * (1 - m)``, the mean over the rows of
    every rank (``dino_clstoken_loss.py`` lines 81-97)."""
    rows = logits.reshape(-1, logits.shape[-1]).float()
    total = _all_reduce(rows.sum(dim=0, keepdim=True).reshape(center.shape), group)
    n = _all_reduce(torch.tensor(float(rows.shape[0]), device=rows.device), group)
    center.mul_(momentum).add_(total / n, alpha=1 - momentum)


# ------------------------------------------------------------------------------------------ losses
def cross_entropy(targets: torch.Tensor, student_logits: torch.Tensor, student_temp: float) -> torch.Tensor:
    """Per row ``-sum_k t_k log softmax(s / student_temp)_k`` (``dino_clstoken_loss.py`` lines 69-73)."""
    return -(targets * F.log_softmax(student_logits.float() / student_temp, dim=-1)).sum(dim=-1)


def dino_loss(student_global: list[torch.Tensor], student_local: list[torch.Tensor],
              teacher_global: list[torch.Tensor], student_temp: float, local_weight: float = 1.0) -> torch.Tensor:  # fmt: skip
    """DINOv2's class-token loss (``dinov2/train/ssl_meta_arch.py`` lines 147-148, 278-304): each
    student global crop against the teacher's targets of the *other* global crop, each local crop
    against both, every pair's mean over the batch, summed and divided by the reference's term count
    (lines 147-148): ``(n_g - 1) n_g`` global terms plus ``max(n_g x local_crops_number, 1)`` local ones,
    so 3 (not the 2 pairs) at 0 local crops, as DINOv2 divides. ``local_weight`` scales the local terms
    (DINOv3's ``reweight_dino_local_loss``: its local terms' mean times their share of the terms times
    the weight, plus the global terms' mean times theirs, facebookresearch/dinov3
    ``dinov3/train/ssl_meta_arch.py`` lines 601-633, is this sum with the local pairs weighted)."""
    n_g = len(teacher_global)
    pairs = (n_g - 1) * n_g + max(n_g * len(student_local), 1)
    total = student_global[0].new_zeros((), dtype=torch.float32)
    for i, s in enumerate(student_global):
        for j, t in enumerate(teacher_global):
            if i != j:
                total = total + cross_entropy(t, s, student_temp).mean()
    plain = local_weight == 1.0  # the local terms summed on (DINOv2's order), or apart and weighted
    local = total if plain else student_global[0].new_zeros((), dtype=torch.float32)
    for s in student_local:
        for t in teacher_global:
            local = local + cross_entropy(t, s, student_temp).mean()
    return (local if plain else total + local_weight * local) / pairs


def ibot_loss(student_masked: torch.Tensor, teacher_masked: torch.Tensor, weights: torch.Tensor, n_crops: int,
              student_temp: float) -> torch.Tensor:  # fmt: skip
    """iBOT's masked-patch loss (``dinov2/loss/ibot_patch_loss.py`` ``forward_masked`` lines 105-126):
    ``student_masked`` and ``teacher_masked`` ``(M, K)`` are the logits / targets of the masked patches
    of all global crops; ``weights`` ``(M,)`` is ``1 / (masked patches of that crop)``; the weighted sum
    of the cross-entropies over the ``n_crops`` global crops of the batch (masked or not). As
    ``ssl_meta_arch.py`` lines 324-333 apply it (``* 2 / n_global_crops``): unchanged for two crops."""
    loss = cross_entropy(teacher_masked, student_masked, student_temp)
    return (loss * weights).sum() / n_crops


def koleo_loss(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """The Kozachenko-Leonenko entropy estimator (Sablayrolles et al. 2018, arXiv 1806.03198;
    ``dinov2/loss/koleo_loss.py`` lines 25-48): the rows L2-normalised, each row's nearest other row by
    inner product, ``-mean log(||x_i - x_nn(i)|| + eps)`` (``PairwiseDistance`` adds its own ``eps`` to
    the difference). Needs at least 2 rows (one row has no neighbour: NaN, dinov2 issue #314)."""
    x = F.normalize(x.float(), eps=eps, p=2, dim=-1)
    with torch.no_grad():
        dots = x @ x.t()
        dots.fill_diagonal_(-1)
        nn_idx = dots.argmax(dim=1)
    dist_ = torch.linalg.vector_norm(x - x[nn_idx] + eps, dim=-1)
    return -torch.log(dist_ + eps).mean()


# ------------------------------------------------------------------------------------------ schedules
def teacher_temp_at(it: int, start: float, end: float, warmup: int) -> float:
    """The teacher temperature at optimizer iteration ``it`` (0-based): ``linspace(start, end, warmup)``
    then ``end`` (``dinov2/utils/utils.py`` ``CosineScheduler`` lines 67-87 with ``total = warmup``, as
    ``dinov2/train/train.py`` lines 84-90 builds it)."""
    if it >= warmup:
        return end
    return start if warmup == 1 else start + (end - start) * it / (warmup - 1)


def momentum_at(it: int, base: float, final: float, total: int) -> float:
    """The teacher's EMA momentum at iteration ``it``: ``final + (base - final) (1 + cos(pi it / total)) / 2``,
    ``final`` from ``total`` on (``CosineScheduler`` lines 77-87; train.py lines 79-83). The weight decay
    follows the same cosine (train.py lines 74-78)."""
    if it >= total:
        return final
    return final + 0.5 * (base - final) * (1 + math.cos(math.pi * it / total))


def warmup_cosine_at(it: int, schedule, total: int) -> float:
    """DINOv3's ``linear_warmup_cosine_decay`` (``dinov3/train/cosine_lr_scheduler.py`` lines 54-85) at
    optimizer iteration ``it`` (0-based) of a ``total``-iteration run, ``schedule`` being ``[start, peak,
    end, warmup, cosine]`` (``cosine`` left out: the rest of the run): ``linspace(start, peak, warmup,
    endpoint=False)``, then ``end + (peak - end) (1 + cos(pi j / (cosine - 1))) / 2`` for the ``j``-th of
    the cosine's iterations (its linspace from 0 to pi includes both ends), then ``end``."""
    start, peak, end, warmup = float(schedule[0]), float(schedule[1]), float(schedule[2]), int(schedule[3])
    cosine = int(schedule[4]) if len(schedule) > 4 else max(total - warmup, 0)
    if it < warmup:
        return start + (peak - start) * it / warmup
    j = it - warmup
    if j < cosine:
        c = math.cos(math.pi * j / (cosine - 1)) if cosine > 1 else 1.0
        return end + (peak - end) * (1 + c) / 2
    return end


__all__ = ["cross_entropy", "dino_loss", "ibot_loss", "koleo_loss", "momentum_at", "sinkhorn_knopp",
           "softmax_centered", "teacher_temp_at", "update_center", "warmup_cosine_at"]  # fmt: skip
