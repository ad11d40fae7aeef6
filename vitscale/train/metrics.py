"""Run outputs: ``metrics.jsonl`` (one object per logged step), TensorBoard, the terminal's progress bar
or lines.

``metrics.jsonl`` and ``summary.json`` are strict JSON: a number that is not finite is written as the
string ``"nan"``, ``"inf"`` or ``"-inf"`` (:func:`strict_json`), never as a bare ``NaN`` that JSON
readers other than Python's refuse; ``vitscale report`` reads those strings back as numbers.

On a terminal (``log.progress=bar``, or ``auto`` when stderr is one) a tqdm bar shows the step, the
percentage, elapsed time, ETA and rate, with only the last loss as its postfix, so the bar keeps its
width at 80 columns; the metrics of each log step are a line of their own above it (``plain``: the
lines only). Ratios print in percent (``vitscale.tools.units``).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from vitscale.safe_write import open_append, write_atomic
from vitscale.tools.units import base_key, is_percent

# The keys of a training line, in order, with their format; other numbers logged by a task (e.g. CLIP's
# logit_scale) follow, then img/s and MFU. Evaluation results (EVAL_PREFIXES) go on a line of their own.
# The gradient norm stays in the files and the report: the line keeps to about 80 columns.
TRAIN_FORMATS = (("loss", ".4f"), ("lr", ".2e"))
EVAL_PREFIXES = ("val_", "zeroshot_", "text_retrieval_", "image_retrieval_")
NOT_SHOWN = ("step", "epoch", "img_per_s", "tflops", "mfu", "grad_norm")
TIME_SHARE = "_time_pct"  # a task's part's share of the step time (``teacher_time_pct``): after img/s
# Details of an evaluation kept in the files but off the terminal's lines (image counts, feature sizes).
DETAILS = ("_images", "_feature_dim", "_l2", "_seeds", "_note")
NONFINITE = ("nan", "inf", "-inf")


def strict_json(v):
    """``v`` with every non-finite float, at any depth, replaced by ``"nan"`` / ``"inf"`` / ``"-inf"``."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: strict_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [strict_json(x) for x in v]
    return v


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _value(key: str, v: float, fmt: str = ".4g") -> str:
    return f"{v:.2f}%" if is_percent(key) and math.isfinite(v) else f"{v:{fmt}}"


def is_eval_key(key: str, names: tuple[str, ...] = ()) -> bool:
    """Whether ``key`` is an evaluation's metric: of the default evaluations, or under one of ``names``
    (the prefixes of the run's ``evals:``)."""
    return key.startswith(EVAL_PREFIXES) or any(key.startswith(f"{n}_") for n in names if n)


def shown(key: str) -> bool:
    """Whether an evaluation's metric shows on the terminal's lines: not its details, recall@K only for K=1."""
    base = base_key(key)
    return not base.endswith(DETAILS) and ("_recall@" not in base or base.endswith("@1"))


def _step(r: dict, total: int | None) -> str:
    return f"step {r['step']}/{total}" if total else f"step {r['step']}"


def format_record(r: dict, total: int | None = None, names: tuple[str, ...] = ()) -> str:
    """The training line of a logged step: ``step 25/460  loss 2.1262  lr 7.50e-04  train_top1 25.00%
    120 img/s  MFU 18.36%`` (about 80 columns)."""
    parts = [_step(r, total)]
    for k, fmt in TRAIN_FORMATS:
        if _num(r.get(k)):
            parts.append(f"{k} {_value(k, r[k], fmt)}")
        elif r.get(k) in NONFINITE:  # a non-finite value, as written (strict_json)
            parts.append(f"{k} {r[k]}")
    known = {k for k, _ in TRAIN_FORMATS}
    shares = [k for k in r if k.endswith(TIME_SHARE) and _num(r[k])]  # shown after img/s
    for k, v in r.items():
        if k not in known and k not in NOT_SHOWN and k not in shares and not is_eval_key(k, names) and _num(v):
            parts.append(f"{k} {_value(k, v)}")
    for k in NOT_SHOWN:  # a field left off the line shows when it is not finite (a step that was not applied)
        if r.get(k) in NONFINITE:
            parts.append(f"{k} {r[k]}")
    if _num(r.get("img_per_s")):
        parts.append(f"{r['img_per_s']:.0f} img/s" + "".join(f" ({k.removesuffix(TIME_SHARE)} {r[k]:.0f}%)" for k in shares))
    if _num(r.get("mfu")):
        parts.append(f"MFU {r['mfu']:.2f}%")
    elif _num(r.get("tflops")):
        parts.append(f"{r['tflops']:.3g} TFLOP/s")
    return "  ".join(parts)


def format_eval(r: dict, total: int | None = None, names: tuple[str, ...] = ()) -> str | None:
    """The evaluation line of a logged step (None when it has no evaluation): ``step 230/460  eval
    val_top1 91.67%  val_top5 99.33%  val_loss 0.3915``; of the recall@K only K=1 (all are in the files)."""
    keys = [k for k in r if is_eval_key(k, names) and (_num(r[k]) or r[k] in NONFINITE) and shown(k)]
    if not keys:
        return None
    return "  ".join([_step(r, total), "eval"] + [f"{k} {_value(k, r[k]) if _num(r[k]) else r[k]}" for k in keys])


def tensorboard_writer(path: Path, wanted: bool | None):
    """A SummaryWriter on ``path``, or None: ``wanted`` False; or the package is not installed (with
    ``wanted`` True, the caller says so)."""
    if wanted is False:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch.utils.tensorboard needs the tensorboard package
        return None
    return SummaryWriter(str(path))


class MetricsLogger:
    """Writes on the main rank only; other ranks get a silent logger."""

    def __init__(self, output_dir: str | os.PathLike, *, enabled: bool, total_steps: int, start_step: int = 0,
                 progress: str = "auto", tensorboard: bool | None = None, eval_names: tuple[str, ...] = (),
                 config: Any = None):  # fmt: skip
        self.enabled = enabled
        self.eval_names = tuple(eval_names)  # the prefixes of the run's evaluations (a line of their own)
        self.path = Path(output_dir) / "metrics.jsonl"
        self.tb_path = Path(output_dir) / "tb"
        self.bar = None
        self.tb = None
        self.tb_opened = False
        self.trackers = None  # report.html, W&B, MLflow (log.report, log.wandb, log.mlflow: vitscale.train.trackers)
        self.total = total_steps
        self.mode = "none"
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._truncate_after(start_step)
        mode = progress
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "plain"
        self.mode = mode
        if mode == "bar":
            from tqdm.auto import tqdm

            # dynamic_ncols: the bar follows the terminal's width; the postfix is only the loss
            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, file=sys.stderr)
        self.tb = tensorboard_writer(self.tb_path, tensorboard)
        self.tb_opened = self.tb is not None  # kept after close: the end of the run lists TensorBoard's folder
        if self.tb is None and tensorboard:
            self.info("log.tensorboard=true, but the tensorboard package is not installed (pip install "
                      "tensorboard): no TensorBoard events for this run")  # fmt: skip
        if config is not None and (config.log.report or config.log.wandb or config.log.mlflow):
            from vitscale.config import config_to_dict, flatten

            from .trackers import Trackers

            settings = flatten(config_to_dict(config)) if config.log.wandb or config.log.mlflow else {}  # the trackers' copy
            self.trackers = Trackers(self.path.parent, config, settings, self.info,
                                     total_steps=total_steps, is_eval=lambda key: is_eval_key(key, self.eval_names))  # fmt: skip

    def _truncate_after(self, step: int) -> None:
        """On resume, drop lines a killed run logged after the checkpoint it resumes from."""
        if not self.path.exists():
            return
        keep = []
        with open(self.path) as f:
            for line in f:
                try:
                    if json.loads(line).get("step", 0) <= step:
                        keep.append(line if line.endswith("\n") else line + "\n")
                except json.JSONDecodeError:
                    pass  # a line cut by a kill
        write_atomic(self.path, "".join(keep))  # never through a link; no temporary file left on a failure

    def advance(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        record = strict_json(record)
        with open_append(self.path) as f:  # never through a symbolic link (vitscale.run.folder)
            f.write(json.dumps(record, allow_nan=False) + "\n")
        if self.tb is not None:
            for k, v in record.items():
                if k != "step" and _num(v):
                    self.tb.add_scalar(k, v, record["step"])
        if self.trackers is not None:
            self.trackers.log(record)
        if self.bar is not None and _num(record.get("loss")):
            self.bar.set_postfix_str(f"loss={record['loss']:.4g}", refresh=False)
        if self.mode in ("bar", "plain"):
            for text in (format_record(record, self.total, self.eval_names), format_eval(record, self.total, self.eval_names)):
                if text:
                    self.info(text)

    def log_hparams(self, hparams: dict[str, Any], metrics: dict[str, float], summary: dict[str, Any] | None = None) -> None:
        """The run's settings as TensorBoard hyperparameters (the HParams dashboard) with ``metrics``
        (final values of logged scalars, by the same names) as its metrics. Written into the run's
        own event file, so the dashboard shows this run's scalars beside its settings. The trackers
        get ``summary`` (summary.json's values) and the report's plots."""
        if self.trackers is not None and self.trackers.takes_images and summary is not None:
            from vitscale.tools.report import report_plots

            self.trackers.summary(strict_json(summary), report_plots(self.path.parent), int(summary.get("steps", 0)))
        if self.tb is None:
            return
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        values = {k: (v if isinstance(v, (bool, int, float, str)) else str(v)) for k, v in hparams.items()}
        for summary in hparams_summary(values, {k: v for k, v in metrics.items() if _num(v)}):
            self.tb.file_writer.add_summary(summary)
        self.tb.flush()

    def info(self, text: str) -> None:
        """A line for the person watching (whatever ``log.progress`` says): above the bar, or printed."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, flush=True)

    def close(self) -> None:
        """End the bar; close TensorBoard's writer and the trackers, each within a bounded time
        (:func:`vitscale.train.closing.bounded`: an exit never hangs on a writer)."""
        from .closing import bounded

        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.tb is not None:
            bounded(self.tb.close, "TensorBoard's writer", self.info)
            self.tb = None
        if self.trackers is not None:
            self.trackers.close()
            self.trackers = None


__all__ = ["MetricsLogger", "format_eval", "format_record", "is_eval_key", "strict_json", "tensorboard_writer"]
