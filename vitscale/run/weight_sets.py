"""Where a run's checkpoint keeps a weight set, by name: ``model`` (the family's model) and ``ema``
everywhere; the others are the sets a task's training module declares
(:attr:`vitscale.tasks.module.TrainModule.weight_sets`, e.g. a self-distillation teacher's backbone),
asked of the task the run folder's ``config.yaml`` names — so ``vitscale convert --key NAME`` and
``vitscale export --teacher`` name no task."""

from __future__ import annotations

import os
from pathlib import Path

from vitscale.checkpoint.discovery import is_step_folder, list_checkpoints
from vitscale.checkpoint.integrity import CheckpointError
from vitscale.errors import ConfigError

BUILT_IN = ("model", "ema")


def run_folder(path: str | os.PathLike) -> Path:
    """The run folder of a run folder, its ``checkpoints/`` folder or one of its step folders."""
    p = Path(path)
    if is_step_folder(p):
        return p.parent.parent
    return p.parent if p.name == "checkpoints" else p


def _has_checkpoint(p: Path) -> bool:
    return is_step_folder(p) or bool(list_checkpoints(p)) or bool(list_checkpoints(p / "checkpoints"))


def task_weight_sets(path: str | os.PathLike) -> dict[str, str]:
    """The weight sets (name -> path under the training module's parts) of the task of the run whose
    checkpoint is at ``path`` (its ``config.yaml``'s ``train.task``; none without one)."""
    from vitscale.safe_yaml import read_yaml
    from vitscale.tasks import get_task

    cfg_path = run_folder(path) / "config.yaml"
    if not cfg_path.is_file():
        return {}
    stored = read_yaml(cfg_path)
    name = (stored.get("train") or {}).get("task") if isinstance(stored, dict) else None
    return dict(get_task(name).weight_sets) if isinstance(name, str) and name else {}


def weight_set_prefix(path: str | os.PathLike, key: str) -> str | None:
    """The checkpoint prefix of weight set ``key`` of the run at ``path`` (None for :data:`BUILT_IN`,
    whose readers know it); one line when there is no checkpoint to read it from, or the run's task
    has no such set."""
    if key in BUILT_IN:
        return None
    from vitscale.tasks.module import PARTS_KEY

    p = Path(path)
    if not p.is_dir() or not _has_checkpoint(p):
        raise CheckpointError(f"{p}: no checkpoint to read the {key} from (a task keeps its own weight sets, such as a "
                              "self-distillation teacher, in its checkpoints only: train with checkpoint.every > 0)")  # fmt: skip
    sets = task_weight_sets(p)
    if key not in sets:
        have = ", ".join([*BUILT_IN, *sets])
        raise ConfigError(f"{p} has no {key!r} weights: its run's weight sets are {have}")
    return f"{PARTS_KEY}.{sets[key]}."


__all__ = ["BUILT_IN", "run_folder", "task_weight_sets", "weight_set_prefix"]
