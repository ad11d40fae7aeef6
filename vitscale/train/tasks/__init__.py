"""Training tasks (classification, contrastive, token labeling) behind one registry."""

from .base import Task, get_task, list_tasks, register_task

__all__ = ["Task", "get_task", "list_tasks", "register_task"]
