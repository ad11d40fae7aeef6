"""What a task is: a loss over a batch and an evaluation over a loader.

The trainer never branches on a model's name: the family's default task (``FamilySpec.task``) or
``train.task`` picks a class from this registry. CLIP (contrastive) and token labeling register
their own tasks from their own modules.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vitscale.errors import ConfigError

_TASKS: dict[str, type[Task]] = {}
# Modules that register a task when imported (looked up lazily by name).
_TASK_MODULES = {
    "classification": "vitscale.tasks.classification",
    "contrastive": "vitscale.tasks.contrastive",
    "token_labeling": "vitscale.tasks.token_labeling",
}


class Task:
    """``Task(cfg, model, num_classes, dp_group)``; the trainer calls :meth:`loss` per micro-batch.

    ``dp_group``: the process group of the data-parallel ranks (``ParallelDims.dp_group()``; None =
    the world): losses that span the global batch and evaluations over sharded loaders combine over
    it. Attributes the trainer sets after construction: ``autocast`` (a zero-argument context factory
    for the forward pass) and ``device``.
    """

    name = "task"

    def __init__(self, cfg: Any, model: nn.Module, num_classes: int | None, dp_group=None):
        self.cfg = cfg
        self.num_classes = num_classes
        self.dp_group = dp_group
        self.autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
        self.device = torch.device("cpu")

    @classmethod
    def for_evaluation(cls, cfg: Any, model: nn.Module, num_classes: int | None, dp_group=None) -> Task:
        """The task that evaluates trained weights (``vitscale eval``): this one, unless training it
        needs more than the model and the data (token labeling evaluates as classification)."""
        return cls(cfg, model, num_classes, dp_group)

    def loss(self, model: nn.Module, batch: dict, step: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Mean loss of the (already on-device) micro-batch and detached metric tensors.

        ``step`` is a counter of micro-batches (keys per-batch randomness such as mixup)."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, loader) -> dict[str, float]:
        """Metrics over a whole (per-rank sharded) loader, reduced over the data-parallel ranks; keys
        ``val_*``. Every rank runs the same number of batches (padding samples, index -1, are not
        counted: see ``vitscale.data.sampler.EvalShardSampler``)."""
        raise NotImplementedError


def register_task(name: str, cls: type[Task]) -> None:
    _TASKS[name] = cls


def get_task(name: str) -> type[Task]:
    if name not in _TASKS and name in _TASK_MODULES:
        importlib.import_module(_TASK_MODULES[name])
    if name not in _TASKS:
        raise ConfigError(f"train.task: unknown task {name!r}; choose one of {', '.join(list_tasks())}")
    return _TASKS[name]


def list_tasks() -> list[str]:
    return sorted(set(_TASKS) | set(_TASK_MODULES))
