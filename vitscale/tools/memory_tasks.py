"""The parameters a self-supervised task adds to the model it trains, for ``vitscale memory --task``
(:func:`vitscale.tools.memory.estimate`), counted on the meta device from the very modules the task
builds: ``dino`` (:mod:`vitscale.tasks.dino`) the student's DINO / iBOT heads and mask token (trained)
and the EMA teacher, a copy of the backbone and of the heads (held, not trained); ``mae``
(:mod:`vitscale.tasks.mae`) the decoder (trained). Other tasks add nothing here."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

TASKS = ("dino", "mae")


def _count(module: nn.Module | None) -> int:
    return sum(p.numel() for p in module.parameters()) if module is not None else 0


def task_parameters(task: str | None, backbone: nn.Module, task_cfg: Any = None) -> tuple[int, int]:
    """``(trained, held)``: the parameters ``task`` adds to ``backbone`` (a model of the family, on the
    meta device or not) that the optimizer trains, and those it only holds (the teacher, backbone
    included). ``task_cfg``: the task's config group (``DinoConfig`` / ``MaeConfig``), its defaults if None."""
    if task == "dino":
        from vitscale.tasks.dino import DinoStudent
        from vitscale.tasks.dino_config import DinoConfig

        dc = task_cfg if task_cfg is not None else DinoConfig()
        with torch.device("meta"):
            student = DinoStudent(backbone.num_features, dc, dc.ibot_loss_weight > 0)
        return _count(student), _count(backbone) + _count(student.head) + _count(student.ibot_head)
    if task == "mae":
        from vitscale.tasks.mae import MaeDecoder
        from vitscale.tasks.mae_config import MaeConfig

        mc, cfg = (task_cfg if task_cfg is not None else MaeConfig()), backbone.cfg
        with torch.device("meta"):
            decoder = MaeDecoder(backbone.num_features, cfg.patch_dim**2 * cfg.num_channels, mc, cfg.norm_eps)
        return _count(decoder), 0
    return 0, 0


__all__ = ["TASKS", "task_parameters"]
