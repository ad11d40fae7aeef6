"""Learning-rate schedules as pure functions of the step (a resume needs only the step).

``step`` is the 1-based index of the optimizer update about to happen; the returned factor multiplies
the peak LR. All start with a linear warmup from ~0 (step 1 gets peak/warmup).
"""

from __future__ import annotations

import dataclasses
import math

from vitscale.config.schema import ScheduleConfig


def lr_factor(cfg: ScheduleConfig, step: int, total_steps: int, warmup_steps: int, peak_lr: float) -> float:
    """The LR at ``step`` divided by the peak LR."""
    w = max(warmup_steps, 0)
    if w and step <= w:
        if cfg.warmup_shape == "cosine":  # DINOv3's rising cosine: 0 at the first update, the peak at the w-th
            return (1.0 - math.cos(math.pi * (step - 1) / (w - 1))) / 2 if w > 1 else 1.0
        return step / w
    name = cfg.name
    if name == "cosine":  # then, over the last cooldown_steps, flat at min_lr (timm's --cooldown-epochs)
        floor = cfg.min_lr / peak_lr if peak_lr > 0 else 0.0
        span = max(total_steps - w - max(cfg.cooldown_steps, 0), 1)
        progress = min(max(step - w, 0) / span, 1.0)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if name == "rsqrt":
        # ViT-22B / big_vision: peak * sqrt(timescale / max(t, timescale)) with t counted after warmup,
        # then a linear cooldown to 0 over the last cooldown_steps.
        t = max(step - w, 0)
        ts = max(cfg.rsqrt_timescale, 1)
        f = math.sqrt(ts / max(t + ts, ts))
        return f * _cooldown(cfg, step, total_steps)
    if name == "constant":
        return _cooldown(cfg, step, total_steps)
    raise ValueError(f"unknown schedule {name!r} (cosine | rsqrt | constant)")


def _cooldown(cfg: ScheduleConfig, step: int, total_steps: int) -> float:
    c = cfg.cooldown_steps
    if c <= 0 or step <= total_steps - c:
        return 1.0
    return max(total_steps - step, 0) / c


def warmup_steps(cfg: ScheduleConfig, steps_per_epoch: int) -> int:
    if cfg.warmup_steps:
        return cfg.warmup_steps
    return int(round(cfg.warmup_epochs * steps_per_epoch))


def in_steps(cfg: ScheduleConfig, steps_per_epoch: int) -> ScheduleConfig:
    """``cfg`` with ``cooldown_epochs`` converted to ``cooldown_steps`` (when those are 0)."""
    if cfg.cooldown_steps or not cfg.cooldown_epochs:
        return cfg
    return dataclasses.replace(cfg, cooldown_steps=int(round(cfg.cooldown_epochs * steps_per_epoch)))


# A warmup takes at most this fraction of the run (see fit_warmup).
MAX_WARMUP_FRACTION = 0.5


def fit_warmup(warmup: int, total_steps: int) -> tuple[int, str | None]:
    """The warmup a run of ``total_steps`` uses, and a one-line notice when it differs from ``warmup``.

    A warmup is at most half the run (``MAX_WARMUP_FRACTION``), so the LR reaches its peak and the
    schedule then has the rest of the run to decay: a 100-step warmup in a 60-step run becomes 30
    steps (unfitted, its LR would still be rising at the last step, ending at 60% of the peak).
    """
    limit = max(int(total_steps * MAX_WARMUP_FRACTION), 1)
    if warmup <= limit:
        return warmup, None
    return limit, (
        f"schedule: a {warmup}-step warmup does not fit a {total_steps}-step run: using {limit} steps "
        f"(a warmup is at most half the run)"
    )


class Schedule:
    """A step's hyperparameters: every param group's LR set to ``initial_lr * factor(step)``, times what
    the run's training module schedules itself (``hyper``: :meth:`vitscale.tasks.module.TrainModule.hyper`,
    a factor per group's schedule key — DINO's frozen prototypes — and a weight-decay factor — DINOv2's
    cosine weight decay). :meth:`build` builds it from the ``schedule`` group."""

    def __init__(self, optimizer, cfg: ScheduleConfig, total_steps: int, warmup: int, peak_lr: float,
                 notice: str | None = None, hyper=None):  # fmt: skip
        self.optimizer, self.cfg, self.total, self.warmup, self.peak = optimizer, cfg, total_steps, warmup, peak_lr
        self.notice = notice  # the warmup fitted to the run, when it was (fit_warmup)
        self.hyper = hyper

    @classmethod
    def build(cls, sc: ScheduleConfig, *, optimizer, peak_lr: float, steps_per_epoch: int, total_steps: int,
              hyper=None) -> Schedule:  # fmt: skip
        """The schedule of the ``schedule`` group ``sc`` over a run of ``total_steps`` (``steps_per_epoch``
        a pass of its data) for ``optimizer`` at ``peak_lr``, with the training module's own ``hyper``;
        epochs converted to steps, the warmup fitted to the run (:attr:`notice`)."""
        warmup, notice = fit_warmup(warmup_steps(sc, steps_per_epoch), total_steps)
        return cls(optimizer, in_steps(sc, steps_per_epoch), total_steps, warmup, peak_lr, notice, hyper)

    def factor(self, step: int) -> float:
        return lr_factor(self.cfg, step, self.total, self.warmup, self.peak)

    def apply(self, step: int) -> float:
        """Set the LR (and, when the module schedules it, the weight decay) for optimizer update number
        ``step`` (1-based); returns the peak group's LR."""
        f = self.factor(step)
        own = self.hyper(step) if self.hyper is not None else None
        for g in self.optimizer.param_groups:
            g["lr"] = g["initial_lr"] * f * (own.lr.get(g.get("schedule"), 1.0) if own is not None else 1.0)
            if own is not None and own.weight_decay != 1.0:
                g["weight_decay"] = g.setdefault("initial_weight_decay", g["weight_decay"]) * own.weight_decay
        return self.peak * f
