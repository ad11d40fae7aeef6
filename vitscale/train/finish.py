"""The end of a training run: the progress check, the exported weights, ``summary.json``, the
tracker's hyperparameters and ``report.html`` (one component, called by the trainer after its
last step)."""

from __future__ import annotations

import time
from typing import Any

from vitscale.config import config_to_dict
from vitscale.tools.env import environment
from vitscale.tools.report import try_write_report
from vitscale.tools.report.run import flatten

from .summary import run_layout, run_summary, write_summary


def finish_run(trainer, log, start_step: int, wall: float, last_eval: dict) -> dict[str, Any]:
    """Close ``trainer``'s run after its last step (this segment ran from ``start_step`` for ``wall``
    seconds): never exit 0 untrained, export the weights, write the summary (rank 0: with the skipped
    files, the hyperparameters for TensorBoard and the trackers, the report). Returns the summary;
    ``trainer.written`` records which outputs were written."""
    cfg, step, checkpoints = trainer.cfg, trainer.step, trainer.checkpoints
    skips = trainer.loaders.skips()  # bad files (training and validation) and shards, over the ranks
    trainer.guard.require_progress(step, step - start_step, checkpoints.last)
    checkpoints.export(trainer.out, step, cfg.model.name, trainer.run.model_overrides)
    trainer.written["weights"] = bool(cfg.checkpoint.export_safetensors)
    segments = trainer.counters.segments.summary(step, cfg.train.batch_size)[0]
    summary = run_summary(cfg.model.name, step, wall=wall, steps_run=step - start_step, batch_size=cfg.train.batch_size,
                          skips=skips, nonfinite_steps=trainer.guard.checked_total, last_eval=last_eval,
                          resumed_from=checkpoints.resumed_from, total_time=time.perf_counter() - trainer._t_created,
                          started_at=trainer.started_at, env=environment(trainer.device, run_layout(trainer.run)),
                          segments=segments)  # fmt: skip
    if trainer.is_main:
        write_summary(summary, trainer.out)
        if skips["skipped_files"] or skips["skipped_shards"]:
            log.info(f"skipped {skips['skipped_files']} bad files and {len(skips['skipped_shards'])} unreadable "
                     f"shards (see the warnings above)")  # fmt: skip
        log.log_hparams(flatten(config_to_dict(cfg)), dict(last_eval), summary)  # TensorBoard, trackers
        trainer.written["report"] = bool(cfg.log.report) and try_write_report(trainer.out) is not None
    return summary


__all__ = ["finish_run"]
