"""``vitscale train ... train.task=feature_distill``: a student learns three frozen teachers of other widths
(files written here, as a user's would be: two ViTs and a CLIP) through its adaptor heads, with no labels;
each teacher's val-split cosines and loss, and the CLIP's zero-shot through the student's adaptor, are
evaluated and reach summary.json; a resume from the step-2 checkpoint continues the curve exactly (heads
and PHI-S statistics included); the exported weights are the student's backbone alone and the heads are a
weight set ``vitscale convert --key adaptors`` writes; ``vitscale eval`` of a checkpoint gives the numbers the
run logged for it (heads read from it, teachers read again), and leaves the entry out or refuses it without
them. Bad teachers are refused in one line before the first step with nothing written; a teacher whose features are not finite stops the run one step later,
naming the teacher and the step, the checkpoint before it intact. UNIC's ladder of projectors
(``head_ladder``) trains, evaluates, resumes exactly and is exported with the heads; a student without a
class token is refused it in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from helpers import read_metrics
from safetensors import safe_open

from vitscale.cli import main

RUN = ["train.max_steps=4", "train.log_every=1", "train.batch_size=16", "log.progress=plain", "log.report=false", "log.tensorboard=false",
       "log.flops=false", "checkpoint.every=2", "checkpoint.keep=5", "eval.probe_l2=[1e-3]", "data.num_workers=0"]  # fmt: skip


def vitscale(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vitscale", *args], capture_output=True, text=True, timeout=300)


def _teacher(path, width: int, model: str = "vit_debug") -> str:
    from vitscale import create_model
    from vitscale.checkpoint import write_weights

    over = {"num_classes": 0, "hidden_size": width, "ffn_hidden_size": 2 * width} if model == "vit_debug" else {"num_classes": 0}
    torch.manual_seed(width)  # the same teacher in every process: the run's curve is the test's to check
    m = create_model(model, **over)
    write_weights(m.state_dict(), path, {"model": model, "overrides": json.dumps(over)})
    return str(path)


def _clip(path) -> str:
    from vitscale import create_model
    from vitscale.checkpoint import write_weights

    torch.manual_seed(0)
    write_weights(create_model("clip_debug").state_dict(), path, {"model": "clip_debug", "overrides": "{}"})
    return str(path)


@pytest.mark.slow
def test_three_teachers_into_one_student_trains_evaluates_resumes_and_hands_over(tmp_path):
    a, b, c = _teacher(tmp_path / "a.safetensors", 32), _teacher(tmp_path / "b.safetensors", 48), _clip(tmp_path / "c.safetensors")
    teachers = (f"distill.teachers=[{{name: wide, path: {b}}}, {{name: narrow, path: {a}, standardize: running}}, "
                f"{{name: clip, path: {c}, standardize: running}}]")  # fmt: skip
    run = tmp_path / "run"
    p = vitscale("train", "digits_vit", "train.task=feature_distill", teachers, *RUN, f"train.output_dir={run}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "distill: teacher 'wide': heads summary+patch" in p.stdout and "PHI-S" in p.stdout
    assert "distill: teacher 'clip': a CLIP: matched on its image tower" in p.stdout
    rows = [r for r in read_metrics(run) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:  # per teacher: its loss, its feature cosines, its share of the step time
        assert {"train_wide_loss", "train_narrow_loss", "train_wide_patch_cos", "train_narrow_summary_cos",
                "wide_time_pct", "narrow_time_pct"} <= r.keys()  # fmt: skip
    assert rows[-1]["train_wide_patch_cos"] > rows[0]["train_wide_patch_cos"]  # the student moves towards the teacher
    summary = json.loads((run / "summary.json").read_text())
    assert "knn_top1" in summary and "linear_probe_top1" in summary
    for name, kinds in (("wide", ("summary", "patch")), ("narrow", ("summary", "patch")), ("clip", ("summary", "patch"))):
        assert summary[f"val_{name}_loss"] > 0  # the val split's, at the end (the task's default evaluations)
        for kind in kinds:
            assert -1 <= summary[f"val_{name}_{kind}_cos"] <= 1
    for key in ("val_clip_zeroshot_top1", "val_clip_zeroshot_top5", "val_clip_teacher_zeroshot_top1"):
        assert 0 <= summary[key] <= 100  # through the student's adaptor for the CLIP, and the CLIP itself
    assert not any(k.startswith(("val_wide_zero", "val_narrow_zero")) for k in summary)  # no text tower: no zero-shot
    last = [r for r in read_metrics(run) if "val_wide_summary_cos" in r]
    assert last and last[-1]["val_wide_summary_cos"] == summary["val_wide_summary_cos"]
    with safe_open(run / "model.safetensors", "pt") as f:  # the student's backbone alone
        assert "pos_embed" in f.keys() and not any(k.startswith(("task.", "distill.", "heads.")) for k in f.keys())
    out = tmp_path / "adaptors.safetensors"
    p2 = vitscale("convert", str(run), str(out), "--key", "adaptors")
    assert p2.returncode == 0, p2.stderr[-2000:]
    with safe_open(out, "pt") as f:
        keys = set(f.keys())
    assert {k.split(".")[1] for k in keys} == {"wide", "narrow", "clip"}
    # the report: each teacher's loss beside the run's, the cosines on a panel of their own, the time shares
    from vitscale.tools.report import read_run
    from vitscale.tools.report.plots import plan

    panels = {p.id: keys for p, keys in plan([read_run(run)], compare=False)}
    assert {"train_wide_loss", "train_narrow_loss", "train_clip_loss"} <= set(panels["loss"])
    assert {"train_wide_summary_cos", "train_wide_patch_cos", "train_narrow_summary_cos", "train_clip_patch_cos"} <= set(
        panels["teacher_cos"])  # fmt: skip
    assert {"wide_time_pct", "narrow_time_pct", "clip_time_pct"} <= set(panels["time_shares"])
    assert not [pid for pid in panels if pid.startswith("other-")], sorted(panels)

    part = tmp_path / "part"  # resume from the step-2 checkpoint: the same curve
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / "step_00000002", part / "checkpoints" / "step_00000002")
    p = vitscale("train", "digits_vit", "train.task=feature_distill", teachers, *RUN, f"train.output_dir={part}")
    assert p.returncode == 0, p.stderr[-3000:]
    again = [r for r in read_metrics(part) if "loss" in r]
    keys = ("loss", "train_wide_loss", "train_narrow_loss", "train_wide_patch_cos")
    assert [[r[k] for k in keys] for r in again] == [[r[k] for k in keys] for r in rows[2:]]


@pytest.mark.slow
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


# ------------------------------------------------------------------------------- refused before the first step
QUICK = ["train.max_steps=2", "train.batch_size=8", "log.progress=none", "log.report=false", "log.flops=false",
         "data.num_workers=0", "evals=[]", "checkpoint.every=1"]  # fmt: skip


@pytest.fixture(scope="module")
def teacher_files(tmp_path_factory):
    """A tiny ViT teacher, one that pools no summary (``pool: none``), and a file that holds no backbone."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("teachers")
    save_file({"encoder.weight": torch.zeros(4, 4)}, root / "junk.safetensors")
    return {"ok": _teacher(root / "ok.safetensors", 32), "none": _teacher_pooling_none(root / "none.safetensors"),
            "junk": str(root / "junk.safetensors")}  # fmt: skip


def _teacher_pooling_none(path) -> str:
    from vitscale import create_model
    from vitscale.checkpoint import write_weights

    over = {"num_classes": 0, "hidden_size": 32, "ffn_hidden_size": 64, "pool": "none"}
    write_weights(create_model("vit_debug", **over).state_dict(), path, {"model": "vit_debug", "overrides": json.dumps(over)})
    return str(path)


@pytest.mark.parametrize("teachers, code, says", [
    ("[{name: g, path: {junk}}]", 1, "distill.teachers[g]={junk}: its names (encoder.weight, ...) are none the vit family reads"),
    ("[{name: g, path: {ok}, img_size: 36}]", 2, "distill.teachers[g]={ok}: its model vit_debug cannot take 36x36 images "
     "(distill.teachers[g].img_size): image 36x36 is not divisible by patch_dim 8"),
    ("[{name: g, path: {none}}]", 2, "distill.teachers[g]: its summary is (1, 17, 32), not one vector per image"),
    ("[{name: g, path: {ok}}, {name: g, path: {none}}]", 2, "distill.teachers[1] and distill.teachers[0] are both named 'g'"),
    ("[{name: g, path: {ok}, weight: 0}]", 2, "distill.teachers[0]: weight=0.0 must be greater than 0"),
    ("[{name: g, path: {ok}}, {name: h, path: {ok}, weight: -0.5}]", 2, "distill.teachers[1]: weight=-0.5 must be greater than 0"),
], ids=["not_a_backbone", "no_whole_grid", "summary_not_a_vector", "same_name", "zero_weight", "negative_weight"])  # fmt: skip
def test_a_bad_teacher_is_refused_in_one_line_before_the_first_step(teacher_files, teachers, code, says, tmp_path, capsys):
    def fill(text: str) -> str:
        for key, path in teacher_files.items():
            text = text.replace("{" + key + "}", path)
        return text

    run = tmp_path / "run"
    capsys.readouterr()
    rc = main(["train", "digits_vit", "train.task=feature_distill", f"distill.teachers={fill(teachers)}", *QUICK,
               f"train.output_dir={run}"])  # fmt: skip
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == code and len(err) == 1 and fill(says) in err[0], err
    assert not run.exists()  # nothing written: no run folder, no checkpoint, no metrics


def test_a_teacher_with_nonfinite_features_stops_the_run_one_step_later(teacher_files, tmp_path, capsys):
    """Finite weights whose features overflow (the final norm's scale at 3e38): the step is not applied,
    its batch not absorbed by the standardisers, and the next step stops the run with the non-finite
    guard's error (exit 1) naming the teacher and the step; the checkpoint of that step holds the model
    before it and finite statistics; nothing is exported. A non-finite last step stops the run at that step."""
    from safetensors.torch import load_file

    from vitscale import create_model
    from vitscale.checkpoint import write_weights

    over = {"num_classes": 0, "hidden_size": 32, "ffn_hidden_size": 64}
    sd = create_model("vit_debug", **over).state_dict()
    sd["norm.weight"] = torch.full_like(sd["norm.weight"], 3e38)
    bad = tmp_path / "overflow.safetensors"
    write_weights(sd, bad, {"model": "vit_debug", "overrides": json.dumps(over)})
    run = tmp_path / "run"
    capsys.readouterr()
    rc = main(["train", "digits_vit", "train.task=feature_distill", f"distill.teachers=[{{name: ok, path: {teacher_files['ok']}}}, "
               f"{{name: bad, path: {bad}}}]", *QUICK, "train.max_steps=4", "train.log_every=1", f"train.output_dir={run}"])  # fmt: skip
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 1 and len(err) == 1, err
    assert "distill: teacher 'bad''s features at step 1 are not finite" in err[0], err
    rows = [r for r in read_metrics(run) if "loss" in r]
    assert [r["step"] for r in rows] == [1] and rows[0]["loss"] == rows[0]["train_bad_loss"] == "nan"  # not applied
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000001"]
    assert not (run / "model.safetensors").exists() and not (run / "summary.json").exists()
    state = load_file(run / "checkpoints" / "step_00000001" / "task-rank00000.safetensors")
    assert all(torch.isfinite(v.double()).all() for v in state.values())
    assert float(state["task.distill.norms.bad.summary.count"]) == 0 and float(state["task.distill.norms.ok.summary.count"]) == 8

    last = tmp_path / "last"  # the run's last step is the bad one: no later step reads its flag, it is read at once
    rc = main(["train", "digits_vit", "train.task=feature_distill", f"distill.teachers=[{{name: bad, path: {bad}}}]", *QUICK,
               "train.max_steps=1", f"train.output_dir={last}"])  # fmt: skip
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 1 and len(err) == 1 and "distill: teacher 'bad''s features at step 1 are not finite" in err[0], err
    assert not (last / "model.safetensors").exists() and not (last / "summary.json").exists()


@pytest.mark.slow
def test_vitscale_eval_of_a_checkpoint_gives_the_runs_last_feature_distill_numbers(tmp_path, capsys):
    """``vitscale eval RUN/config.yaml checkpoint.path=RUN`` reads the student, its adaptor heads and
    standardisers from the run's last checkpoint and the teachers (a ViT, PHI-S; a CLIP, running, with its
    zero-shot) from distill.teachers: its ``val_*`` numbers are those the run logged at its end. A weights
    file (the student alone) or a teacher file gone: the entry is left out of the defaults with a note (k-NN
    and the probe still run), and refused in one line (exit 2) when evals: names it."""
    a, c = _teacher(tmp_path / "a.safetensors", 32), _clip(tmp_path / "c.safetensors")
    run = tmp_path / "run"
    assert main(["train", "digits_vit", "train.task=feature_distill", *RUN, "train.max_steps=2", "log.progress=none",
                 f"distill.teachers=[{{name: vit, path: {a}}}, {{name: clip, path: {c}, standardize: running}}]",
                 f"train.output_dir={run}"]) == 0  # fmt: skip
    logged = [r for r in read_metrics(run) if "val_vit_loss" in r][-1]  # the final evaluation, after step 2
    want = {k: v for k, v in logged.items() if k.startswith("val_")}
    assert {"val_vit_summary_cos", "val_vit_patch_cos", "val_clip_patch_cos", "val_clip_zeroshot_top1",
            "val_clip_teacher_zeroshot_top5"} <= want.keys()  # fmt: skip
    config = str(run / "config.yaml")

    def evaluate(*args):
        capsys.readouterr()
        rc = main(["eval", config, *args])
        out, err = capsys.readouterr()
        return rc, (json.loads(out) if rc == 0 else None), [line for line in err.splitlines() if line.strip()]

    for path in (run, run / "checkpoints" / "step_00000002"):  # the run folder (its newest checkpoint), a step folder
        rc, got, err = evaluate(f"checkpoint.path={path}")
        assert rc == 0 and err == [], err
        assert {k for k in got if k.startswith("val_")} == want.keys()
        for k, v in want.items():
            assert got[k] == pytest.approx(v, abs=1e-6), k
        assert got["knn_top1"] == logged["knn_top1"] and "linear_probe_top1" in got

    weights = run / "model.safetensors"  # the student's backbone alone
    rc, got, err = evaluate(f"checkpoint.path={weights}")
    assert rc == 0 and "knn_top1" in got and "linear_probe_top1" in got and not any(k.startswith("val_") for k in got)
    assert len(err) == 1 and err[0].startswith("note: evals: kind feature_distill left out") and "weights file" in err[0], err
    rc, _, err = evaluate(f"checkpoint.path={weights}", "evals=[{kind: feature_distill}]")
    assert rc == 2 and len(err) == 1 and "holds the student's backbone alone, not the adaptor heads" in err[0], err

    (tmp_path / "a.safetensors").rename(tmp_path / "gone.safetensors")  # a teacher file gone
    rc, got, err = evaluate(f"checkpoint.path={run}")
    assert rc == 0 and "knn_top1" in got and not any(k.startswith("val_") for k in got)
    assert len(err) == 1 and "left out" in err[0] and f"distill.teachers[vit]={a}: no such file" in err[0], err
    rc, _, err = evaluate(f"checkpoint.path={run}", "evals=[{kind: feature_distill}]")
    assert rc == 2 and len(err) == 1 and f"distill.teachers[vit]={a}: no such file" in err[0], err


# ------------------------------------------------------------------------------- UNIC's ladder of projectors
LADDER = ["model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=3", "model.pool=token",
          "train.max_steps=4", "train.log_every=1", "train.batch_size=8", "log.progress=none", "log.report=false",
          "log.flops=false", "data.num_workers=0", "checkpoint.every=2", "checkpoint.keep=5",
          "evals=[{kind: feature_distill, every: 0}]"]  # fmt: skip


def test_a_ladder_of_projectors_trains_evaluates_resumes_exactly_and_exports(teacher_files, tmp_path, capsys):
    """``head_ladder: true``: heads on the student's 3 blocks, summed (UNIC); 4 steps, its val-split numbers
    through the ladder (``vitscale eval`` of the run gives them again), a resume from the step-2
    checkpoint continues the curve exactly (the ladder's weights and optimizer state in the checkpoint),
    and the ``adaptors`` weight set holds the ladder."""
    teachers = f"distill.teachers=[{{name: g, path: {teacher_files['ok']}, head_ladder: true}}]"
    run = tmp_path / "run"
    capsys.readouterr()
    assert main(["train", "digits_vit", "train.task=feature_distill", teachers, *LADDER, f"train.output_dir={run}"]) == 0
    assert "distill: teacher 'g': heads summary+patch 32->32 (a ladder: the sum over the student's 3 blocks)" in capsys.readouterr().out
    rows = [r for r in read_metrics(run) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["loss"] < rows[0]["loss"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["val_g_loss"] > 0 and -1 <= summary["val_g_patch_cos"] <= 1
    capsys.readouterr()  # vitscale eval of the run: the ladder read from its checkpoint, the run's numbers
    assert main(["eval", str(run / "config.yaml"), f"checkpoint.path={run}"]) == 0
    got = json.loads(capsys.readouterr().out)
    for k in ("val_g_loss", "val_g_summary_cos", "val_g_patch_cos"):
        assert got[k] == pytest.approx(summary[k], abs=1e-6), k

    part = tmp_path / "part"  # resume from the step-2 checkpoint: the same curve
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / "step_00000002", part / "checkpoints" / "step_00000002")
    assert main(["train", "digits_vit", "train.task=feature_distill", teachers, *LADDER, f"train.output_dir={part}"]) == 0
    keys = ("loss", "train_g_loss", "train_g_summary_cos", "train_g_patch_cos")
    again = [r for r in read_metrics(part) if "loss" in r]
    assert [[r[k] for k in keys] for r in again] == [[r[k] for k in keys] for r in rows[2:]]
    assert json.loads((part / "summary.json").read_text())["val_g_loss"] == summary["val_g_loss"]

    out = tmp_path / "adaptors.safetensors"
    assert main(["convert", str(run), str(out), "--key", "adaptors"]) == 0
    with safe_open(out, "pt") as f:
        names = set(f.keys())
    for kind in ("summary", "patch"):  # the last block's head and the ladder's on blocks 1 and 2
        assert f"teachers.g.heads.{kind}.fc1.weight" in names
        assert {f"teachers.g.ladder.{kind}.{b}.fc1.weight" for b in (0, 1)} <= names


def test_a_ladder_on_a_student_without_a_class_token_is_refused_in_one_line(teacher_files, tmp_path, capsys):
    run = tmp_path / "run"
    capsys.readouterr()
    rc = main(["train", "digits_vit", "train.task=feature_distill", "model.class_token=false",
               f"distill.teachers=[{{name: g, path: {teacher_files['ok']}, head_ladder: true}}]", *QUICK,
               f"train.output_dir={run}"])  # fmt: skip
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and "distill.teachers[g].head_ladder: the ladder reads every block's class token" in err[0], err
    assert not run.exists()
