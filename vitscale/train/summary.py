"""The end of a run for a person: final metrics, where the weights, report and logs are, what to run next.

``summary.json`` holds the same numbers for machines (``vitscale train --json`` prints it instead).
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

from vitscale.tools.units import is_percent

from .metrics import is_eval_key


def _q(p: Path | str) -> str:
    return shlex.quote(str(p))


def _metric(key: str, v: Any) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return f"{key} {v:.2f}%" if is_percent(key) else f"{key} {v:.4g}"
    return f"{key} {v}"


def final_metrics_line(summary: dict[str, Any]) -> str:
    """``val_top1 98.00%  val_top5 100.00%  val_loss 0.1234`` (recall@K: K=1 only), or a note that there
    was no evaluation."""
    keys = [k for k in summary if is_eval_key(k) and ("_recall@" not in k or k.endswith("@1"))]
    if not keys:
        return "no evaluation (the run has no validation data)"
    return "  ".join(_metric(k, summary[k]) for k in keys)


def human_summary(summary: dict[str, Any], out: Path, *, config: str | Path, report: bool, tensorboard: bool,
                  weights: Path | None) -> str:  # fmt: skip
    """The lines printed at the end of ``vitscale train`` / ``vitscale demo`` (and kept in train.log)."""
    wall, total = summary.get("wall_time_s", 0.0), summary.get("total_time_s")
    head = f"{summary.get('model')}: {summary.get('steps')} steps"
    if summary.get("resumed_from"):
        head += f" ({summary.get('steps_this_run')} after resuming)"
    head += f" in {wall:.1f} s of training ({summary.get('img_per_s', 0.0):.0f} img/s)"
    if isinstance(total, (int, float)):
        head += f", {total:.1f} s in all"
    lines = [head, "  " + final_metrics_line(summary)]
    if summary.get("skipped_files"):
        lines.append(f"  skipped {summary['skipped_files']} undecodable files (warnings in train.log)")
    for shard in summary.get("skipped_shards", []):
        lines.append(f"  skipped shard {shard['url']}: {shard['reason']}")
    lines.append(f"Outputs in {out}:")
    if weights is not None:
        lines.append(f"  weights      {weights}")
    if report:
        rep = out / "report.html"
        lines.append(f"  report       {rep}  (open {rep.resolve().as_uri()})")
    lines.append(f"  log          {out / 'train.log'}  (also metrics.jsonl, summary.json, config.yaml)")
    if tensorboard:
        lines.append(f"  tensorboard  tensorboard --logdir {_q(out)}")
    lines.append("Next:")
    lines.append(f"  vitscale eval {_q(config)} checkpoint.path={_q(out)}")
    lines.append(f"  vitscale report {_q(out)}")
    if weights is not None:
        lines.append(f"  vitscale export {_q(out)} --format onnx")
    return "\n".join(lines)


__all__ = ["final_metrics_line", "human_summary"]
