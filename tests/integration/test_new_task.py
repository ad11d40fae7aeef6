"""A new task plugs in from one file: this one. It declares its config group, loss and training metric,
its own up-front check, its default evaluation (an evaluator it registers here too) and the loss the
bench times, registers itself, and then trains, evaluates and benches through the CLI like the built-in tasks
(docs/architecture.md, "A task"). The task: read the digit's value off the model's first output
(regression with the mean squared error) — nothing in vitscale knows it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from vitscale.errors import CheckError
from vitscale.eval.classification import all_sum
from vitscale.eval.evaluator import Evaluator, EvaluatorConfig, register_evaluator
from vitscale.tasks import Task, register_task
from vitscale.tasks.base import first_output


@dataclass
class RegressConfig:
    """The ``regress`` group: how the digit value is scaled into the target."""

    scale: float = 1.0
    """The target of an image of digit d is ``scale * d``."""


class DigitValue(Task):
    """The digit's value, regressed from the model's first output."""

    name = "digit_value"
    config_groups = {"regress": RegressConfig}
    bench_calls = 0  # how often the bench's step called bench_loss (in this process)

    @classmethod
    def check(cls, cfg, model, dims, purpose):
        """Its own up-front check (``vitscale.run.checks.check_run`` calls it): the targets are the
        batch's labels as they are, so mixed images would be trained against unmixed values."""
        super().check(cfg, model, dims, purpose)
        if purpose == "train" and (cfg.data.mixup_alpha > 0 or cfg.data.cutmix_alpha > 0):
            raise CheckError(f"data.mixup_alpha={cfg.data.mixup_alpha}, data.cutmix_alpha={cfg.data.cutmix_alpha}: the "
                             f"{cls.name} task does not mix its targets; set both to 0")  # fmt: skip

    def loss(self, model, batch, step):
        with self.autocast():
            value = model(batch["image"])[:, 0].float()  # (B,)
        target = batch["label"].float() * self.cfg.regress.scale
        return F.mse_loss(value, target), {"train_mae": (value - target).abs().mean().detach()}

    @classmethod
    def default_evals(cls, cfg):
        return [{"kind": "value_error", "name": "val", "every": cfg.eval.every, "scale": cfg.regress.scale}]

    @staticmethod
    def bench_loss(out, labels):
        DigitValue.bench_calls += 1
        return F.mse_loss(first_output(out)[:, 0].float(), labels.float())


@dataclass
class ValueErrorConfig(EvaluatorConfig):
    """``kind: value_error``: the mean squared and absolute error of the regressed digit value."""

    scale: float = 1.0
    """The target of an image of digit d is ``scale * d``."""


class ValueError_(Evaluator):
    config = ValueErrorConfig
    default_name = "val"

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.loader = ctx.data.loader(cfg.data, cfg.split, cfg.batch_size)

    @torch.no_grad()
    def __call__(self, model):
        c, totals = self.ctx, torch.zeros(3, dtype=torch.float64)  # images, squared error, absolute error
        for batch in self.loader:
            keep = batch["index"] >= 0  # padding samples of the last shard
            err = model(batch["image"].to(c.device))[:, 0].float().cpu() - batch["label"].float() * self.cfg.scale
            totals += torch.stack([keep.sum(), (err**2 * keep).sum(), (err.abs() * keep).sum()]).double()
        n, se, ae = all_sum(totals.to(c.device), c.group)
        return {"mse": se / n, "mae": ae / n}


def register() -> None:
    """What a plug-in module does at import (here in a function, so that pytest's own process, which
    imports every test file, keeps its registries as they are: see the fixture below)."""
    register_task(DigitValue)
    register_evaluator("value_error", ValueError_)


HERE = Path(__file__).resolve().parent
# The CLI in a fresh process that has imported this file and registered the task.
CLI = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import test_new_task; test_new_task.register(); "
       "from vitscale.cli import main; sys.exit(main(sys.argv[1:]))")  # fmt: skip


def vitscale(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI, str(HERE), *argv], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)  # fmt: skip


def test_a_task_from_one_file_trains_evaluates_and_benches(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    config = tmp_path / "regress.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": "vit_debug", "hidden_size": 32, "num_layers": 1},
        "data": {"format": "digits", "num_workers": 0},
        "train": {"task": "digit_value", "max_steps": 3, "batch_size": 32, "log_every": 1, "cpu_threads": 1,
                  "output_dir": str(run)},
        "regress": {"scale": 0.5},
        "eval": {"batch_size": 100},
        "log": {"progress": "none", "report": False},
    }))  # fmt: skip
    train = vitscale("train", str(config))
    assert train.returncode == 0, train.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(math.isfinite(r["train_mae"]) for r in rows)
    assert "val_mse" in rows[-1] and "val_top1" not in rows[-1]  # its own evaluation, not classification's
    summary = json.loads((run / "summary.json").read_text())
    assert summary["val_mse"] == rows[-1]["val_mse"] > 0 and summary["val_mae"] <= math.sqrt(summary["val_mse"]) + 1e-9
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["regress"] == {"scale": 0.5} and "clip" not in saved  # its group, and only its task's groups

    # vitscale eval rebuilds the run, loads the weights and evaluates with the task's evaluation
    ev = vitscale("eval", str(run / "config.yaml"), f"checkpoint.path={run}")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["val_mse"] == summary["val_mse"]

    # its check runs with the run's own, before any data is read or model built: one line, exit code 2
    fresh = tmp_path / "mixed"
    refused = vitscale("train", str(config), "data.mixup_alpha=0.8", f"train.output_dir={fresh}")
    err = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and len(err) == 1, refused.stderr
    assert "data.mixup_alpha=0.8, data.cutmix_alpha=0.0: the digit_value task does not mix" in err[0]
    assert not fresh.exists()

    # vitscale bench times the task's own loss (in this process, the task registered for this test only)
    from vitscale.cli import main
    from vitscale.eval import evaluator
    from vitscale.tasks import base

    monkeypatch.setattr(base, "_TASKS", dict(base._TASKS))
    monkeypatch.setattr(evaluator, "_EVALUATORS", dict(evaluator._EVALUATORS))
    register()

    out = tmp_path / "bench.json"
    argv = ["bench", "vit_debug", "--task", "digit_value", "--device", "cpu", "--batch-size", "4", "--steps", "1",
            "--warmup", "0", "--rounds", "1", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["settings"]["task"] == "digit_value" and result["vitscale"]["img_per_s"] > 0
    assert DigitValue.bench_calls == 1 + 1  # the warm-up round (as long as a round) and the timed step
