"""Variable resolution through the CLI on the digits: a multi-resolution ViT run (data.image_sizes), a
NaFlex run of the built-in digits_naflex config evaluated at three sequence lengths (summary.json and
report.html), and the one-line refusals of what cannot run, before any step."""

from __future__ import annotations

import json

import pytest

from vitscale.cli import main

TINY = ["train.epochs=0", "train.max_steps=4", "train.log_every=1", "model.num_layers=1", "schedule.warmup_steps=2",
        "log.progress=none", "eval.batch_size=100", "checkpoint.export_safetensors=false", "log.tensorboard=false"]  # fmt: skip


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_multi_resolution_run_trains_at_three_sizes(tmp_path, capsys):
    out = tmp_path / "multi"
    assert main(["train", "digits_vit", *TINY, f"train.output_dir={out}", "data.image_sizes=[24,32,40]",
                 "data.batch_sizes=[48,32,16]", "log.report=false", "eval.every=0",
                 "evals=[{kind: classification}, {kind: sizes, image_sizes: [24, 40]}]"]) == 0  # fmt: skip
    log = (out / "train.log").read_text()
    assert ("variable resolution: image sizes 24 px x 48, 32 px x 32, 40 px x 16 images per step (a keyed draw per step); "
            "evaluation at 40 px") in log  # fmt: skip
    rows = [r for r in _rows(out) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert {r["img_size"] for r in rows} <= {24, 32, 40} and len({r["img_size"] for r in rows}) >= 2  # each step's own size
    # each step counts its own images and FLOPs: TFLOP/s over img/s is the step's FLOPs per image, which
    # takes as many values as the steps' sizes (a fixed-size run has one)
    per_image = {round(r["tflops"] / r["img_per_s"], 15) for r in rows}
    assert len(per_image) >= 2, rows
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["val_top1"] <= 100 and summary["steps"] == 4
    assert 0 <= summary["sizes_px24_top1"] <= 100 and summary["sizes_px40_top1"] == summary["val_top1"]  # val: at 40 px


def test_clip_image_tower_trains_at_several_sizes(tmp_path):
    """CLIP's image tower takes data.image_sizes as the ViT does: each step at its own size (the
    captions unchanged), the zero-shot evaluation at the largest."""
    out = tmp_path / "clip_multi"
    assert main(["train", "digits_clip", "train.epochs=0", "train.max_steps=4", "train.log_every=1", "log.progress=none",
                 "schedule.warmup_steps=2", "checkpoint.export_safetensors=false", "log.tensorboard=false", "log.report=false",
                 f"train.output_dir={out}", "data.image_sizes=[24,40]", "data.batch_sizes=[32,16]",
                 "eval.every=0"]) == 0  # fmt: skip
    log = (out / "train.log").read_text()
    assert ("variable resolution: image sizes 24 px x 32, 40 px x 16 images per step (a keyed draw per step); "
            "evaluation at 40 px") in log  # fmt: skip
    rows = [r for r in _rows(out) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and {r["img_size"] for r in rows} == {24, 40}, rows
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and 0 <= summary["zeroshot_top1"] <= 100


def test_progressive_schedule_grows_the_size_in_stages(tmp_path):
    out = tmp_path / "progressive"
    assert main(["train", "digits_vit", *TINY, "train.max_steps=6", f"train.output_dir={out}", "data.image_sizes=[24,32,40]",
                 "data.size_schedule=progressive", "data.size_stages=[0,0.5,0.8]", "log.report=false", "log.flops=false",
                 "eval.every=0", "data.eval_image_size=32"]) == 0  # fmt: skip
    rows = [r for r in _rows(out) if "loss" in r]
    # step s of 6 is at the fraction (s - 1) / 6 of the run: 0, 1/6, 2/6 -> 24 px; 3/6, 4/6 -> 32; 5/6 >= 0.8 -> 40
    assert [r["img_size"] for r in rows] == [24, 24, 24, 32, 32, 40]
    assert "evaluation at 32 px" in (out / "train.log").read_text()


def test_naflex_run_reports_accuracy_per_sequence_length(tmp_path):
    out = tmp_path / "naflex"
    assert main(["train", "digits_naflex", *TINY, f"train.output_dir={out}", "data.tokens_per_batch=1600",
                 "data.mixup_alpha=0.8", "data.cutmix_alpha=1.0", "data.random_erasing=0.25"]) == 0  # NaFlex augmentation
    log = (out / "train.log").read_text()
    assert ("variable resolution: NaFlex sequence lengths 36 tokens x 44, 64 tokens x 25, 100 tokens x 16 images per step "
            "(a keyed draw per step); evaluation at 100 tokens") in log  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    for n in (36, 64, 100):
        assert 0 <= summary[f"sizes_seq{n}_top1"] <= 100
    assert summary["sizes_seq100_top1"] == summary["val_top1"]  # the same split at the same sequence length (the largest)
    report = (out / "report.html").read_text()
    assert all(f"sizes_seq{n}_top1" in report for n in (36, 64, 100))


@pytest.mark.parametrize("config,overrides,message", [
    ("digits_volo", ["data.image_sizes=[32,48]"],
     "data.image_sizes=[32, 48] needs images of another size in every batch, which volo_debug (VOLO) cannot take: it takes "
     "images of one size per run"),
    ("digits_vit", ["data.seq_lens=[64]"], "which vit_debug (VisionTransformer) cannot take"),
    ("digits_vit", ["data.image_sizes=[2,32]"], "data.image_sizes[0]=2 is smaller than one patch (4 px)"),
    ("digits_vit", ["data.image_sizes=[24,30]"], "data.image_sizes[1]=30 is not divisible by the model's patch size 4"),
    ("digits_naflex", ["data.tokens_per_batch=60"], "data.tokens_per_batch=60 is below one sequence per rank"),
    ("digits_naflex", ["data.seq_lens=[1,64]"], "data.seq_lens[0]=1 is below the smallest image's minimum of 2 patches"),
    ("digits_vit", ["evals=[{kind: sizes, seq_lens: [16]}]"], "data.eval_seq_len is the evaluation size of a run with data.seq_lens"),
])  # fmt: skip
def test_bad_variable_resolution_settings_are_refused_in_one_line(tmp_path, capsys, config, overrides, message):
    out = tmp_path / "run"
    assert main(["train", config, f"train.output_dir={out}", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (out / "metrics.jsonl").exists()  # refused before the first step
