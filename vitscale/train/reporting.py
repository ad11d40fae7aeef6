"""What a run reports, one component: the log step (:mod:`.logstep`: which steps log, their records),
the metrics logger (:mod:`.metrics`: metrics.jsonl, TensorBoard, the terminal; its trackers,
:mod:`.trackers`: report.html, W&B, MLflow), what the run warned about, and the run's end — the
progress check, the exported weights, ``summary.json`` (:mod:`.summary`), the trackers'
hyperparameters and ``report.html`` — and the end-of-run lines.

:class:`Reporting` is built from the ``log`` group and the named objects it reports on
(:meth:`Reporting.build`), never from the whole run; the loop calls :meth:`~Reporting.step`,
:meth:`~Reporting.due`, :meth:`~Reporting.record` and :meth:`~Reporting.log`, and
:meth:`~Reporting.finish` after the last step. The run's clock (:class:`RunClock`: ``total_time_s``,
``started_at``) starts when the trainer does, before the run is assembled.

**What a run warned about is in its summary**: every warning line — a task's collapse warnings
(``Task.log_metrics``, :mod:`vitscale.tasks.health`), steps not applied for a non-finite loss, the
files and shards the loader skipped, and what vitscale's loggers warned while the loop ran — is kept
(:data:`MAX_WARNINGS` of them, then their count) and written to ``summary.json``'s ``warnings`` and
the end-of-run lines, besides the terminal and train.log.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from vitscale.config import config_to_dict, flatten
from vitscale.tools.env import environment
from vitscale.tools.report import try_write_report

from .logstep import LogStep, StepCost
from .metrics import MetricsLogger
from .summary import finished_run, now, print_end, run_summary, write_summary

MAX_WARNINGS = 50
"""Warning lines a summary keeps (the first ones; then ``warnings_more``: how many more there were)."""


class RunClock:
    """The run's clock, started when the trainer starts: ``total_time_s`` (building, the loop,
    evaluations and export) and ``started_at``."""

    def __init__(self):
        self.t0, self.started_at = time.perf_counter(), now()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


class Warnings(logging.Handler):
    """The warning lines of a run, in order (at most :data:`MAX_WARNINGS`, then a count); also a
    logging handler, attached to vitscale's logger while the loop runs."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []
        self.more = 0

    def add(self, line: str) -> None:
        if len(self.lines) < MAX_WARNINGS:
            self.lines.append(line)
        else:
            self.more += 1

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.add(record.getMessage())
        except Exception:  # noqa: BLE001 - logging must never end a run
            self.handleError(record)

    def into(self, summary: dict[str, Any]) -> dict[str, Any]:
        """``summary`` with ``warnings`` (and ``warnings_more``) when there were any."""
        if self.lines:
            summary["warnings"] = list(self.lines)
        if self.more:
            summary["warnings_more"] = self.more
        return summary


class Reporting:
    """What a run reports (module docstring). ``log``: the metrics logger (:attr:`logger`); ``logstep``: the log step;
    ``config``: the run's settings (summarised, and the trackers' copy); ``clock``: the run's clock;
    ``is_main``: whether this rank writes; ``device`` and ``layout``: summary.json's ``env``;
    ``model_overrides``: what the exported weights' header records."""

    def __init__(self, log: MetricsLogger, logstep: LogStep, *, config, clock: RunClock, is_main: bool, device,
                 layout: dict[str, Any], model_overrides: dict[str, Any], warnings: Warnings):  # fmt: skip
        self.logger, self.logstep, self.cfg, self.clock = log, logstep, config, clock
        self.is_main, self.device, self.layout, self.model_overrides = is_main, device, layout, model_overrides
        self.warnings = warnings
        self.last_eval: dict[str, Any] = {}  # the newest value of every evaluation metric
        self.written: dict[str, bool] = {}  # outputs this run wrote at its end ("weights", "report"): the end lists only those
        self._watching = False

    @classmethod
    def build(cls, lc, *, config, clock: RunClock, dims, counters, schedule, guard, task, cost: StepCost,
              steps_per_epoch: int, varying: bool, eval_names, layout: dict[str, Any],
              model_overrides: dict[str, Any]) -> Reporting:  # fmt: skip
        """The reporting of a run from its ``log`` group ``lc`` and named objects: ``config`` (the settings
        it reports), ``dims`` (the layout: who writes, the ranks a mean is over), ``counters`` (the step
        and the run's length: a resume drops the records after its step), the ``schedule`` (the logged
        learning rate), the non-finite ``guard``, the ``task`` (its parts' times, log-step metrics and
        warnings), the step's ``cost`` (FLOPs and the device's peak), ``steps_per_epoch``, ``varying``
        (each record names its step's size), ``eval_names`` (the evaluations' prefixes), ``layout`` and
        ``model_overrides`` (summary.json's and the exported weights')."""
        warnings = Warnings()
        log = MetricsLogger(config.train.output_dir, enabled=dims.is_main, total_steps=counters.total_steps,
                            start_step=counters.step, progress=lc.progress, tensorboard=lc.tensorboard,
                            eval_names=tuple(eval_names), config=config)  # fmt: skip

        def warn(line: str) -> None:
            warnings.add(line)
            log.info(line)

        logstep = LogStep(config.train, world=dims.world_size, steps_per_epoch=steps_per_epoch, schedule=schedule,
                          guard=guard, flops_per_image=cost.flops, peak=cost.peak, info=log.info, warn=warn,
                          part_times=task.step_times, task_metrics=task.log_metrics, device=cost.device,
                          dp_size=dims.dp_size, flops_at=cost.flops_at, varying=varying)  # fmt: skip
        return cls(log, logstep, config=config, clock=clock, is_main=dims.is_main, device=cost.device, layout=layout,
                   model_overrides=model_overrides, warnings=warnings)  # fmt: skip

    # ------------------------------------------------------------------------------- the loop's calls
    def open(self, lines: list[str]) -> None:
        """The run's opening lines; from here on vitscale's logged warnings are kept for the summary."""
        for line in lines:
            self.logger.info(line)
        if not self._watching:
            logging.getLogger("vitscale").addHandler(self.warnings)
            self._watching = True

    def timed(self, batches):
        """``batches``, their waiting time counted (the record's ``data_wait``)."""
        return self.logstep.timed(batches)

    def step(self, shape) -> None:
        """A step was made (``shape``: its batch, :func:`~vitscale.train.logstep.batch_shape`)."""
        self.logstep.advance(shape)
        self.logger.advance()

    def due(self, step: int, last: bool, evaluating: bool) -> bool:
        """Whether ``step`` logs (every ``train.log_every`` steps, the first and last, with every evaluation)."""
        return self.logstep.due(step, last, evaluating)

    def record(self, step: int, loss, metrics, grad_norm, last_checkpoint: str | None) -> dict[str, Any]:
        """The record of ``step`` (the sync point: :meth:`LogStep.record`)."""
        return self.logstep.record(step, loss, metrics, grad_norm, last_checkpoint)

    def log(self, record: dict[str, Any], results: dict[str, Any]) -> None:
        """Write a log step's record with the evaluations' ``results``; their time is not counted in img/s."""
        self.last_eval.update(results)
        self.logger.log({**record, **results})
        self.logstep.restart()

    def restart(self) -> None:
        """Count images and time afresh (after a checkpoint)."""
        self.logstep.restart()

    def warn(self, line: str) -> None:
        """A warning line: printed, and kept for the summary."""
        self.warnings.add(line)
        self.logger.info(line)

    def close(self) -> None:
        """Stop keeping warnings; end the bar; close TensorBoard and the trackers (bounded in time)."""
        if self._watching:
            logging.getLogger("vitscale").removeHandler(self.warnings)
            self._watching = False
        self.logger.close()

    # ------------------------------------------------------------------------------------ the end
    def finish(self, checkpoints, guard, loaders) -> dict[str, Any]:
        """Close the run after its last step (``checkpoints.counters``: the step and this segment): never
        exit 0 untrained, export the weights, write the summary (rank 0: with the skipped files, the
        warnings, the hyperparameters for TensorBoard and the trackers, the report). Returns the summary."""
        cfg, counters = self.cfg, checkpoints.counters
        out, step, segment = Path(cfg.train.output_dir), counters.step, counters.segments
        wall = segment.elapsed()
        skips = loaders.skips()  # bad files (training and validation) and shards, over the ranks
        guard.require_progress(step, step - segment.start_step, checkpoints.last)
        checkpoints.export(out, step, cfg.model.name, self.model_overrides)
        self.written["weights"] = bool(cfg.checkpoint.export_safetensors)
        if skips["skipped_files"] or skips["skipped_shards"]:
            self.warn(f"skipped {skips['skipped_files']} bad files and {len(skips['skipped_shards'])} unreadable "
                      f"shards (see the warnings above)")  # fmt: skip
        segments = segment.summary(step, cfg.train.batch_size)[0]
        summary = run_summary(cfg.model.name, step, wall=wall, steps_run=step - segment.start_step,
                              batch_size=cfg.train.batch_size, skips=skips, nonfinite_steps=guard.checked_total,
                              last_eval=self.last_eval, resumed_from=checkpoints.resumed_from,
                              total_time=self.clock.elapsed(), started_at=self.clock.started_at,
                              env=environment(self.device, self.layout), segments=segments)  # fmt: skip
        self.warnings.into(summary)
        if self.is_main:
            write_summary(summary, out)
            self.logger.log_hparams(flatten(config_to_dict(cfg)), dict(self.last_eval), summary)  # TensorBoard, trackers
            self.written["report"] = bool(cfg.log.report) and try_write_report(out) is not None
        return summary

    @staticmethod
    def finished(cfg, checkpoints, is_main: bool) -> dict[str, Any]:
        """A finished run started again: says so on rank 0; its summary.json with this start's facts."""
        tc, counters = cfg.train, checkpoints.counters
        key = "train.max_steps" if tc.max_steps > 0 else "train.epochs"
        return finished_run(Path(tc.output_dir), counters.step, counters.total_steps, checkpoints.resumed_from, key,
                            is_main)  # fmt: skip


def print_run_end(cfg, summary: dict[str, Any], fmt: str, *, is_main: bool, names: tuple[str, ...],
                  reporting: Reporting | None = None) -> None:  # fmt: skip
    """Print the end of the run on rank 0: ``human`` (what the run gave, what it warned about and where
    its outputs are; ``names``: its evaluations), ``json`` (summary.json's contents) or ``none``.
    ``reporting``: the run's, when it trained (what it wrote at its end); None for a finished run
    started again (what its folder holds)."""
    if not is_main:
        return
    written = reporting.written if reporting is not None else {}
    tensorboard = reporting is not None and reporting.logger.tb_opened
    print_end(summary, fmt, Path(cfg.train.output_dir), report=written.get("report", cfg.log.report),
              tensorboard=tensorboard, names=names, weights=written.get("weights"))  # fmt: skip


__all__ = ["MAX_WARNINGS", "Reporting", "RunClock", "Warnings", "print_run_end"]
