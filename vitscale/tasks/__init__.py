"""Tasks: what a run computes — the loss of a batch, its config groups, its default evaluations and
the loss the bench times — one module per task behind one registry (classification, contrastive, MAE,
token labeling); see :mod:`vitscale.tasks.base`."""

from .base import Task, get_task, register_task, task_groups

__all__ = ["Task", "get_task", "register_task", "task_groups"]
