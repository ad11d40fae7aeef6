"""Continued DINO pretraining from timm's DINOv2 weights and the teacher handed back, as a user runs it:
a ``vit_small_patch14_reg4_dinov2``-format file (random weights, shrunk: 2 blocks of width 64, 28 px)
through ``checkpoint.init_from`` under ``train.task=dino`` — the student and the EMA teacher start from
it (a run at ``optim.lr=0`` leaves both where they started: its student and teacher give timm's
features); a run from it trains; ``vitscale convert --key teacher`` writes the teacher's backbone
as timm's file (``strict=True``) and as vitscale weights that ``checkpoint.init_from``, ``vitscale eval``
and ``vitscale export`` take."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import randomize, read_metrics, rel_l2
from safetensors.torch import load_file, save_file

from vitscale.cli import main
from vitscale.export.source import load_source

timm = pytest.importorskip("timm")

TIMM = "vit_small_patch14_reg4_dinov2"
SHRINK = dict(img_size=28, depth=2, embed_dim=64, num_heads=4)  # a 2 x 2 grid of 14 px patches
RUN = ["model.name=vit_s14_reg4_dinov2", "model.hidden_size=64", "model.ffn_hidden_size=256",
       "model.num_attention_heads=4", "model.num_layers=2", "model.patch_dim=14", "model.img_h=28", "model.img_w=28",
       "model.pool=token", "dino.global_crops_size=28", "dino.local_crops_number=1", "dino.local_crops_size=14",
       "dino.head_n_prototypes=64", "dino.head_bottleneck_dim=16", "dino.head_hidden_dim=32", "train.batch_size=16",
       "train.log_every=1", "schedule.warmup_steps=1", "eval.every=0", "eval.probe_l2=[1e-3]", "log.progress=plain",
       "log.report=false"]  # fmt: skip


def timm_features(sd: dict, x: torch.Tensor) -> torch.Tensor:
    """The pooled features of timm's model holding ``sd`` (``strict=True``; the digits run's classifier,
    which DINO leaves frozen, makes it timm's model with 10 classes)."""
    tm = timm.create_model(TIMM, pretrained=False, num_classes=10, **SHRINK).eval()
    tm.load_state_dict(sd, strict=True)
    with torch.no_grad():
        return tm.forward_head(tm.forward_features(x), pre_logits=True)


def test_timm_dinov2_continues_pretraining_and_its_teacher_goes_back_to_timm(tmp_path, capsys):
    torch.manual_seed(0)
    tm = timm.create_model(TIMM, pretrained=False, **SHRINK).eval()
    randomize(tm, scale=0.1)  # LayerScale, registers and all: every tensor matters
    published = tmp_path / "dinov2_reg4.safetensors"
    save_file({k: v.contiguous() for k, v in tm.state_dict().items()}, published)
    x = torch.randn(3, 3, 28, 28)
    with torch.no_grad():
        ref = tm(x)

    # at optim.lr=0 the student and the teacher stay as checkpoint.init_from loaded them
    still = tmp_path / "still"
    assert main(["train", "digits_dino", *RUN, f"checkpoint.init_from={published}", "optim.lr=0", "train.max_steps=1",
                 f"train.output_dir={still}"]) == 0  # fmt: skip
    for key in ("model", "teacher"):
        out = tmp_path / f"{key}_timm.safetensors"
        assert main(["convert", str(still), str(out), "--key", key, "--to", "timm"]) == 0
        assert rel_l2(timm_features(load_file(out), x), ref) < 1e-5, (
            key
        )  # timm's model loads it with strict=True

    # the teacher as vitscale weights (the header names the model): vitscale reads it, eval probes it ...
    teacher = tmp_path / "teacher.safetensors"
    assert main(["convert", str(still), str(teacher), "--key", "teacher"]) == 0
    ours = load_source(teacher).model
    with torch.no_grad():
        assert rel_l2(ours.forward_head(ours.forward_features(x), pre_logits=True), ref) < 1e-5
    capsys.readouterr()
    assert main(["eval", str(still / "config.yaml"), f"checkpoint.path={teacher}", "eval.probe=linear"]) == 0
    assert "top1" in capsys.readouterr().out
    assert main(["export", str(teacher), "--format", "torch-export", "--config", str(still / "config.yaml"),
                 "--out", str(tmp_path / "served")]) == 0  # fmt: skip
    assert json.loads((tmp_path / "served" / "export.json").read_text())["check"]["passed"]

    # ... and a run continues from it: it trains, and its teacher moves with the student
    run = tmp_path / "run"
    assert main(["train", "digits_dino", *RUN, f"checkpoint.init_from={teacher}", "train.max_steps=3",
                 f"train.output_dir={run}"]) == 0  # fmt: skip
    rows = [r for r in read_metrics(run) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(math.isfinite(r["loss"]) for r in rows)
    moved = tmp_path / "moved_timm.safetensors"
    assert main(["convert", str(run), str(moved), "--key", "teacher", "--to", "timm"]) == 0
    assert 0 < rel_l2(timm_features(load_file(moved), x), ref) < 0.5
    # vitscale export --teacher: the same teacher, straight from the run folder
    assert main(["export", str(run), "--teacher", "--format", "torch-export"]) == 0
    info = json.loads((run / "export" / "torch-export-teacher" / "export.json").read_text())
    assert info["check"]["passed"] and info["model"]["teacher"] and info["model"]["name"] == "vit_s14_reg4_dinov2"


def test_teacher_and_timm_misuse_is_one_line(tmp_path, capsys):
    weights = tmp_path / "w.safetensors"
    save_file({"a": torch.zeros(1)}, weights)
    assert main(["export", str(weights), "--teacher"]) == 1
    assert capsys.readouterr().err.startswith("vitscale export: --teacher reads the teacher from a run folder's checkpoint")
    assert main(["export", str(tmp_path), "--teacher"]) == 1  # a folder without checkpoints
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no checkpoint to read the teacher from" in err
    assert main(["convert", str(tmp_path), str(tmp_path / "t.safetensors"), "--to", "timm", "--max-shard-size", "1GB"]) == 2
    assert capsys.readouterr().err == "vitscale convert: --to timm writes one file: drop --max-shard-size\n"
