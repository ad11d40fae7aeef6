"""Training: the trainer, tasks, optimizers, LR schedules, EMA and run logging."""

from .trainer import Trainer, train

__all__ = ["Trainer", "train"]
