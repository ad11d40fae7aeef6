"""Image classification: softmax cross-entropy (+ label smoothing) or sigmoid cross-entropy (ViT-22B),
with mixup / cutmix soft targets from ``vitscale.data.mixup``, and DeiT's online distillation from a
teacher (``distill.*``: :mod:`vitscale.tasks.distill`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitscale.data.mixup import Mixup, smooth_one_hot

from .base import Task, register_task
from .distill_config import ClassificationConfig
from .module import TrainModule


def classification_loss(logits: torch.Tensor, target: torch.Tensor, kind: str, smoothing: float, *,
                        bce_sum: bool = True, bce_target_thresh: float | None = None) -> torch.Tensor:  # fmt: skip
    """``target``: class indices ``(B,)`` or soft targets ``(B, K)``. Returns the batch mean. ``sigmoid``:
    summed over the classes (``bce_sum``; big_vision's ``sigmoid_xent``, ViT-22B) or averaged over them
    too (torch's ``BCEWithLogitsLoss()``: DeiT III); ``bce_target_thresh``: targets above it become 1,
    the others 0 (timm's ``--bce-target-thresh``; DeiT III binarises its mixed targets at 0)."""
    logits = logits.float()
    if kind == "softmax":
        if target.ndim == 1:
            return F.cross_entropy(logits, target, label_smoothing=smoothing)
        return F.cross_entropy(logits, target)
    if kind == "sigmoid":
        if target.ndim == 1:
            target = smooth_one_hot(target, logits.shape[-1], smoothing)
        if bce_target_thresh is not None:
            target = (target > bce_target_thresh).to(logits.dtype)
        each = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
        return each.sum(-1).mean() if bce_sum else each.mean()
    raise ValueError(f"unknown classification loss {kind!r} (softmax | sigmoid)")


class ClassificationTask(Task):
    """Its evaluation: ``classification`` on the val split (``val_top1``, ``val_top5``, ``val_loss``, the
    loss of ``train.loss``); the bench times softmax cross-entropy (:meth:`Task.bench_loss`)."""

    name = "classification"
    config = ClassificationConfig

    def __init__(self, cfg, model: nn.Module, num_classes: int | None, dp_group=None, class_names=None):
        super().__init__(cfg, model, num_classes, dp_group, class_names)
        self.kind = cfg.train.loss
        self.smoothing = cfg.train.label_smoothing
        self.bce = {"bce_sum": cfg.train.bce_sum, "bce_target_thresh": cfg.train.bce_target_thresh}
        d = cfg.data
        self.mixup = None
        if d.mixup_alpha > 0 or d.cutmix_alpha > 0:
            self.mixup = Mixup(
                mixup_alpha=d.mixup_alpha, cutmix_alpha=d.cutmix_alpha, prob=d.mixup_prob,
                switch_prob=d.mixup_switch_prob, label_smoothing=self.smoothing, num_classes=num_classes,
                seed=cfg.train.seed,
            )  # fmt: skip
        self.distill = None

    def build(self, run):
        """The model; with ``distill.teacher``, the teacher (DeiT distillation), which must predict the
        data's classes."""
        if not self.cfg.distill.teacher:
            return TrainModule(self.model)
        from .distill import build

        self.distill = build(run, self.cfg.distill, self.autocast, classes=True)
        return TrainModule(self.model, notices=self.distill.lines)

    def step_times(self):
        return self.distill.step_times() if self.distill is not None else {}

    def loss(self, model, batch, step):
        images, labels = batch["image"], batch["label"]
        target = labels
        if self.mixup is not None:
            images, target = self.mixup(images, labels, step, grid=batch.get("grid"))  # grid: NaFlex batches
        if self.distill is not None:  # the teacher sees the mixed images too (DeiT)
            base = lambda logits, t: classification_loss(logits, t, self.kind, self.smoothing, **self.bce)  # noqa: E731
            return self.distill.classification_loss(model, images, target, labels, base, self.autocast,
                                                    step // self.cfg.train.grad_accum + 1)  # the optimizer step
        with self.autocast():
            logits = model(images)
        loss = classification_loss(logits, target, self.kind, self.smoothing, **self.bce)
        metrics = {}
        if target.ndim == 1:
            metrics["train_top1"] = (logits.detach().argmax(-1) == labels).float().mean() * 100
        return loss, metrics


register_task(ClassificationTask)
