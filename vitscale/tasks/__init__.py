"""Tasks: what a run computes — the loss of a batch and the evaluation over a loader — one module per
task behind one registry (classification, contrastive, token labeling), each with its config group
(``contrastive_config.py``, ``token_labeling_config.py``) that ``vitscale.config.Config`` holds."""

from .base import Task, get_task, list_tasks, register_task

__all__ = ["Task", "get_task", "list_tasks", "register_task"]
