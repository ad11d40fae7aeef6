"""Training: the loop (``Trainer``) with its optimizers, LR schedules, EMA, run logging and the fast
path (autocast, SDPA backends, per-block compile, fused optimizers); evaluating trained weights."""

from .trainer import Trainer, train

__all__ = ["Trainer", "train"]
