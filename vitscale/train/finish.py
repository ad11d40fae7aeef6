"""The end of a training run, one component: made when the trainer starts (the run's clock: its
``total_time_s`` and ``started_at``), it closes the run after its last step — the progress check, the
exported weights, ``summary.json``, the tracker's hyperparameters and ``report.html`` —, answers for a
finished run started again, and prints the end of the run. It reads only what it is handed: the
assembled run and the components of the loop (checkpoints, non-finite guard, metrics logger)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from vitscale.config import config_to_dict, flatten
from vitscale.tools.env import environment
from vitscale.tools.report import try_write_report

from .summary import finished_run, now, print_end, run_layout, run_summary, write_summary


class RunEnd:
    """``RunEnd()`` when the trainer starts; then :meth:`finish` after the last step (or
    :meth:`finished` for a finished run started again) and :meth:`print`."""

    def __init__(self):
        self.t0, self.started_at = time.perf_counter(), now()
        self.written: dict[str, bool] = {}  # outputs this run wrote at its end ("weights", "report"): the end lists only those
        self.tensorboard = False  # whether the run wrote TensorBoard events (set when the trainer's logger opens)

    def finish(self, run, checkpoints, guard, log, last_eval: dict) -> dict[str, Any]:
        """Close ``run`` after its last step (``checkpoints.counters``: the step and this segment): never
        exit 0 untrained, export the weights, write the summary (rank 0: with the skipped files, the
        hyperparameters for TensorBoard and the trackers, the report). Returns the summary."""
        cfg, counters = run.cfg, checkpoints.counters
        out, step, segment = Path(cfg.train.output_dir), counters.step, counters.segments
        wall = segment.elapsed()
        skips = run.loaders.skips()  # bad files (training and validation) and shards, over the ranks
        guard.require_progress(step, step - segment.start_step, checkpoints.last)
        checkpoints.export(out, step, cfg.model.name, run.model_overrides)
        self.written["weights"] = bool(cfg.checkpoint.export_safetensors)
        segments = segment.summary(step, cfg.train.batch_size)[0]
        summary = run_summary(cfg.model.name, step, wall=wall, steps_run=step - segment.start_step,
                              batch_size=cfg.train.batch_size, skips=skips, nonfinite_steps=guard.checked_total,
                              last_eval=last_eval, resumed_from=checkpoints.resumed_from,
                              total_time=time.perf_counter() - self.t0, started_at=self.started_at,
                              env=environment(run.device, run_layout(run)), segments=segments)  # fmt: skip
        if run.dims.is_main:
            write_summary(summary, out)
            if skips["skipped_files"] or skips["skipped_shards"]:
                log.info(f"skipped {skips['skipped_files']} bad files and {len(skips['skipped_shards'])} unreadable "
                         f"shards (see the warnings above)")  # fmt: skip
            log.log_hparams(flatten(config_to_dict(cfg)), dict(last_eval), summary)  # TensorBoard, trackers
            self.written["report"] = bool(cfg.log.report) and try_write_report(out) is not None
        return summary

    def finished(self, run, checkpoints) -> dict[str, Any]:
        """A finished run started again: says so on rank 0; its summary.json with this start's facts."""
        tc, counters = run.cfg.train, checkpoints.counters
        key = "train.max_steps" if tc.max_steps > 0 else "train.epochs"
        return finished_run(Path(tc.output_dir), counters.step, counters.total_steps, checkpoints.resumed_from, key,
                            run.dims.is_main)  # fmt: skip

    def print(self, run, summary: dict[str, Any], fmt: str, names: tuple[str, ...]) -> None:
        """Print the end of the run on rank 0: ``human`` (what the run gave and where its outputs are,
        ``names``: its evaluations), ``json`` (summary.json's contents) or ``none``."""
        if run.dims.is_main:
            # what this run wrote at its end; a finished run started again: what its folder holds
            print_end(summary, fmt, Path(run.cfg.train.output_dir), report=self.written.get("report", run.cfg.log.report),
                      tensorboard=self.tensorboard, names=names, weights=self.written.get("weights"))  # fmt: skip


__all__ = ["RunEnd"]
