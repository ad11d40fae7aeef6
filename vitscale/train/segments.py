"""One run across restarts: each start of the job that trains is a *segment* (the first, then one per
resume — after a preemption, a requeue, a crash). Every checkpoint records the segments so far, the
current one up to its step (``trainer_state.json``), so the run's summary, report and throughput
cover the whole run: the steps of each segment, its training time and img/s, how it ended, and the
totals. Steps a killed job made after its last checkpoint are trained again by the next segment and
are counted once, where they count: in the segment that resumed from that checkpoint.
"""

from __future__ import annotations

import datetime
import time
from typing import Any


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


class Segments:
    """The segments of a run: ``previous`` (from the checkpoint resumed) and the current one,
    started by :meth:`start` when the training loop begins."""

    def __init__(self):
        self.previous: list[dict[str, Any]] = []
        self.start_step, self.t0, self.started_at = 0, None, _now()
        self.ended: str | None = None  # how the current segment ends when it is saved (a signal's name)

    def start(self, step: int) -> int:
        """The training loop begins (a new segment) at ``step``; returns it."""
        self.start_step, self.t0, self.started_at = step, time.perf_counter(), _now()
        return step

    def elapsed(self) -> float:
        return 0.0 if self.t0 is None else time.perf_counter() - self.t0

    def current(self, step: int, ended: str | None = None) -> dict[str, Any]:
        seg = {"start_step": self.start_step, "end_step": step, "wall_time_s": round(self.elapsed(), 3),
               "started_at": self.started_at}  # fmt: skip
        if ended or self.ended:
            seg["ended"] = ended or self.ended
        return seg

    def state(self, step: int) -> list[dict[str, Any]]:
        """What a checkpoint at ``step`` records: the segments so far, the current one up to ``step``."""
        return [*self.previous, self.current(step)]

    def load(self, saved: Any, step: int) -> None:
        """The segments a checkpoint at ``step`` recorded (a checkpoint from before segments: one
        segment of unknown time up to ``step``)."""
        ok = isinstance(saved, list) and all(isinstance(s, dict) and isinstance(s.get("end_step"), int) for s in saved)
        self.previous = [dict(s) for s in saved] if ok and saved else [{"start_step": 0, "end_step": step}]
        self.start_step = step

    def summary(self, step: int, batch_size: int) -> tuple[list[dict[str, Any]], float]:
        """Every segment with its steps and img/s (the current one ``ended: finished``), and the
        training time of the whole run (segments of unknown time count 0)."""
        out = []
        for seg in [*self.previous, self.current(step, "finished")]:
            steps = seg["end_step"] - seg.get("start_step", 0)
            wall = seg.get("wall_time_s")
            row = {**seg, "steps": steps}
            if isinstance(wall, (int, float)) and wall > 0:
                row["img_per_s"] = steps * batch_size / wall
            out.append(row)
        total = sum(float(s.get("wall_time_s") or 0.0) for s in out)
        return out, total


__all__ = ["Segments"]
