"""The trainer's checkpoint component: the run's state as DCP ``Stateful`` components, the resume (or
``checkpoint.init_from``) at the start and the checkpoint schedule (every ``checkpoint.every`` steps
and at the end).

The state of a checkpoint (the format: :mod:`vitscale.checkpoint.checkpointer`) is assembled from its
components, never by hand: ``model`` and ``optim`` (:class:`vitscale.checkpoint.state.ModelState`,
:class:`~vitscale.checkpoint.state.OptimizerState`), ``ema`` (:class:`vitscale.train.ema.EMA`), the
trainer's counters with the data position (:class:`RunCounters`: ``trainer_state.json``) and each
rank's random number generators (:class:`~vitscale.checkpoint.state.RNGState`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from vitscale.checkpoint import Checkpointer, export_safetensors, load_model_weights, read_weights
from vitscale.checkpoint.state import ModelState, OptimizerState, RNGState

from .nonfinite import NonFiniteGuard


class RunCounters:
    """``Stateful`` of the trainer's counters and the training data's position (``data``: a
    resumable loader, itself ``Stateful``): what ``trainer_state.json`` holds."""

    def __init__(self, data: Any, total_steps: int):
        self.data, self.total_steps = data, total_steps
        self.step = self.skipped = self.nonfinite_steps = 0

    def state_dict(self) -> dict:
        return {"step": self.step, "data": self.data.state_dict(), "skipped": self.skipped,
                "nonfinite_steps": self.nonfinite_steps, "total_steps": self.total_steps}  # fmt: skip

    def load_state_dict(self, sd: dict) -> None:
        self.step, self.skipped = int(sd["step"]), int(sd.get("skipped", 0))
        self.nonfinite_steps = int(sd.get("nonfinite_steps", 0))
        self.data.load_state_dict(sd["data"])


class Checkpointing:
    """``cc``: the ``checkpoint`` config group; ``model``, ``optimizer``, ``ema`` (or None) and
    ``counters``: the components of the run's state."""

    def __init__(self, root: Path, cc: Any, model: nn.Module, optimizer, ema, counters: RunCounters):
        self.cc, self.counters = cc, counters
        self.checkpointer = Checkpointer(root, keep=cc.keep)
        self.tensors = {"model": ModelState(model), "optim": OptimizerState(model, optimizer)}
        if ema is not None:
            self.tensors["ema"] = ema
        self.rng = RNGState()
        self.last: str | None = None  # the newest checkpoint of this run
        self.resumed_from: str | None = None
        self.init_report: dict | None = None  # what checkpoint.init_from loaded

    def restore(self, model: nn.Module, ema) -> bool:
        """Resume from the newest intact checkpoint, or initialise the weights from
        ``checkpoint.init_from``. True when the newest checkpoint is the run's last step (a finished
        run: nothing loaded, nothing to train)."""
        latest = self.checkpointer.latest() if self.cc.resume else None
        if latest is not None:
            self.resumed_from = self.last = str(latest)
            step = int(latest.name.rsplit("_", 1)[1])
            if step >= self.counters.total_steps:
                self.counters.step = step
                return True
            self.checkpointer.load(latest, self.tensors, self.counters, self.rng)
            return False
        if self.cc.init_from:
            sd = read_weights(self.cc.init_from, "model")
            self.init_report = load_model_weights(model, sd, source=f"checkpoint.init_from={self.cc.init_from}")
            if ema is not None:
                ema.module.load_state_dict(model.state_dict())
        return False

    def due(self, step: int, last: bool) -> bool:
        return last or (self.cc.every > 0 and step % self.cc.every == 0)

    def save(self, step: int, guard: NonFiniteGuard) -> None:
        """Save the run's state at ``step``; a diverged run (over its non-finite budget) saves nothing more."""
        self.counters.nonfinite_steps = guard.check(step, self.last)
        self.last = str(self.checkpointer.save(step, self.tensors, self.counters, self.rng))


    def export(self, out: Path, step: int, name: str, overrides: dict) -> None:
        """The final weights as ``model.safetensors`` (and ``model_ema.safetensors``), their header naming
        the model and its resolved overrides (``checkpoint.export_safetensors``)."""
        if not self.cc.export_safetensors:
            return
        meta = {"model": name, "overrides": json.dumps(overrides), "step": str(step)}
        export_safetensors(self.tensors["model"].model, out / "model.safetensors", meta)
        if "ema" in self.tensors:
            export_safetensors(self.tensors["ema"].module, out / "model_ema.safetensors", meta)


__all__ = ["Checkpointing", "RunCounters"]
