"""Top-1 / top-5 accuracy and loss of a classifier over a (per-rank sharded) loader."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def evaluate_classification(
    model: nn.Module, loader, device: torch.device | str, autocast=contextlib.nullcontext, loss: str = "softmax"
) -> dict[str, float]:
    """``{"val_top1", "val_top5"}`` in percent and ``val_loss`` (mean cross-entropy, or sigmoid
    cross-entropy summed over classes for ``loss="sigmoid"``), summed over all ranks' shards."""
    was_training = model.training
    model.eval()
    device = torch.device(device)
    totals = torch.zeros(4, dtype=torch.float64, device=device)  # n, top1, top5, loss sum
    for batch in loader:
        images = batch["image"].to(device, non_blocking=True)
        labels = batch["label"].to(device, non_blocking=True)
        with autocast():
            logits = model(images)
        logits = logits.float()
        k = min(5, logits.shape[-1])
        topk = logits.topk(k, dim=-1).indices  # (B, k)
        hit = topk == labels.unsqueeze(1)
        if loss == "sigmoid":
            onehot = F.one_hot(labels, logits.shape[-1]).float()
            l_sum = F.binary_cross_entropy_with_logits(logits, onehot, reduction="none").sum()
        else:
            l_sum = F.cross_entropy(logits, labels, reduction="sum")
        totals += torch.stack(
            [torch.tensor(float(labels.numel()), device=device), hit[:, 0].sum(), hit.any(1).sum(), l_sum]
        ).to(torch.float64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals)
    model.train(was_training)
    n, top1, top5, l_sum = totals.tolist()
    if n == 0:
        return {}
    return {"val_top1": 100.0 * top1 / n, "val_top5": 100.0 * top5 / n, "val_loss": l_sum / n}


def evaluate_checkpoint(cfg, path, *, ema: bool = False) -> dict:
    """Build the config's model, load weights from ``path`` (DCP checkpoint, run folder or
    .safetensors) and evaluate it on the config's val split (one process)."""
    from vitscale.checkpoint.checkpointer import load_model_weights, read_weights
    from vitscale.data import build_loaders
    from vitscale.models.registry import create_model, get_model_config
    from vitscale.train.trainer import _resolve_model_overrides, autocast_factory, resolve_device

    device = resolve_device(cfg.train.device)
    base = get_model_config(cfg.model.name, **cfg.model.overrides)
    img = cfg.data.img_size
    img_size = (img, img) if img else (getattr(base, "img_h", 224), getattr(base, "img_w", 224))
    loaders = build_loaders(
        cfg.data, img_size=img_size, num_channels=getattr(base, "num_channels", 3), seed=cfg.train.seed,
        micro_batch_size=1, eval_batch_size=cfg.eval.batch_size, device=device,
    )  # fmt: skip
    if loaders.val is None:
        raise FileNotFoundError("the config has no validation data (set data.val_path or data.val_split)")
    num_classes = cfg.data.num_classes or loaders.num_classes
    model = create_model(cfg.model.name, device=device, **_resolve_model_overrides(cfg, num_classes, img_size))
    report = load_model_weights(model, read_weights(path, "ema" if ema else "model"), strict=True)
    from vitscale.models.registry import get_family

    task_name = cfg.train.task or get_family(cfg.model.name).task
    if cfg.eval.probe != "none":  # a linear / few-shot probe on frozen features instead of the head
        from vitscale.eval.probe import run_probe

        res = run_probe(cfg, model, loaders, device, autocast=autocast_factory(cfg, device))
    elif task_name == "contrastive":  # zero-shot / retrieval through the contrastive task (clip engineer)
        from vitscale.tasks import get_task

        task = get_task(task_name)(cfg, model, num_classes)
        task.device, task.autocast = device, autocast_factory(cfg, device)
        res = task.evaluate(model, loaders.val)
    else:
        res = evaluate_classification(model, loaders.val, device, autocast=autocast_factory(cfg, device), loss=cfg.train.loss)
    return {"checkpoint": str(path), "ema": ema, **res, **({"load": report} if any(report.values()) else {})}
