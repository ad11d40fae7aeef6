"""Optimizers with per-group weight decay, and the LR scaling rule.

Groups: ``decay`` (the body's matrices), ``no_decay`` (norms, biases, 1-D params and the model's
``no_weight_decay()`` names: position embeddings, tokens), ``head`` (the classifier from the model's
``head_parameter_names()``, with ``optim.head_weight_decay`` — ViT-22B decouples head and body decay).
A parameter with the attribute :data:`OWN_GROUP` (a tag a task sets, e.g. DINO's prototypes, whose
learning rate it schedules itself) goes to a group ``<kind>.<tag>`` of its own, with its kind's decay.
"""

from __future__ import annotations

import torch
from torch import nn

from vitscale.config.schema import OptimConfig
from vitscale.errors import ConfigError

from .fastpath import optimizer_impl
from .finetune import layer_decay_groups, plain_name
from .lamb import Lamb


def scaled_lr(cfg: OptimConfig, global_batch: int) -> float:
    """lr = base_lr * global_batch / lr_scale_batch (the linear scaling rule); no scaling if 0."""
    if cfg.lr_scale_batch and cfg.lr_scale_batch > 0:
        return cfg.lr * global_batch / cfg.lr_scale_batch
    return cfg.lr


OWN_GROUP = "optim_group"


def param_groups(model: nn.Module, weight_decay: float, head_weight_decay: float | None) -> list[dict]:
    """Parameter groups named ``decay`` / ``no_decay`` / ``head`` (empty groups left out)."""
    skip = set(model.no_weight_decay())
    head = set(model.head_parameter_names())
    groups: dict[str, list] = {"decay": [], "no_decay": [], "head": []}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        n = plain_name(name)
        if p.ndim <= 1 or n.endswith(".bias") or n in skip or any(n.startswith(s + ".") for s in skip):
            kind = "no_decay"  # norms, biases, gains, tokens, position embeddings
        elif n in head:
            kind = "head"
        else:
            kind = "decay"
        tag = getattr(p, OWN_GROUP, None)
        groups.setdefault(kind if tag is None else f"{kind}.{tag}", []).append(p)
    hwd = weight_decay if head_weight_decay is None else head_weight_decay
    decays = {"decay": weight_decay, "no_decay": 0.0, "head": hwd}
    return [{"name": k, "params": v, "weight_decay": decays[k.split(".")[0]]} for k, v in groups.items() if v]


def build_optimizer(model: nn.Module, cfg: OptimConfig, lr: float) -> torch.optim.Optimizer:
    """AdamW / Adam / SGD / LAMB over :func:`param_groups` (split by layer with ``optim.layer_decay``:
    :func:`vitscale.train.finetune.layer_decay_groups`). Each group remembers ``initial_lr`` = its
    peak LR (the peak LR x its ``lr_scale``)."""
    groups = param_groups(model, cfg.weight_decay, cfg.head_weight_decay)
    if cfg.layer_decay:
        groups = layer_decay_groups(model, groups, cfg.layer_decay)
    if not groups:
        raise ConfigError("nothing to train: every parameter is frozen (model.freeze, clip.lock_image / lock_text)")
    for g in groups:
        g["lr"] = g["initial_lr"] = lr * g.get("lr_scale", 1.0)
    name = cfg.name.lower()
    if name == "adamw":
        cls, kw = torch.optim.AdamW, {"betas": tuple(cfg.betas), "eps": cfg.eps}
    elif name == "adam":
        cls, kw = torch.optim.Adam, {"betas": tuple(cfg.betas), "eps": cfg.eps}
    elif name == "sgd":
        cls, kw = torch.optim.SGD, {"momentum": cfg.momentum, "nesterov": cfg.nesterov}
    elif name == "lamb":  # one implementation (no fused / foreach choice): vitscale.train.lamb
        return Lamb(groups, lr=lr, betas=tuple(cfg.betas), eps=cfg.eps)
    else:
        raise ValueError(f"unknown optimizer {cfg.name!r} (adamw | adam | sgd | lamb)")
    devices = {p.device.type for g in groups for p in g["params"]}
    return cls(groups, lr=lr, **kw, **optimizer_impl(cfg.fused, devices))
