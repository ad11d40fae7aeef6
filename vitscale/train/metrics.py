"""Run outputs: ``metrics.jsonl`` (one object per logged step), TensorBoard, progress bar or lines.

``metrics.jsonl`` and ``summary.json`` are strict JSON: a number that is not finite is written as the
string ``"nan"``, ``"inf"`` or ``"-inf"`` (:func:`strict_json`), never as a bare ``NaN`` that JSON
readers other than Python's refuse; ``vitscale report`` reads those strings back as numbers.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path


def strict_json(v):
    """``v`` with every non-finite float, at any depth, replaced by ``"nan"`` / ``"inf"`` / ``"-inf"``."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: strict_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [strict_json(x) for x in v]
    return v


class MetricsLogger:
    """Writes on the main rank only; other ranks get a silent logger."""

    def __init__(self, output_dir: str | os.PathLike, *, enabled: bool, total_steps: int, start_step: int = 0,
                 progress: str = "auto", tensorboard: bool = False):  # fmt: skip
        self.enabled = enabled
        self.path = Path(output_dir) / "metrics.jsonl"
        self.bar = None
        self.tb = None
        self.total = total_steps
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

            self.bar = tqdm(total=total_steps, initial=start_step, unit="step")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(output_dir) / "tb"))

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
        tmp = self.path.with_suffix(".jsonl.tmp")
        with open(tmp, "w") as f:
            f.writelines(keep)
        os.replace(tmp, self.path)

    def advance(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        record = strict_json(record)
        with open(self.path, "a") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")
        if self.tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, record["step"])
        text = format_record(record)
        if self.bar is not None:
            self.bar.set_postfix_str(text.split(" ", 2)[-1] if "val_top1" not in record else text)
            if "val_top1" in record:
                self.bar.write(text)
        elif self.mode == "plain":
            print(text, flush=True)

    def info(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        elif self.mode != "none":
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()


def format_record(r: dict, total: int | None = None) -> str:
    parts = [f"step {r['step']}"]
    for k, fmt in (("loss", ".4f"), ("lr", ".3e"), ("img_per_s", ".0f"), ("tflops", ".3f"), ("mfu", ".3f"),
                   ("grad_norm", ".3f"), ("val_top1", ".2f"), ("val_top5", ".2f"), ("val_loss", ".4f"),
                   ("val_top1_ema", ".2f")):  # fmt: skip
        if k in r and isinstance(r[k], (int, float)):
            parts.append(f"{k} {r[k]:{fmt}}")
        elif k in r and r[k] in ("nan", "inf", "-inf"):  # a non-finite value, as written (strict_json)
            parts.append(f"{k} {r[k]}")
    return " ".join(parts)
