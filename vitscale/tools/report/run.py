"""Read what a run folder holds — ``metrics.jsonl``, ``summary.json``, ``config.yaml`` — and nothing else.

Tolerant by design: any of the three may be missing (a run still in progress has no summary, an older
run logged fewer fields), a line cut by a kill is skipped, and non-finite values (written as the
strings ``"nan"``, ``"inf"``, ``"-inf"`` by ``vitscale.train.metrics``) are read back as floats.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "Infinity": math.inf, "-Infinity": -math.inf}
# Keys of metrics.jsonl that are axes or bookkeeping, not curves.
NOT_CURVES = ("step", "epoch")


def _number(v: Any) -> float | None:
    """A logged value as a float (non-finite strings included), or None when it is not a number."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and v in NON_FINITE:
        return NON_FINITE[v]
    return None


@dataclass
class Series:
    """One logged key: the steps it was logged at and its values (non-finite included)."""

    steps: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    @cached_property
    def _split(self) -> tuple[list[float], list[float], list[float]]:
        xs, ys, bad = [], [], []
        for s, v in zip(self.steps, self.values):
            if math.isfinite(v):
                xs.append(s)
                ys.append(v)
            else:
                bad.append(s)
        return xs, ys, bad

    def finite(self) -> tuple[list[float], list[float]]:
        """Steps and values where the value is finite (computed once: read the whole file first)."""
        return self._split[0], self._split[1]

    def non_finite_steps(self) -> list[float]:
        return self._split[2]

    def last_finite(self) -> tuple[float, float] | None:
        for s, v in zip(reversed(self.steps), reversed(self.values)):
            if math.isfinite(v):
                return s, v
        return None


@dataclass
class Run:
    """The contents of one run folder, as far as they exist."""

    path: Path
    records: int = 0
    series: dict[str, Series] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    config_text: str | None = None
    config: dict[str, Any] | None = None
    last_step: int | None = None
    skipped_lines: int = 0
    restarts: int = 0
    epoch_per_step: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name or str(self.path)

    @property
    def finished(self) -> bool:
        """summary.json is there and belongs to the last logged step (not a previous run's)."""
        if self.summary is None:
            return False
        return self.last_step is None or self.summary.get("steps") == self.last_step

    @property
    def legacy_units(self) -> bool:
        """A finished run of a vitscale that wrote MFU and CLIP's metrics as fractions (its summary.json
        has no "units"); an unfinished one is taken to be current."""
        return self.summary is not None and "units" not in self.summary

    @cached_property
    def eval_names(self) -> list[str]:
        """The metric prefixes of the run's evaluations, as the run resolved them: its config.yaml's
        ``evals:`` entries, or when it sets none (``evals: null``) its task's default evaluations
        (``Task.default_evals``: a self-supervised run's ``knn`` and ``linear_probe``); [] when the
        config cannot say (none, or one this vitscale does not read: the built-in names only)."""
        return run_eval_names(self.config)

    def total_steps(self) -> int | None:
        """train.max_steps when the config sets it (0 = derived from epochs, unknown here)."""
        train = (self.config or {}).get("train") or {}
        n = train.get("max_steps") if isinstance(train, dict) else None
        return n if isinstance(n, int) and n > 0 else None


def run_eval_names(config: dict[str, Any] | None) -> list[str]:
    """:attr:`Run.eval_names` of a run whose config.yaml holds ``config``."""
    if not isinstance(config, dict):
        return []
    evals = config.get("evals")
    if evals is not None:
        entries = evals if isinstance(evals, list) else []
        return [e["name"] for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str) and e["name"]]
    try:  # the task's defaults, from the config as the run read it (nothing in it runs: it is only parsed)
        from vitscale.config import config_from_dict, eval_entries
        from vitscale.models.registry import get_family
        from vitscale.tasks import get_task

        cfg = config_from_dict(config)
        task = get_task(cfg.train.task or get_family(cfg.model.name).task)
        return [e.name for e in eval_entries(task.default_evals(cfg), f"{task.name} default evaluations") if e.name]
    except Exception:  # noqa: BLE001 — another version's config, a plug-in not imported: the built-in names
        return []


def read_metrics(path: Path, run: Run) -> None:
    """Parse ``metrics.jsonl`` into ``run.series``; keeps the last segment when steps go backwards
    (a run started over in the same folder without clearing it)."""
    rows: list[dict] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                run.skipped_lines += 1  # a line cut by a kill
                continue
            step = _number(rec.get("step")) if isinstance(rec, dict) else None
            if step is None or not math.isfinite(step):
                run.skipped_lines += 1
                continue
            if rows and step <= rows[-1]["step"]:
                run.restarts += 1
                rows = []
            rec["step"] = step
            rows.append(rec)
    series: dict[str, Series] = {}
    for rec in rows:
        step = rec["step"]
        for k, v in rec.items():
            if k in NOT_CURVES:
                continue
            x = float(v) if type(v) is float or type(v) is int else _number(v)  # the common case first
            if x is None:
                continue
            s = series.get(k)
            if s is None:
                s = series[k] = Series()
            s.steps.append(step)
            s.values.append(x)
    run.series = series
    run.records = len(rows)
    if rows:
        run.last_step = int(rows[-1]["step"])
        ratios = [e / r["step"] for r in rows if (e := _number(r.get("epoch"))) is not None and r["step"] > 0]
        if ratios and max(ratios) - min(ratios) <= 1e-9 * max(abs(max(ratios)), 1e-30) and ratios[0] > 0:
            run.epoch_per_step = ratios[0]


def read_run(run_dir: str | Path) -> Run:
    """Everything the report shows about ``run_dir``; raises FileNotFoundError when the folder holds
    none of metrics.jsonl, summary.json and config.yaml."""
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such run folder")
    run = Run(path=path)
    found = False
    for name in ("metrics.jsonl", "summary.json", "config.yaml"):  # nothing inside a run folder is followed (docs/trust.md)
        if (path / name).is_symlink():
            run.problems.append(f"{name} is a symbolic link (to {os.readlink(path / name)}): not read")
            found = True
    metrics = path / "metrics.jsonl"
    if metrics.is_file() and not metrics.is_symlink():
        found = True
        read_metrics(metrics, run)
    summary = path / "summary.json"
    if summary.is_file() and not summary.is_symlink():
        found = True
        try:
            data = json.loads(summary.read_text(encoding="utf-8"))
            run.summary = data if isinstance(data, dict) else None
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            run.problems.append(f"summary.json unreadable ({e})")
    config = path / "config.yaml"
    if config.is_file() and not config.is_symlink():
        found = True
        from vitscale.errors import ConfigError
        from vitscale.safe_yaml import MAX_BYTES, load_yaml

        with open(config, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
        run.config_text = raw[:MAX_BYTES].decode("utf-8", errors="replace")
        try:
            data = load_yaml(raw, "config.yaml")  # within limits: no alias bomb, no tag, no deep nest
            run.config = data if isinstance(data, dict) else None
        except ConfigError as e:
            run.problems.append(f"config.yaml unreadable ({str(e).splitlines()[0]})")
    if not found:
        raise FileNotFoundError(f"{path}: not a run folder (no metrics.jsonl, summary.json or config.yaml)")
    return run
