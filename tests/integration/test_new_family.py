"""A new model family plugs in with its model.py, configs.py, parallelize.py (TP plan and blocks only)
and one registry entry (tests/toy_family): it then trains, evaluates and refuses what it cannot do
through the CLI like the built-in families (docs/architecture.md)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

TESTS = Path(__file__).resolve().parents[1]
# The CLI in a fresh process that has imported the toy family (its import registers it).
CLI = "import sys; sys.path.insert(0, sys.argv.pop(1)); import toy_family; from vitscale.cli import main; sys.exit(main(sys.argv[1:]))"


def vitscale(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI, str(TESTS), *argv], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)  # fmt: skip


@pytest.mark.slow
def test_toy_family_trains_evaluates_and_refuses_dense_labels(tmp_path):
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": "toy_debug"},
        "data": {"format": "digits", "num_workers": 0},
        "train": {"max_steps": 1, "batch_size": 16, "log_every": 1, "cpu_threads": 1, "output_dir": str(tmp_path / "run")},
        "eval": {"batch_size": 100},
        "log": {"progress": "none", "report": False},
    }))  # fmt: skip
    train = vitscale("train", str(config))
    assert train.returncode == 0, train.stderr
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["model"] == "toy_debug" and summary["steps"] == 1 and 0 <= summary["val_top1"] <= 100
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert math.isfinite(row["loss"]) and row["tflops"] > 0  # FLOPs from the model's own flops()
    weights = load_file(run / "model.safetensors")
    assert weights["head.weight"].shape == (10, 32)  # the class count came from the data (digits: 10)
    assert {"blocks.0.fc1.weight", "blocks.1.fc2.weight", "patch_embed.weight"} <= set(weights)

    # activation checkpointing through the family's plan (its blocks) changes nothing numerically
    ac = vitscale("train", str(config), "parallel.activation_checkpointing=full", f"train.output_dir={tmp_path / 'ac'}")
    assert ac.returncode == 0, ac.stderr
    (row_ac,) = [json.loads(line) for line in (tmp_path / "ac" / "metrics.jsonl").read_text().splitlines()]
    assert row_ac["loss"] == row["loss"]

    # vitscale eval rebuilds the run and reads the weights back: the same val accuracy as training
    ev = vitscale("eval", str(config), f"checkpoint.path={run}")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["val_top1"] == summary["val_top1"]

    # no dense per-token logits: label-tokens refuses in one line naming the model
    lt = vitscale("label-tokens", str(config), f"teacher.checkpoint={run}", str(tmp_path / "labels"))
    assert lt.returncode == 2 and "ToyNet gives no per-token class logits" in lt.stderr
    assert len(lt.stderr.strip().splitlines()) == 1, lt.stderr
