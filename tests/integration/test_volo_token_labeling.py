"""End to end through the CLI on digits: train a ViT teacher, label tokens, train a VOLO with token
labeling + MixToken, then fine-tune it at twice the resolution from the low-resolution run; train a
VOLO from a label folder in TokenLabeling's published format (one ``.pt`` file per image)."""

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
    assert store.meta["format"] == "topk_logits"  # the teacher's top-k logits, as TokenLabeling stores them
    v, i = store.topk_maps(torch.arange(len(store)))
    assert v.shape == i.shape == (1497, 3, 8, 8)  # the teacher ViT: patch 4 on 32 px
    assert (v[:, :-1] >= v[:, 1:]).all() and (v < 0).any()  # sorted logits, not probabilities

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


def test_tokenlabeling_label_files_train_through_the_cli(digits_data, tmp_path, capsys):
    """A folder as TokenLabeling's generate_label.py writes it (<class>/<image stem>.pt, [2, 5, H, W]
    half: top-5 logits and their class indices) trains the recipe's way (crop class target mixed
    with the label, the reference's box); a file of another kind is refused in one line naming it."""
    train = digits_data / "folder" / "train"
    labels = tmp_path / "tl_labels"
    names = (digits_data / "folder" / "classnames.txt").read_text().split()
    g = torch.Generator().manual_seed(0)
    for image in sorted(train.glob("*/*.png")):
        y = names.index(image.parent.name)
        logits = torch.randn(10, 7, 7, generator=g)
        logits[y] += 4.0  # a teacher that mostly names the class
        top = logits.topk(5, dim=0)
        (labels / image.parent.name).mkdir(parents=True, exist_ok=True)
        torch.save(torch.stack([top.values, top.indices.float()]).half(), labels / image.parent.name / f"{image.stem}.pt")
    args = ["train", "digits_volo", "data.format=imagefolder", f"data.train_path={train}",
            f"data.val_path={digits_data / 'folder' / 'val'}", f"token_label.path={labels}", "model.layers=[1,1]",
            "train.batch_size=16", "train.max_steps=2", "token_label.ground_truth_mix=true",
            "token_label.reference_box=true", *FAST]  # fmt: skip
    capsys.readouterr()
    assert main([*args, "data.num_workers=1", f"train.output_dir={tmp_path / 'run'}"]) == 0  # files read in the worker
    assert "TokenLabeling's files" in capsys.readouterr().out
    recs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_token_loss"] for r in recs if "train_token_loss" in r]
    assert losses and all(0 < x < 10 for x in losses)

    # a file missing in a worker's batch: one line naming it, not the worker's traceback
    first = sorted(sorted(p for p in train.iterdir() if p.is_dir())[0].glob("*.png"))[0]  # sample 0 of the folder
    first = labels / first.parent.name / f"{first.stem}.pt"
    for f in labels.glob("*/*.pt"):
        if f != first:
            f.unlink()
    assert main([*args, "data.num_workers=1", f"train.output_dir={tmp_path / 'bad_any'}"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "does not exist" in err[0] and str(labels) in err[0], err
    # sample 0's file is read before the first step
    torch.save(torch.zeros(5, 7, 7).half(), first)  # the [2, ...] axis missing
    assert main([*args, f"train.output_dir={tmp_path / 'bad'}"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and str(first) in err[0] and "not [2, k, H, W]" in err[0], err
    # these files hold no class-token prediction: cls_target=teacher is refused before any data is read
    assert main([*args, "token_label.cls_target=teacher", f"train.output_dir={tmp_path / 'teacher'}"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "hold no class-token prediction" in err[0], err
    assert not (tmp_path / "teacher").exists()
