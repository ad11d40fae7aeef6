"""A run's list of evaluations (``evals:``), through the CLI: val top-1 every 2 steps, a 5-shot probe at
the end, and an evaluator written in this file alone (registered in the CLI's process) — each under its
prefix in metrics.jsonl, summary.json, TensorBoard and report.html, at its own steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from vitscale.eval.classification import all_sum
from vitscale.eval.evaluator import Evaluator, EvaluatorConfig, register_evaluator


@dataclass
class ConfidenceConfig(EvaluatorConfig):
    """``kind: confidence``: how sure the model is of its top-1 class, on average."""

    temperature: float = 1.0
    """The softmax's temperature."""


class Confidence(Evaluator):
    config = ConfidenceConfig
    default_name = "confidence"

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.loader = ctx.data.loader(cfg.data, cfg.split, cfg.batch_size)

    @torch.no_grad()
    def __call__(self, model):
        totals = torch.zeros(2, dtype=torch.float64)  # images, summed top-1 probability
        for batch in self.loader:
            keep = batch["index"] >= 0
            p = (model(batch["image"]).float() / self.cfg.temperature).softmax(-1).amax(-1)
            totals += torch.stack([keep.sum(), (p * keep).sum()]).double()
        n, p = all_sum(totals, self.ctx.group)
        return {"mean_p": p / n, "images": int(n)}


def register() -> None:
    """What a plug-in module does at import (here in a function: pytest's own process imports every
    test file and must keep its registries as they are)."""
    register_evaluator("confidence", Confidence)

HERE = Path(__file__).resolve().parent
CLI = "import sys; sys.path.insert(0, sys.argv.pop(1)); import test_evals; test_evals.register(); from vitscale.cli import main; sys.exit(main(sys.argv[1:]))"


def test_two_evaluations_and_a_plugged_in_one_write_their_prefixes(tmp_path):
    run = tmp_path / "run"
    config = tmp_path / "evals.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": "vit_debug", "hidden_size": 32, "num_layers": 1},
        "data": {"format": "digits", "num_workers": 0},
        "train": {"max_steps": 4, "batch_size": 32, "log_every": 10, "cpu_threads": 1, "output_dir": str(run)},
        "evals": [
            {"kind": "classification", "name": "val", "every": 2},
            {"kind": "fewshot", "name": "fewshot", "shots": [5], "seeds": 1},  # every: 0 = at the end only
            {"kind": "confidence", "name": "conf", "every": 3, "temperature": 2.0},
        ],
        "log": {"progress": "plain", "tensorboard": True},
    }))  # fmt: skip
    train = subprocess.run([sys.executable, "-c", CLI, str(HERE), "train", str(config)], capture_output=True, text=True,
                           env=dict(os.environ), timeout=300)  # fmt: skip
    assert train.returncode == 0, train.stderr
    rows = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    prefixes = lambda r: {k.split("_")[0] for k in r if k.startswith(("val_", "fewshot_", "conf_"))}  # noqa: E731
    assert sorted(rows) == [1, 2, 3, 4]  # logged at the first and last steps and at every evaluation
    assert [prefixes(rows[s]) for s in (1, 2, 3, 4)] == [set(), {"val"}, {"conf"}, {"val", "fewshot", "conf"}]
    last = rows[4]
    assert 0 <= last["val_top1"] <= 100 and 10 < last["fewshot_5shot_top1"] <= 100 and last["conf_images"] == 300
    assert 0.1 <= last["conf_mean_p"] <= 1.0
    summary = json.loads((run / "summary.json").read_text())
    assert all(summary[k] == last[k] for k in ("val_top1", "fewshot_5shot_top1", "conf_mean_p"))
    eval_lines = [line for line in train.stdout.splitlines() if line.startswith("step 4/4  eval  ")]
    final = [line for line in train.stdout.splitlines() if line.startswith("  val_top1 ")]  # the end-of-run summary
    for line in (eval_lines[0], final[0]):
        assert "fewshot_5shot_top1" in line and "conf_mean_p" in line and "conf_images" not in line, line

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = EventAccumulator(str(run / "tb"))
    tb.Reload()
    assert {"val_top1", "fewshot_5shot_top1", "conf_mean_p"} <= set(tb.Tags()["scalars"])
    assert [e.step for e in tb.Scalars("val_top1")] == [2, 4] and [e.step for e in tb.Scalars("conf_mean_p")] == [3, 4]

    page = (run / "report.html").read_text()
    for key in ("val_top1", "fewshot_5shot_top1", "conf_mean_p"):
        assert f'<div class="k">{key}</div>' in page, key  # the headline: each evaluation's results
    assert 'id="plot-eval-fewshot"' in page and 'id="plot-eval-conf"' in page  # a panel per evaluation
