"""The trainer's checkpoint component: the run's state as DCP ``Stateful`` components, the resume (or
``checkpoint.init_from``) at the start and the checkpoint schedule (every ``checkpoint.every`` steps
and at the end).

The state of a checkpoint (the format: :mod:`vitscale.checkpoint.checkpointer`) is assembled from its
components, never by hand: ``model`` (the family's model, the training module's backbone), ``task``
(the training module's parts, when it has any: :mod:`vitscale.tasks.module`) and ``optim``
(:class:`vitscale.checkpoint.state.ModelState`, :class:`~vitscale.checkpoint.state.OptimizerState` of
the training module), ``ema`` (:class:`vitscale.train.ema.EMA`), the trainer's counters with the data
position (:class:`RunCounters`: ``trainer_state.json``) and each rank's random number generators
(:class:`~vitscale.checkpoint.state.RNGState`).

``checkpoint.init_from`` is read into the family's model before the task builds its training module
(:meth:`Checkpointing.initialise`), so that what the task derives from the backbone (DINO's teacher,
a copy of the student) and the run's EMA start from those weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn

from vitscale.checkpoint import Checkpointer, export_safetensors
from vitscale.checkpoint.state import ModelState, OptimizerState, RNGState
from vitscale.interop.pretrained import load_pretrained
from vitscale.tasks.module import PARTS_KEY, TrainModule

from .nonfinite import NonFiniteGuard
from .segments import Segments


class RunCounters:
    """``Stateful`` of the trainer's counters and the training data's position (``data``: a
    resumable loader, itself ``Stateful``): what ``trainer_state.json`` holds, with the run's segments
    so far (:class:`~vitscale.train.segments.Segments`: one per start of the job, for the summary)."""

    def __init__(self, data: Any, total_steps: int):
        self.data, self.total_steps = data, total_steps
        self.step = self.skipped = self.nonfinite_steps = 0
        self.segments = Segments()

    def state_dict(self) -> dict:
        return {"step": self.step, "data": self.data.state_dict(), "skipped": self.skipped,
                "nonfinite_steps": self.nonfinite_steps, "total_steps": self.total_steps,
                "segments": self.segments.state(self.step)}  # fmt: skip

    def load_state_dict(self, sd: dict) -> None:
        self.step, self.skipped = int(sd["step"]), int(sd.get("skipped", 0))
        self.nonfinite_steps = int(sd.get("nonfinite_steps", 0))
        self.segments.load(sd.get("segments"), self.step)
        self.data.load_state_dict(sd["data"])


class Checkpointing:
    """``cc``: the ``checkpoint`` config group; ``counters``: the trainer's counters. Built before the
    training module (:meth:`initialise` reads ``checkpoint.init_from`` into the family's model), then
    given the run's state (:meth:`track`: the training module, the optimizer, the EMA) and resumed
    (:meth:`restore`). :meth:`build` builds it from the ``checkpoint`` group."""

    def __init__(self, root: Path, cc: Any, counters: RunCounters):
        self.cc, self.counters = cc, counters
        self.remote = None  # checkpoint.remote: rank 0 (the coordinator, which publishes each checkpoint) uploads
        if cc.remote and (not dist.is_initialized() or dist.get_rank() == 0):
            from vitscale.checkpoint.remote import RemoteMirror

            self.remote = RemoteMirror(cc.remote, root.parent, cc.keep, wait_s=cc.remote_wait_s)
        self.checkpointer = Checkpointer(root, keep=cc.keep, async_mode=cc.async_mode, remote=self.remote)
        self.tensors: dict[str, Any] = {}
        self.rng = RNGState()
        self.last: str | None = None  # the newest checkpoint of this run
        self.resumed_from: str | None = None
        self.init_lines: list[str] = []  # what loading it did, a line each (every rank)
        self._latest: list = []  # the newest intact checkpoint, looked for once (collective)

    @classmethod
    def build(cls, cc: Any, *, output_dir: str | Path, counters: RunCounters) -> Checkpointing:
        """The checkpoint component of a run: its ``checkpoint`` group ``cc``, writing under
        ``<output_dir>/checkpoints``, with the trainer's ``counters``."""
        return cls(Path(output_dir) / "checkpoints", cc, counters)

    def latest(self) -> Path | None:
        """The checkpoint a resume starts from (``checkpoint.resume``), looked for once; None if none."""
        if not self._latest:
            self._latest.append(self.checkpointer.latest() if self.cc.resume else None)
        return self._latest[0]

    def initialise(self, model: nn.Module) -> list[str]:
        """Read ``checkpoint.init_from`` into the family's ``model`` unless the run resumes (any weights
        a user has: :mod:`vitscale.interop.pretrained`; rank 0 reads, every rank gets its shard).
        Returns what loading did, a line each."""
        if self.latest() is None and self.cc.init_from:
            _, self.init_lines, _ = load_pretrained(model, self.cc.init_from, self.cc.init_format, from_rank0=True)
        return self.init_lines

    def initialise_parts(self, module: TrainModule) -> list[str]:
        """Read ``checkpoint.init_parts`` of the training ``module`` from ``checkpoint.init_from``'s
        checkpoint (``task.<part>.*``; its tensors checked against the module's up front,
        :func:`vitscale.run.checks.check_init_parts`) unless the run resumes: every tensor of each part
        from the checkpoint, strictly (position embeddings resampled by the backbone's own hook), rank 0
        reading and every rank getting its shard. The optimizer and the step counter are not read: they
        start afresh, as a stage of DINOv3 does (``dinov3/train/train.py`` ``do_train`` lines 389-414:
        only the run's own checkpoints are resumed). Returns what loading did, a line each."""
        parts = tuple(self.cc.init_parts)
        if not parts or self.latest() is not None:
            return []
        from vitscale.checkpoint import load_model_weights
        from vitscale.checkpoint.weights import read_weights

        given = self.cc.init_from
        reads = not dist.is_initialized() or dist.get_rank() == 0
        sd = read_weights(given, PARTS_KEY, prefix=f"{PARTS_KEY}.") if reads else None
        lines = []
        for part in parts:
            own = module.parts[part].state_dict()
            mine, unused = None, 0
            if sd is not None:  # the part's own tensors; what this run's part has not (an iBOT head it builds none of) stays
                theirs = {k[len(part) + 1 :]: v for k, v in sd.items() if k.startswith(f"{part}.")}
                mine = {k: v for k, v in theirs.items() if k in own}
                unused = len(theirs) - len(mine)
            load_model_weights(module.parts[part], mine, strict=True, source=f"checkpoint.init_from={given} ({part})",
                               from_rank0=True)  # fmt: skip
            left = f"; {unused} of its tensors this run has no use for left out" if unused else ""
            lines.append(f"checkpoint.init_parts: {part} ({len(own)} tensors) from {given}{left}")
        return lines + module.parts_initialised(parts)

    def track(self, module: TrainModule, optimizer, ema=None) -> None:
        """The state this component saves and resumes: the training ``module`` (``model``: its backbone;
        ``task``: its parts), the ``optimizer``'s state keyed by the same names (the backbone's own,
        the parts' ``task.*``), the ``ema`` (or None)."""
        # the optimizer state keyed as the checkpoint keys the weights: the backbone's own names, the parts' task.*
        renames = {"backbone.": "", "parts.": f"{PARTS_KEY}."}
        self.tensors = {"model": ModelState(module.backbone), "optim": OptimizerState(module, optimizer, renames)}
        if len(module.parts):
            self.tensors[PARTS_KEY] = ModelState(module.parts)
        if ema is not None:
            self.tensors["ema"] = ema

    def restore(self) -> bool:
        """Resume from the newest intact checkpoint (if any). True when it is the run's last step (a
        finished run: nothing loaded, nothing to train)."""
        latest = self.latest()
        if latest is None:
            return False
        self.resumed_from = self.last = str(latest)
        step = int(latest.name.rsplit("_", 1)[1])
        if step >= self.counters.total_steps:
            self.counters.step = step
            return True
        self.checkpointer.load(latest, self.tensors, self.counters, self.rng)
        return False

    def due(self, step: int, last: bool) -> bool:
        return last or (self.cc.every > 0 and step % self.cc.every == 0)

    def save(self, step: int, guard: NonFiniteGuard) -> None:
        """Save the run's state at ``step``; a diverged run (over its non-finite budget) saves nothing more."""
        self.counters.nonfinite_steps = guard.check(step, self.last)
        self._written(self.checkpointer.save(step, self.tensors, self.counters, self.rng))

    def wait(self) -> None:
        """Wait for a checkpoint still being written (``checkpoint.async_mode``); raises if it failed."""
        self._written(self.checkpointer.wait())

    def settle(self) -> None:
        """On the way out of a run, however it ends: let a checkpoint being written finish (it may be
        the newest intact one), saying so when it cannot; then mirror the run files a last time."""
        try:
            self.wait()
        except Exception as e:  # the run is failing already: its own error is the one to report
            from vitscale.errors import describe

            why = (describe(e) or (str(e).strip().splitlines() or [type(e).__name__],))[0]
            print(f"vitscale: the checkpoint being written in the background was not completed: {why}", flush=True)
        if self.remote is not None:
            self.remote.sync_run_files()
            self.checkpointer.prune()  # a checkpoint kept while it was uploaded goes once its upload ended

    def __enter__(self) -> Checkpointing:
        return self

    def __exit__(self, *exc) -> None:
        """The training loop is over, however it ended: :meth:`settle`."""
        self.settle()

    def _written(self, path) -> None:
        if path is not None:
            self.last = str(path)

    def export(self, out: Path, step: int, name: str, overrides: dict) -> None:
        """The final weights as ``model.safetensors`` (and ``model_ema.safetensors``), their header naming
        the model and its resolved overrides (``checkpoint.export_safetensors``)."""
        self.wait()
        if not self.cc.export_safetensors:
            return
        meta = {"model": name, "overrides": json.dumps(overrides), "step": str(step)}
        export_safetensors(self.tensors["model"].model, out / "model.safetensors", meta)  # the backbone
        if "ema" in self.tensors:
            export_safetensors(self.tensors["ema"].module, out / "model_ema.safetensors", meta)


__all__ = ["Checkpointing", "RunCounters"]
