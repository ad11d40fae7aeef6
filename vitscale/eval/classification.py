"""Top-1 / top-5 accuracy and loss of a classifier over a (per-rank sharded) loader."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def evaluate_classification(
    model: nn.Module, loader, device: torch.device | str, autocast=contextlib.nullcontext, loss: str = "softmax",
    group=None,
) -> dict[str, float]:  # fmt: skip
    """``{"val_top1", "val_top5"}`` in percent and ``val_loss`` (mean cross-entropy, or sigmoid
    cross-entropy summed over classes for ``loss="sigmoid"``), summed over the data-parallel ranks'
    shards (``group``; None = the world). Padding samples (index -1) are not counted."""
    was_training = model.training
    model.eval()
    device = torch.device(device)
    totals = torch.zeros(4, dtype=torch.float64, device=device)  # n, top1, top5, loss sum
    for batch in loader:
        images = batch["image"].to(device, non_blocking=True)
        labels = batch["label"].to(device, non_blocking=True)
        with autocast():
            logits = model(images)
        real = batch["index"].to(device, non_blocking=True) >= 0  # (B,) False for padding samples
        logits = logits.float()
        k = min(5, logits.shape[-1])
        topk = logits.topk(k, dim=-1).indices  # (B, k)
        hit = (topk == labels.unsqueeze(1)) & real.unsqueeze(1)
        if loss == "sigmoid":
            onehot = F.one_hot(labels, logits.shape[-1]).float()
            l_each = F.binary_cross_entropy_with_logits(logits, onehot, reduction="none").sum(-1)
        else:
            l_each = F.cross_entropy(logits, labels, reduction="none")
        l_sum = torch.where(real, l_each, 0.0).sum()  # no boolean-mask indexing: no host sync
        totals += torch.stack([real.sum(), hit[:, 0].sum(), hit.any(1).sum(), l_sum]).to(torch.float64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals, group=group)
    model.train(was_training)
    n, top1, top5, l_sum = totals.tolist()
    if n == 0:
        return {}
    return {"val_top1": 100.0 * top1 / n, "val_top5": 100.0 * top5 / n, "val_loss": l_sum / n}
