"""Asynchronous checkpoints (``checkpoint.async_mode``, torchtitan's meanings) through
``torch.distributed.checkpoint.async_save`` with vitscale's own storage (safetensors + JSON).

``async``: the state is copied to CPU memory on the step loop (the only stall), then DCP's
background thread plans and writes it through :class:`~vitscale.checkpoint.storage.SafetensorsWriter`
while training goes on. ``async_pinned``: the same, into CPU buffers kept from one save to the next
(pinned memory on a GPU: faster device-to-host copies, no allocation per save). The writer is its own
stager (DCP's ``AsyncStager`` protocol, accepted by ``async_save`` since torch 2.4): a real copy on
every device — torch's default CPU offload hands a CPU tensor over as it is, and the optimizer would
change it under the writer.

What a synchronous save guarantees holds: the files are checksummed as they are written, the index is
sealed last and only then is the folder renamed to ``step_…`` (by the coordinator, in the background
thread, as part of the write: a job killed after the write keeps the checkpoint); a failed or
interrupted write leaves ``.tmp-step_…`` only, removed by the next save or run. The finite check
(no NaN / infinity in a checkpoint) runs on the staged copy in the background, before anything is
written (the planning step; a failure on any rank fails every rank's save). The background collectives
run on a gloo process group of their own, so they never interleave with the training's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.planner import SavePlan
from torch.distributed.checkpoint.staging import AsyncStager

from .state import NonFiniteWeights, nonfinite_names, some_names
from .storage import SafetensorsWriter


class StagingBuffers:
    """The CPU copies of one rank's state. ``keep``: reuse them from one save to the next
    (``async_pinned``; pinned when CUDA is available) instead of allocating them per save (``async``)."""

    def __init__(self, keep: bool):
        self.keep = keep
        self.cache: dict | None = None

    def stage(self, state_dict: dict) -> dict:
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        buffers = self.cache if self.keep else None
        if buffers is None:
            buffers = _create_cpu_state_dict(state_dict, pin_memory=self.keep and torch.cuda.is_available())
        _copy_state_dict(state_dict, buffers)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the copies are complete before the loop changes the state
        if self.keep:
            self.cache = buffers
        return buffers


class StagingWriter(SafetensorsWriter, AsyncStager):
    """A :class:`SafetensorsWriter` that stages the state itself (a copy, :class:`StagingBuffers`) and
    checks the staged copy finite when planning, in the background."""

    _synchronize_after_execute = False

    def __init__(self, path, rank: int, extra_files: dict[str, bytes] | None, buffers: StagingBuffers, final: Path,
                 publish=None):  # fmt: skip
        SafetensorsWriter.__init__(self, path, rank, extra_files, publish=publish)
        self.buffers, self.final, self.staged = buffers, final, None

    def stage(self, state_dict: dict) -> dict:
        self.staged = self.buffers.stage(state_dict)
        return self.staged

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        bad = nonfinite_names(self.staged, limit=4) if self.staged is not None else []
        if bad:
            raise NonFiniteWeights(f"not saving checkpoint {self.final}: non-finite values in {some_names(bad)}")
        return super().prepare_local_plan(plan)


@dataclass
class Pending:
    """A checkpoint being written in the background."""

    step: int
    tmp: Path
    final: Path
    future: Any


def nonfinite_failure(e: BaseException) -> NonFiniteWeights | None:
    """The finite check's refusal inside a DCP failure (of any rank), if that is what failed."""
    if isinstance(e, NonFiniteWeights):
        return e
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict):
        for exc in failures.values():
            found = nonfinite_failure(exc[0] if isinstance(exc, tuple) else exc)
            if found is not None:
                return found
    return None


__all__ = ["Pending", "StagingBuffers", "StagingWriter", "nonfinite_failure"]
