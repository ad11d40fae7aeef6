"""``vitscale train ... train.task=feature_distill``: a student learns two frozen teachers of other widths
(files written here, as a user's would be) through its adaptor heads, with no labels; a resume from the
step-2 checkpoint continues the curve exactly (heads and PHI-S statistics included); the exported weights
are the student's backbone alone and the heads are a weight set ``vitscale convert --key adaptors``
writes; a teacher that gives no tokens is refused in one line with nothing trained."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from helpers import read_metrics
from safetensors import safe_open

pytestmark = pytest.mark.slow

RUN = ["train.max_steps=4", "train.log_every=1", "train.batch_size=16", "log.progress=plain", "log.report=false",
       "log.flops=false", "checkpoint.every=2", "checkpoint.keep=5", "eval.probe_l2=[1e-3]", "data.num_workers=0"]  # fmt: skip


def vitscale(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vitscale", *args], capture_output=True, text=True, timeout=300)


def _teacher(path, width: int, model: str = "vit_debug") -> str:
    from vitscale import create_model
    from vitscale.checkpoint import write_weights

    over = {"num_classes": 0, "hidden_size": width, "ffn_hidden_size": 2 * width} if model == "vit_debug" else {"num_classes": 0}
    m = create_model(model, **over)
    write_weights(m.state_dict(), path, {"model": model, "overrides": json.dumps(over)})
    return str(path)


def test_two_teachers_into_one_student_trains_resumes_and_hands_over(tmp_path):
    a, b = _teacher(tmp_path / "a.safetensors", 32), _teacher(tmp_path / "b.safetensors", 48)
    teachers = f"distill.teachers=[{{name: wide, path: {b}}}, {{name: narrow, path: {a}, standardize: running}}]"
    run = tmp_path / "run"
    p = vitscale("train", "digits_vit", "train.task=feature_distill", teachers, *RUN, f"train.output_dir={run}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "distill: teacher 'wide': heads summary+patch" in p.stdout and "PHI-S" in p.stdout
    rows = [r for r in read_metrics(run) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:  # per teacher: its loss, its feature cosines, its share of the step time
        assert {"train_wide_loss", "train_narrow_loss", "train_wide_patch_cos", "train_narrow_summary_cos",
                "wide_time_pct", "narrow_time_pct"} <= r.keys()  # fmt: skip
    assert rows[-1]["train_wide_patch_cos"] > rows[0]["train_wide_patch_cos"]  # the student moves towards the teacher
    summary = json.loads((run / "summary.json").read_text())
    assert "knn_top1" in summary and "linear_probe_top1" in summary
    with safe_open(run / "model.safetensors", "pt") as f:  # the student's backbone alone
        assert "pos_embed" in f.keys() and not any(k.startswith(("task.", "distill.", "heads.")) for k in f.keys())
    out = tmp_path / "adaptors.safetensors"
    p2 = vitscale("convert", str(run), str(out), "--key", "adaptors")
    assert p2.returncode == 0, p2.stderr[-2000:]
    with safe_open(out, "pt") as f:
        keys = set(f.keys())
    assert any(k.startswith("teachers.wide.") for k in keys) and any(k.startswith("teachers.narrow.") for k in keys)

    part = tmp_path / "part"  # resume from the step-2 checkpoint: the same curve
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / "step_00000002", part / "checkpoints" / "step_00000002")
    p = vitscale("train", "digits_vit", "train.task=feature_distill", teachers, *RUN, f"train.output_dir={part}")
    assert p.returncode == 0, p.stderr[-3000:]
    again = [r for r in read_metrics(part) if "loss" in r]
    keys = ("loss", "train_wide_loss", "train_narrow_loss", "train_wide_patch_cos")
    assert [[r[k] for k in keys] for r in again] == [[r[k] for k in keys] for r in rows[2:]]


def test_a_teacher_without_tokens_is_refused_before_anything_trains(tmp_path):
    v = _teacher(tmp_path / "volo.safetensors", 0, model="volo_debug")
    p = vitscale("train", "digits_vit", "train.task=feature_distill", f"distill.teachers=[{{name: v, path: {v}}}]", *RUN,
                 f"train.output_dir={tmp_path / 'run'}")  # fmt: skip
    assert p.returncode != 0
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "distill.teachers[v]" in err[0] and "gives no tokens" in err[0], p.stderr[-2000:]
    assert not (tmp_path / "run" / "checkpoints").exists()
    p = vitscale("train", "digits_vit", "train.task=feature_distill", *RUN, f"train.output_dir={tmp_path / 'none'}")
    assert p.returncode == 2 and "distill.teachers is empty" in p.stderr
