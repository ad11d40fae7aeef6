"""End to end through the CLI on digits: train a ViT teacher, label tokens, train a VOLO with token
labeling + MixToken, then fine-tune it at twice the resolution from the low-resolution run."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from vitscale.cli import main
from vitscale.data.token_labels import TokenLabelStore
from vitscale.models.volo.model import _resample_grid_pos

FAST = ["data.num_workers=0", "log.flops=false", "checkpoint.every=0", "eval.every=0", "log.report=false"]


def test_token_labeling_pipeline_and_high_res_finetune(tmp_path, capsys):
    teacher, labels = tmp_path / "teacher", tmp_path / "labels"
    low, high = tmp_path / "volo32", tmp_path / "volo64"
    tiny_vit = ["model.num_layers=1", "train.batch_size=32"]
    assert main(["train", "digits_vit", "train.max_steps=2", f"train.output_dir={teacher}", *tiny_vit, *FAST]) == 0
    capsys.readouterr()

    # the teacher's own image side is checked against the teacher, before any data is read
    assert main(["label-tokens", "digits_vit", f"teacher.checkpoint={teacher}", *tiny_vit, "teacher.img_size=30",
                 str(labels)]) == 2  # fmt: skip
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "teacher.img_size=30 does not fit vit_debug" in err[0] and "multiple of 4" in err[0], err
    assert not labels.exists()
    assert main(["label-tokens", "digits_vit", f"teacher.checkpoint={teacher}", *tiny_vit,
                 "teacher.batch_size=500", "teacher.topk=3", str(labels)]) == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert summary["splits"]["train"]["images"] == 1497 and summary["splits"]["train"]["grid"] == [8, 8]
    store = TokenLabelStore(labels)
    d = store.dense(torch.arange(len(store)))
    assert d.shape == (1497, 10, 8, 8)  # the teacher ViT: patch 4 on 32 px
    torch.testing.assert_close(d.sum(1), torch.ones(1497, 8, 8))

    tiny_volo = ["model.layers=[1,1]", "train.batch_size=16", f"token_label.path={labels}"]
    assert main(["train", "digits_volo", "train.max_steps=3", f"train.output_dir={low}", *tiny_volo, *FAST]) == 0
    out = json.loads((low / "summary.json").read_text())
    assert out["steps"] == 3 and 0.0 <= out["val_top1"] <= 100.0
    recs = [json.loads(line) for line in (low / "metrics.jsonl").read_text().splitlines()]
    train_recs = [r for r in recs if "train_token_loss" in r]
    assert train_recs and all(torch.isfinite(torch.tensor(r["loss"])) for r in train_recs)

    # the trained VOLO evaluates through the CLI to the same accuracy
    ev = tmp_path / "eval.json"
    assert main(["eval", "digits_volo", f"checkpoint.path={low}", "model.layers=[1,1]", "data.num_workers=0",
                 "--output", str(ev)]) == 0  # fmt: skip
    assert json.loads(ev.read_text())["val_top1"] == pytest.approx(out["val_top1"])

    # 32 px -> 64 px: the 4x4 position embedding is resampled to 8x8, every other weight is loaded
    # (lr 0 keeps the loaded weights), the token labels are resampled to the 8x8 grid.
    assert main(["train", "digits_volo", "train.max_steps=1", f"train.output_dir={high}", "model.img_h=64",
                 "model.img_w=64", f"checkpoint.init_from={low}", "optim.lr=0", *tiny_volo, *FAST]) == 0  # fmt: skip
    w_low, w_high = load_file(str(low / "model.safetensors")), load_file(str(high / "model.safetensors"))
    assert w_high["pos_embed"].shape == (1, 8, 8, 64)
    torch.testing.assert_close(w_high["pos_embed"], _resample_grid_pos(w_low["pos_embed"], (8, 8)))
    for k in ("blocks.0.attn.qkv_per_head.weight", "outlookers.0.attn.attn.weight", "aux_head.weight", "head.bias"):
        torch.testing.assert_close(w_high[k], w_low[k])
