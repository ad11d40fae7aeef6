"""``vitscale train digits_mae`` as a user runs it, on a tiny backbone: it pretrains without labels,
logs the embeddings' effective rank at every log step (metrics.jsonl, report.html) and ends with the
k-NN evaluation; its decoder reads the tokens through the encoder's final LayerNorm and its position
table stays MAE's fixed sin-cos one; a resumed run continues on the same curve (decoder and masks restored); the exported
weights are the backbone alone, which a classification fine-tune takes through
``checkpoint.init_from``; a mask ratio outside (0, 1) is refused in one line."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch
from helpers import read_metrics
from safetensors import safe_open
from safetensors.torch import load_file

from vitscale.models.common.pos_embed import sincos_2d

BACKBONE = [
    "model.hidden_size=32",
    "model.ffn_hidden_size=64",
    "model.num_layers=1",
    "model.num_attention_heads=2",
]
TINY = [*BACKBONE, "mae.decoder_width=16", "mae.decoder_depth=1", "mae.decoder_heads=2", "train.max_steps=4",
        "train.log_every=1", "schedule.warmup_steps=1", "checkpoint.every=2", "checkpoint.keep=5", "eval.probe_l2=[1e-3]",
        "log.progress=plain", "log.tensorboard=false"]  # fmt: skip


def vitscale(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vitscale", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_digits_mae_pretrains_reports_knn_and_rank_resumes_and_hands_over(tmp_path):
    run = tmp_path / "mae"
    p = vitscale("train", "digits_mae", *TINY, f"train.output_dir={run}")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_metrics(run)
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    assert all(
        math.isfinite(r["loss"]) and 1.0 <= r["train_rankme"] <= 32 for r in train_rows
    )  # at every log step
    assert 0 <= rows[-1]["knn_top1"] <= rows[-1]["knn_top5"] <= 100 and "linear_probe_top1" in rows[-1]
    assert "val_top1" not in rows[-1]  # labels are not trained on: no classification evaluation
    assert "mae: mask ratio 0.75 (16 of 64 patches seen)" in p.stdout
    # the decoder reads the tokens through the mean-pooled model's fc_norm (MAE's final LayerNorm, trained):
    # only the classifier is unreached; the position table is MAE's fixed sin-cos one, not trained either
    assert ("mae: 2 tensors the objective does not reach are frozen (no gradient, not in the optimizer): "
            "head.weight, head.bias\n") in p.stdout  # fmt: skip
    page = (run / "report.html").read_text()
    assert '<figure id="plot-collapse">' in page and '<figure id="plot-knn">' in page
    # the report opens with the k-NN and probe the run ended with (the task's default evaluations)
    assert "no evaluation results logged" not in page and '<figure id="plot-linear_probe">' in page
    assert f'<div class="v">{rows[-1]["knn_top1"]:.2f}%</div><div class="k">knn_top1</div>' in page
    with safe_open(run / "model.safetensors", "pt") as f:  # the backbone alone: no decoder
        keys = list(f.keys())
    assert "pos_embed" in keys and not any(k.startswith("task_parts.") for k in keys)
    table = torch.cat([torch.zeros(1, 32), sincos_2d(32, 8, 8)])[None]
    assert torch.equal(load_file(run / "model.safetensors")["pos_embed"], table)

    # resume from the step-2 checkpoint: the same losses and evaluation (the decoder and masks restored)
    part = tmp_path / "part"
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / "step_00000002", part / "checkpoints" / "step_00000002")
    (part / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    p = vitscale("train", "digits_mae", *TINY, f"train.output_dir={part}", "log.report=false")
    assert p.returncode == 0, p.stderr[-3000:]
    again = read_metrics(part)
    assert [(r["step"], r["loss"], r["train_rankme"]) for r in again if "loss" in r] == \
        [(r["step"], r["loss"], r["train_rankme"]) for r in train_rows]  # fmt: skip
    assert again[-1]["knn_top1"] == rows[-1]["knn_top1"]

    # a supervised fine-tune of the same backbone starts from exactly those weights (a step at lr 0
    # leaves them as loaded), and evaluates as classification: the run folder's newest checkpoint is
    # read without the decoder, as vitscale eval and vitscale export read it
    ft = tmp_path / "ft"
    p = vitscale("train", "digits_vit", *BACKBONE, f"checkpoint.init_from={run}", "train.max_steps=1", "optim.lr=0",
                 "eval.every=0", f"train.output_dir={ft}", "log.progress=plain", "log.report=false")  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "val_top1" in read_metrics(ft)[-1]
    mae, tuned = load_file(run / "model.safetensors"), load_file(ft / "model.safetensors")
    assert mae.keys() == tuned.keys() and all(mae[k].equal(tuned[k]) for k in mae)


def test_a_mask_ratio_outside_zero_one_is_one_line_before_training(tmp_path, capsys):
    from vitscale.cli import main

    assert main(["train", "digits_mae", "mae.mask_ratio=1.0", f"train.output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == "vitscale train: mae: mask_ratio=1.0 must lie in (0, 1): the fraction of patches removed (MAE: 0.75)\n"
    )
    assert not (tmp_path / "run").exists()  # refused before anything was written
