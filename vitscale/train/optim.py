"""Optimizers with per-group weight decay, and the LR scaling rule.

Groups: ``decay`` (the body's matrices), ``no_decay`` (norms, biases, 1-D params and the model's
``no_weight_decay()`` names: position embeddings, tokens), ``head`` (the classifier from the model's
``head_parameter_names()``, with ``optim.head_weight_decay`` — ViT-22B decouples head and body decay).
A run's training module (:class:`vitscale.tasks.module.TrainModule`) declares its parameter groups
(:meth:`~vitscale.tasks.module.TrainModule.param_groups`): the backbone's are split as above (and by
``optim.layer_decay``), each of a task's own (DINO's prototypes) into ``<kind>.<name>`` groups with its
learning-rate and weight-decay multipliers and its schedule key.
"""

from __future__ import annotations

import torch
from torch import nn

from vitscale.config.schema import OptimConfig
from vitscale.errors import ConfigError
from vitscale.tasks.module import ParamGroup, as_train_module

from .fastpath import optimizer_impl
from .finetune import layer_decay_groups, plain_name
from .lamb import Lamb


def scaled_lr(cfg: OptimConfig, global_batch: int) -> float:
    """lr = base_lr * global_batch / lr_scale_batch (the linear scaling rule); no scaling if 0."""
    if cfg.lr_scale_batch and cfg.lr_scale_batch > 0:
        return cfg.lr * global_batch / cfg.lr_scale_batch
    return cfg.lr


def param_groups(model: nn.Module, weight_decay: float, head_weight_decay: float | None) -> list[dict]:
    """Parameter groups named ``decay`` / ``no_decay`` / ``head`` of a family's model (empty groups left out)."""
    return _split(ParamGroup("", list(model.named_parameters()), backbone=True), model, weight_decay, head_weight_decay)


def _split(group: ParamGroup, model: nn.Module | None, weight_decay: float, head_weight_decay: float | None) -> list[dict]:
    """``group`` split by weight decay: ``decay``, ``no_decay`` (1-D, biases, and with ``model`` the
    backbone's ``no_weight_decay()`` names) and ``head`` (``model``'s ``head_parameter_names()``), each
    ``<kind>.<group name>`` for a task's own group."""
    skip = set(model.no_weight_decay()) if model is not None else set()
    head = set(model.head_parameter_names()) if model is not None else set()
    kinds: dict[str, list] = {"decay": [], "no_decay": [], "head": []}
    for name, p in group.params:
        if not p.requires_grad:
            continue
        n = plain_name(name)
        if p.ndim <= 1 or n.endswith(".bias") or n in skip or any(n.startswith(s + ".") for s in skip):
            kind = "no_decay"  # norms, biases, gains, tokens, position embeddings
        elif n in head:
            kind = "head"
        else:
            kind = "decay"
        kinds[kind].append(p)
    hwd = weight_decay if head_weight_decay is None else head_weight_decay
    decays = {"decay": weight_decay, "no_decay": 0.0, "head": hwd}
    out = []
    for k, v in kinds.items():
        if not v:
            continue
        g = {"name": k if not group.name else f"{k}.{group.name}", "params": v, "weight_decay": decays[k] * group.wd_scale}
        if group.lr_scale != 1.0:
            g["lr_scale"] = group.lr_scale
        if group.schedule is not None:
            g["schedule"] = group.schedule
        out.append(g)
    return out


def build_optimizer(model: nn.Module, cfg: OptimConfig, lr: float) -> torch.optim.Optimizer:
    """AdamW / Adam / SGD / LAMB over the groups ``model`` declares (a training module's
    :meth:`~vitscale.tasks.module.TrainModule.param_groups`; a family's model: its own), each split by
    weight decay (:func:`_split`); the backbone's also by layer with ``optim.layer_decay``
    (:func:`vitscale.train.finetune.layer_decay_groups`). Each group remembers ``initial_lr`` = its peak
    LR (the peak LR x its ``lr_scale``) and ``initial_weight_decay``."""
    module = as_train_module(model)
    groups = []
    for group in module.param_groups():
        backbone = module.backbone if group.backbone else None
        split = _split(group, backbone, cfg.weight_decay, cfg.head_weight_decay)
        if backbone is not None and cfg.layer_decay:
            split = layer_decay_groups(backbone, split, cfg.layer_decay)
        groups += split
    if not groups:
        raise ConfigError("nothing to train: every parameter is frozen (model.freeze, clip.lock_image / lock_text)")
    for g in groups:
        g["lr"] = g["initial_lr"] = lr * g.get("lr_scale", 1.0)
        g["initial_weight_decay"] = g["weight_decay"]
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
