"""``vitscale train digits_dino`` as a user runs it, on a tiny backbone: it pretrains without labels,
logs the collapse signals (effective rank, the teacher's entropy and KL divergence from uniform) at
every log step and ends with the k-NN evaluation; a resumed run continues on the same curve (student,
teacher, centre, schedules and crops restored); the exported weights are the backbone alone; bad
settings are refused in one line before the first step."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest
from helpers import read_metrics
from safetensors import safe_open

from vitscale.tools.report.plots import plan
from vitscale.tools.report.run import read_run

TINY = ["model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=1", "model.num_attention_heads=2",
        "dino.local_crops_number=1", "dino.head_n_prototypes=64", "dino.head_bottleneck_dim=16",
        "dino.head_hidden_dim=32", "dino.freeze_last_layer_epochs=0.02", "train.batch_size=16", "train.max_steps=4",
        "train.log_every=1", "schedule.warmup_steps=1", "checkpoint.every=2", "checkpoint.keep=5",
        "eval.probe_l2=[1e-3]", "log.progress=plain", "log.tensorboard=false"]  # fmt: skip
SIGNALS = ("train_rankme", "train_teacher_entropy", "train_teacher_kl_uniform")


def vitscale(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vitscale", *args], capture_output=True, text=True, timeout=300)


def curve(rows):
    return [(r["step"], r["loss"], r["train_teacher_temp"], r.get("train_gram_loss"), r.get("train_gram_loss_weight"),
             r.get("train_dino_local_weight"), *(r[s] for s in SIGNALS)) for r in rows if "loss" in r]


@pytest.mark.slow
def test_digits_dino_pretrains_reports_signals_and_knn_and_resumes_exactly(tmp_path):
    centering = "softmax"  # the running centre is state the resume must restore (Sinkhorn-Knopp has none)
    run = tmp_path / "dino"
    args = [*TINY, f"dino.centering={centering}", "dino.warmup_teacher_temp=0.04", "dino.teacher_temp=0.07",
            "dino.warmup_teacher_temp_epochs=30",  # DINOv2's warm-up (the recipe has none)
            "dino.gram_loss_weight=1.0", "dino.gram_update_frequency=3",  # DINOv3's Gram teacher, refreshed after step 3,
            "dino.gram_teacher_crops_size=48", "dino.gram_teacher_no_distortions=true",  # on crops of its own (12x12 -> 8x8)
            "dino.gram_loss_weight_schedule=[0.5,1,2,1,2]", "dino.local_loss_weight_schedule=[1,1,0.5,1,2]"]  # scheduled weights
    p = vitscale("train", "digits_dino", *args, f"train.output_dir={run}")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_metrics(run)
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    log_k = math.log(64)
    for r in train_rows:  # the collapse signals at every log step, in their ranges
        assert math.isfinite(r["loss"]) and 1.0 <= r["train_rankme"] <= 16
        assert 0 <= r["train_teacher_entropy"] <= log_k + 1e-4 and 0 <= r["train_teacher_kl_uniform"] <= log_k + 1e-4
        assert {"train_dino_loss", "train_koleo_loss", "train_ibot_loss", "train_gram_loss"} <= r.keys()
    # DINOv3's linear_warmup_cosine_decay at iterations 0-3: the warm-up's start, the cosine's peak and end, the end
    assert [r["train_gram_loss_weight"] for r in train_rows] == [0.5, 1.0, 2.0, 2.0]
    assert [r["train_dino_local_weight"] for r in train_rows] == [1.0, 1.0, 0.5, 0.5]
    assert "the Gram teacher on crops of its own (48 px, undistorted; its patch features resized bicubic" in p.stdout
    temps = [r["train_teacher_temp"] for r in train_rows]
    assert temps[0] == pytest.approx(0.04) and temps == sorted(temps) and temps[-1] < 0.07  # warming up
    assert 0 <= rows[-1]["knn_top1"] <= rows[-1]["knn_top5"] <= 100 and "linear_probe_top1" in rows[-1]
    assert f"centring {centering}" in p.stdout
    page = (run / "report.html").read_text()
    assert '<figure id="plot-collapse">' in page and "no evaluation results logged" not in page
    panels = {panel.id: keys for panel, keys in plan([read_run(run)], compare=False)}
    # each collapse signal on its own axis (a rank and two values in nats of different scales)
    assert [panels[p] for p in ("collapse", "teacher_entropy", "teacher_kl")] == [[s] for s in SIGNALS]
    with safe_open(run / "model.safetensors", "pt") as f:  # the backbone alone: no head, no teacher
        keys = list(f.keys())
    assert "pos_embed" in keys and not any(k.startswith("task_parts.") for k in keys)

    # resume from the step-2 checkpoint: the same losses, signals and evaluation
    part = tmp_path / "part"
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / "step_00000002", part / "checkpoints" / "step_00000002")
    (part / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    p = vitscale("train", "digits_dino", *args, f"train.output_dir={part}", "log.report=false")
    assert p.returncode == 0, p.stderr[-3000:]
    again = read_metrics(part)
    assert curve(again) == curve(rows)
    assert again[-1]["knn_top1"] == rows[-1]["knn_top1"]


@pytest.mark.parametrize("extra, msg", [
    (["dino.local_crops_size=2"], "dino.local_crops_size=2 must be a multiple of the patch (4 pixels of vit_debug), "
                                  "at least one patch: e.g. dino.local_crops_size=4"),
    (["train.batch_size=1"], "dino.koleo_loss_weight=0.1 with 1 image per rank and micro-step: KoLeo needs a nearest "
                             "neighbour (one image gives NaN); raise train.batch_size or set dino.koleo_loss_weight=0"),
    (["dino.gram_loss_weight=1", "dino.gram_teacher_crops_size=50"],
     "dino.gram_teacher_crops_size=50 must be a multiple of the patch (4 pixels of vit_debug), at least one patch: e.g. 48 "
     "(the Gram teacher's patch grid is resized to the student's)"),
    (["dino.local_loss_weight_schedule=[1,1,0.5,2,3]"],
     "dino.local_loss_weight_schedule=[1, 1, 0.5, 2, 3] lasts 5 steps (warm-up and cosine), longer than the 4-step run: shorten them"),
])  # fmt: skip
def test_bad_settings_are_one_line_before_the_first_step(tmp_path, capsys, extra, msg):
    from vitscale.cli import main

    out = tmp_path / "run"
    assert main(["train", "digits_dino", *TINY, *extra, f"train.output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert err == f"vitscale train: {msg}\n"
    assert not (out / "metrics.jsonl").exists()


@pytest.mark.parametrize("extra, msg", [
    (["dino.local_crops_number=10000"], "dino: local_crops_number=10000 must be 0 to 64"),
    (["dino.global_crops_size=4096"], "dino: global_crops_size=4096 must be at most 1024 pixels"),
    (["dino.head_n_prototypes=1000000000"], "dino: head_n_prototypes=1000000000 must be 2 to 262144"),
    (["dino.head_n_prototypes=1"], "dino: head_n_prototypes=1 must be 2 to 262144 (one prototype makes every target 1 and "
                                   "both losses 0"),
    (["dino.local_crops_size=48"], "dino: local_crops_size=48 is larger than global_crops_size=32"),
    (["dino.global_crops_size=64", "dino.local_crops_size=16"], "the global crops of train.task=dino are 64 px, larger "
                                                                "than the loader's image (32x32"),
    (["data.auto_augment=rand-m9-mstd0.5-inc1"], "data.auto_augment=rand-m9-mstd0.5-inc1 with train.task=dino: the task's "
                                                 "views are cut and augmented by the loader's workers"),
    (["data.rrc_scale=[1.0,1.0]"], "data.rrc_scale=[1.0, 1.0] with train.task=dino"),
    (["data.hflip=0"], "data.hflip=0.0 with train.task=dino"),
    (["dino.gram_loss_weight=1", "dino.gram_teacher_crops_size=4096"], "dino: gram_teacher_crops_size=4096 must be 1 to 2048 pixels"),
    (["dino.gram_loss_weight=1", "dino.gram_global_teacher_resize_method=area"],
     "dino: gram_global_teacher_resize_method='area': choose one of bicubic, bilinear"),
    (["dino.gram_loss_weight_schedule=[1,2]"], "dino: gram_loss_weight_schedule=[1.0, 2.0] must be [start, peak, end, warmup_steps]"),
])  # fmt: skip
def test_bad_views_and_crop_bounds_are_refused_before_anything_is_written(tmp_path, capsys, extra, msg):
    """DINO's crop counts and sizes, its prototypes, and the data keys its views would ignore: one line,
    exit 2, no run folder."""
    from vitscale.cli import main

    out = tmp_path / "run"
    assert main(["train", "digits_dino", *TINY, *extra, f"train.output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vitscale train: {msg}") and err.count("\n") == 1, err
    assert not out.exists()


def test_a_teacher_that_stays_uniform_is_one_warning_line(tmp_path):
    """A teacher temperature of 100 flattens every target to uniform (the collapse centring alone brings
    about): the run names it in one line at the third log step past the threshold (``HOLD``), and goes on."""
    out = tmp_path / "run"
    p = vitscale("train", "digits_dino", *TINY, "train.max_steps=4", "dino.warmup_teacher_temp=100",
                 "dino.teacher_temp=100", "checkpoint.every=0", "log.report=false", f"train.output_dir={out}")  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [r for r in read_metrics(out) if "loss" in r]
    assert all(r["train_teacher_entropy"] > 0.9 * math.log(64) for r in rows)  # past the threshold at every log step
    said = [line for line in (p.stdout + p.stderr).splitlines() if line.startswith("warning:") and "the teacher's entropy" in line]
    # (the live line: the end-of-run lines repeat it, indented)
    assert len(said) == 1, p.stdout[-3000:] + p.stderr[-3000:]
    assert said[0].startswith("warning: step 3: the teacher's entropy is ") and "since step 1" in said[0]
    assert "every target is close to uniform" in said[0]
    # what the run warned about is in its summary: summary.json and the end-of-run lines (issue 49)
    assert json.loads((out / "summary.json").read_text())["warnings"] == said
    assert f"  warnings (1, in summary.json):\n    {said[0]}\n" in p.stdout
