"""The end of a run for a person: final metrics, where the weights, report and logs are, what to run next.

``summary.json`` holds the same numbers for machines (``vitscale train --json`` prints it instead).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import shlex
from pathlib import Path
from typing import Any

from vitscale.tools.units import UNITS, is_percent

from .metrics import is_eval_key, shown, strict_json

SHOWN_WARNINGS = 5
"""Warning lines the end of a run repeats (the first ones; summary.json keeps them all)."""


def _q(p: Path | str) -> str:
    return shlex.quote(str(p))


def _metric(key: str, v: Any) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return f"{key} {v:.2f}%" if is_percent(key) else f"{key} {v:.4g}"
    return f"{key} {v}"


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def run_summary(model: str, steps: int, *, wall: float, steps_run: int, batch_size: int, skips: dict[str, Any],
                nonfinite_steps: int, last_eval: dict[str, Any], resumed_from: str | None, total_time: float,
                started_at: str, env: dict, segments: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    """summary.json of a run that trained: the model, its steps, the time and speed of training, the
    files and shards skipped (``skips``: ``{"skipped_files": n, "skipped_shards": [...]}``, from
    ``Loaders.skips``), the non-finite steps, the last evaluation's metrics, where it resumed from, the
    units, when it ran and the environment. ``segments`` (:mod:`vitscale.train.segments`): each start
    of the job; then ``wall_time_s`` and ``img_per_s`` are the whole run's, over every segment, and
    ``wall_time_this_run_s`` / ``img_per_s_this_run`` this segment's."""
    summary = {"model": model, "steps": steps, "steps_this_run": steps_run, "wall_time_s": wall,
               "img_per_s": steps_run * batch_size / max(wall, 1e-9), **skips,
               "nonfinite_steps": nonfinite_steps, **last_eval}  # fmt: skip
    if segments and len(segments) > 1:
        timed = [s for s in segments if isinstance(s.get("wall_time_s"), (int, float)) and s["wall_time_s"] > 0]
        total = sum(s["wall_time_s"] for s in timed)
        summary.update(wall_time_this_run_s=wall, img_per_s_this_run=summary["img_per_s"], wall_time_s=total,
                       img_per_s=sum(s["steps"] for s in timed) * batch_size / max(total, 1e-9))  # fmt: skip
    if segments:
        summary["segments"] = segments
    if resumed_from:
        summary["resumed_from"] = resumed_from
    summary["total_time_s"] = total_time  # building, loop, evaluations, export
    summary.update(started_at=started_at, finished_at=now(), units=UNITS, env=env)
    return summary


def run_layout(run) -> dict[str, Any]:
    """The parallel layout of ``run`` (a :class:`vitscale.run.Run`), for summary.json."""
    pd = run.dims
    out: dict[str, Any] = {"world_size": pd.world_size, "dp_replicate": pd.dp_replicate, "dp_shard": pd.dp_shard,
                           "tp": pd.tp, "micro_batch_per_rank": run.micro_batch, "grad_accum": run.cfg.train.grad_accum}  # fmt: skip
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun
        out.update(launcher="torchrun", local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", pd.world_size)))
    return out


def write_summary(summary: dict[str, Any], out: Path) -> None:
    from vitscale.safe_write import write_atomic  # never through a symbolic link

    write_atomic(out / "summary.json", json.dumps(strict_json(summary), indent=1, allow_nan=False))


def finished_run(out: Path, step: int, total_steps: int, resumed_from: str, key: str, show: bool) -> dict[str, Any]:
    """A finished run started again with the same config: say so (the end-of-run summary printed next
    says where its outputs are); returns its summary.json with this start's facts. ``key``: the
    setting that sets its length (``train.max_steps`` or ``train.epochs``)."""
    summary: dict[str, Any] = {}
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        pass
    summary = {**(summary if isinstance(summary, dict) else {}), "complete": True, "output_dir": str(out),
               "steps": step, "steps_this_run": 0, "resumed_from": resumed_from}  # fmt: skip
    if show:
        print(
            f"{out} is a finished run (step {step} of {total_steps}; newest checkpoint {Path(resumed_from).name}): "
            f"nothing to train. To train it longer, raise {key} and add checkpoint.allow_changes={key}; to start "
            f"over, set another train.output_dir",
            flush=True,
        )
    return summary


def final_metrics_line(summary: dict[str, Any], names: tuple[str, ...] = ()) -> str:
    """``val_top1 98.00%  val_top5 100.00%  val_loss 0.1234`` (recall@K: K=1 only), or a note that there
    was no evaluation. ``names``: the run's evaluation prefixes."""
    keys = [k for k in summary if is_eval_key(k, names) and shown(k) and isinstance(summary[k], (int, float, str))]
    if not keys:
        return "no evaluation (the run has no validation data)"
    return "  ".join(_metric(k, summary[k]) for k in keys)


def human_summary(summary: dict[str, Any], out: Path, *, config: str | Path, report: bool, tensorboard: bool,
                  weights: Path | None, names: tuple[str, ...] = (), shell: bool = False) -> str:  # fmt: skip
    """The lines printed at the end of ``vitscale train`` / ``vitscale demo`` (and kept in train.log).
    ``shell``: the run's config.yaml holds the shell commands it was given (``pipe:`` data paths), so the
    commands offered next that load it say they run them (``--allow-shell-from-config``)."""
    wall, total = summary.get("wall_time_s", 0.0), summary.get("total_time_s")
    head = f"{summary.get('model')}: {summary.get('steps')} steps"
    segments = summary.get("segments") or []
    if summary.get("resumed_from"):
        head += f" ({summary.get('steps_this_run')} after resuming)"
    head += f" in {wall:.1f} s of training ({summary.get('img_per_s', 0.0):.0f} img/s)"
    if len(segments) > 1:
        head += f" over {len(segments)} segments (resumed at step {', '.join(str(s.get('start_step')) for s in segments[1:])})"
    if isinstance(total, (int, float)):
        head += f", {total:.1f} s in all"
    lines = [head, "  " + final_metrics_line(summary, names)]
    said = [w for w in summary.get("warnings") or [] if isinstance(w, str)]
    if said:  # what the run warned about (all of it in summary.json and train.log)
        more = len(said) - SHOWN_WARNINGS + int(summary.get("warnings_more") or 0)
        lines.append(f"  warnings ({len(said) + int(summary.get('warnings_more') or 0)}, in summary.json):")
        lines += [f"    {w}" for w in said[:SHOWN_WARNINGS]]
        if more > 0:
            lines.append(f"    ... and {more} more")
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
    from vitscale.shell import SHELL_FLAG

    flag = f" {SHELL_FLAG}" if shell else ""
    lines.append("Next:")
    lines.append(f"  vitscale eval {_q(config)} checkpoint.path={_q(out)}{flag}")
    lines.append(f"  vitscale report {_q(out)}")
    if weights is not None:
        lines.append(f"  vitscale export {_q(out)} --format onnx{flag}")
    return "\n".join(lines)


def print_end(summary: dict[str, Any], fmt: str, out: Path, *, report: bool, tensorboard: bool, names: tuple[str, ...],
              weights: bool | None = None) -> None:  # fmt: skip
    """The end of a run, printed: ``human`` (:func:`human_summary`), ``json`` (summary.json's contents)
    or ``none``. ``report`` / ``weights``: whether the run wrote them (``weights=None``: whether the
    folder holds them); an output that was not written is never listed, even when an older one is there."""
    if fmt == "json":
        print(json.dumps(summary, indent=1), flush=True)
    elif fmt == "human":
        path = out / "model.safetensors"
        listed = path.is_file() if weights is None else weights and path.is_file()
        print(human_summary(summary, out, config=out / "config.yaml", report=report and (out / "report.html").is_file(),
                            tensorboard=tensorboard, weights=path if listed else None, names=names,
                            shell=_runs_shell(out / "config.yaml")), flush=True)  # fmt: skip


def _runs_shell(config: Path) -> bool:
    """Whether the run's ``config.yaml`` holds a value that runs a shell command (``pipe:``)."""
    from vitscale.errors import UserError
    from vitscale.safe_yaml import read_yaml
    from vitscale.shell import shell_value

    if not config.is_file() or config.is_symlink():
        return False
    try:
        tree = read_yaml(config)
    except UserError:
        return False
    return shell_value(tree) is not None


__all__ = [
    "final_metrics_line", "finished_run", "human_summary", "now", "print_end", "run_layout", "run_summary", "write_summary",
]  # fmt: skip
