"""Top-1 / top-5 accuracy and loss of a classifier over a (per-rank sharded) loader; the
``classification`` evaluator (``val_top1``, ``val_top5``, ``val_loss`` under its default name)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .evaluator import Evaluator, EvaluatorConfig, register_evaluator


def all_sum(totals: torch.Tensor, group=None) -> list[float]:
    """``totals`` summed over the data-parallel ranks (``group``; None = the world), read on the host."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals, group=group)
    return totals.tolist()


@torch.no_grad()
def count_top1(model: nn.Module, loader, ctx, hits) -> dict[str, float]:
    """``{"top1", "images"}`` over ``loader`` ({} without images), top-1 as ``hits(logits, batch)``
    counts it per batch (a pair of tensors: images counted, correct; ``batch``'s tensors on
    ``ctx.device``), summed over the ranks of ``ctx.group``; the model is left in the mode it had."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=ctx.device)  # images, correct
    for batch in loader:
        batch = {k: v.to(ctx.device, non_blocking=True) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        with ctx.autocast():
            logits = model(batch["image"])
        totals += torch.stack(hits(logits, batch)).to(torch.float64)
    model.train(was_training)
    n, correct = all_sum(totals, ctx.group)
    return {"top1": 100.0 * correct / n, "images": int(n)} if n else {}


@torch.no_grad()
def evaluate_classification(
    model: nn.Module, loader, device: torch.device | str, autocast=contextlib.nullcontext, loss: str = "softmax",
    group=None,
) -> dict[str, float]:  # fmt: skip
    """``{"top1", "top5"}`` in percent and ``loss`` (mean cross-entropy, or sigmoid cross-entropy
    summed over classes for ``loss="sigmoid"``), summed over the data-parallel ranks' shards
    (``group``; None = the world). Padding samples (index -1) are not counted."""
    was_training = model.training
    model.eval()
    device = torch.device(device)
    totals = torch.zeros(4, dtype=torch.float64, device=device)  # n, top1, top5, loss sum
    for batch in loader:
        images = batch["image"]  # (B, C, H, W), or a NaFlex batch's dict of tensors
        images = {k: v.to(device, non_blocking=True) for k, v in images.items()} if isinstance(images, dict) else images.to(device, non_blocking=True)
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
    model.train(was_training)
    n, top1, top5, l_sum = all_sum(totals, group)
    if n == 0:
        return {}
    return {"top1": 100.0 * top1 / n, "top5": 100.0 * top5 / n, "loss": l_sum / n}


@dataclass
class ClassificationConfig(EvaluatorConfig):
    """``kind: classification``: top-1 / top-5 accuracy and the loss of the model's own classifier."""

    loss: Literal["softmax", "sigmoid"] = "softmax"
    """The loss it reports: softmax (cross-entropy) | sigmoid (binary cross-entropy summed over classes)."""


class ClassificationEvaluator(Evaluator):
    config = ClassificationConfig
    default_name = "val"

    def __init__(self, cfg: ClassificationConfig, ctx):
        super().__init__(cfg, ctx)
        self.loader = ctx.data.loader(cfg.data, cfg.split, cfg.batch_size)

    def __call__(self, model):
        c = self.ctx
        return evaluate_classification(model, self.loader, c.device, autocast=c.autocast, loss=self.cfg.loss, group=c.group)


register_evaluator("classification", ClassificationEvaluator)
