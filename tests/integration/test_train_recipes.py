"""The ImageNet recipes run end to end with tiny overrides on synthetic data, including the 512px
fine-tuning path (init from a lower-resolution checkpoint, position embeddings interpolated), and the
fine-tuning recipes (21k -> 1k from a timm file, DeiT distilled, CLIP with its image tower locked)."""

import json

import pytest
import torch

from vitscale.config import load_config
from vitscale.train import train

TINY_MODEL = [
    "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=1", "model.num_attention_heads=2",
    "model.patch_dim=8", "data.format=synthetic", "data.train_path=null", "data.val_path=null",  # the paths replaced
    "data.num_classes=10", "data.synthetic_size=32",
    "data.val_split=0.5", "data.num_workers=0", "train.batch_size=8", "train.log_every=1", "eval.batch_size=16",
    "log.progress=none", "schedule.warmup_steps=1", "train.cpu_threads=1", "log.report=false",
]  # fmt: skip


def test_pretrain_then_finetune_at_higher_resolution(tmp_path):
    pre = load_config("imagenet_vit_b16", TINY_MODEL + ["data.img_size=32", "train.epochs=0", "train.max_steps=3",
                                                      f"train.output_dir={tmp_path / 'pre'}"])  # fmt: skip
    assert pre.optim.name == "adamw" and pre.optim.weight_decay == 0.3  # the recipe's own values stay
    s1 = train(pre)
    assert s1["steps"] == 3 and 0 <= s1["val_top1"] <= 100
    ft = load_config("imagenet_vit_b16_ft512", TINY_MODEL + ["data.img_size=64", "train.max_steps=2",
                     f"checkpoint.init_from={tmp_path / 'pre'}", f"train.output_dir={tmp_path / 'ft'}"])  # fmt: skip
    from vitscale.train.trainer import Trainer

    trainer = Trainer(ft)
    assert isinstance(trainer.optimizer, torch.optim.SGD) and trainer.optimizer.defaults["momentum"] == 0.9
    assert trainer.model.pos_embed.shape[1] == 1 + 8 * 8  # 64px / patch 8, resampled from 4x4
    assert not trainer.checkpoints.init_report["missing"] and not trainer.checkpoints.init_report["skipped"]
    from safetensors.torch import load_file

    w224 = load_file(tmp_path / "pre" / "model.safetensors")
    torch.testing.assert_close(trainer.model.blocks[0].attn.qkv_per_head.weight.detach(), w224["blocks.0.attn.qkv_per_head.weight"])
    s2 = trainer.fit()
    assert s2["steps"] == 2
    rows = [json.loads(line) for line in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["lr"] <= 0.03 for r in rows)


@pytest.mark.parametrize("loss", ["sigmoid"])
def test_sigmoid_loss_rsqrt_schedule_head_decay(tmp_path, loss):
    cfg = load_config("imagenet_vit_b16", TINY_MODEL + [
        "data.img_size=32", "train.epochs=0", "train.max_steps=3", f"train.loss={loss}", "schedule.name=rsqrt",
        "schedule.cooldown_steps=1", "optim.head_weight_decay=3.0", "train.grad_accum=2", "optim.lr_scale_batch=1024",
        "log.tensorboard=true", f"train.output_dir={tmp_path}"])  # fmt: skip
    s = train(cfg)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["lr"] == 0.0 and rows[0]["lr"] == pytest.approx(3e-3 * 8 / 1024)  # scaled, warmup 1
    assert s["steps"] == 3 and all(r["loss"] > 0 for r in rows)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))  # optional TensorBoard events


def test_finetuning_recipes_run_tiny(tmp_path):
    """The 21k -> 1k fine-tuning recipe from a timm-format file (resampled, new head) and the DeiT
    distillation recipe with a teacher: each 2 steps with tiny overrides on synthetic data."""
    import vitscale
    from vitscale.checkpoint import export_safetensors
    from vitscale.interop import to_timm

    tiny = {"hidden_size": 32, "ffn_hidden_size": 64, "num_layers": 1, "num_attention_heads": 2, "patch_dim": 8}
    pre = vitscale.create_model("vit_b16", **tiny, img_h=16, img_w=16, num_classes=0)  # a headless 16 px backbone
    torch.save(to_timm(pre), tmp_path / "in21k.pth")
    ft = load_config("imagenet21k_vit_b16_ft384", TINY_MODEL + ["data.img_size=32", "train.max_steps=2", "model.num_classes=10",
                     f"checkpoint.init_from={tmp_path / 'in21k.pth'}", f"train.output_dir={tmp_path / 'ft'}"])  # fmt: skip
    assert train(ft)["steps"] == 2
    log = (tmp_path / "ft" / "train.log").read_text()
    assert "pos_embed resampled from 1x5x32 to 1x17x32" in log and "2 tensors not in the weights, left as initialised: head.weight, head.bias" in log
    teacher = vitscale.create_model("vit_debug", **tiny, img_h=32, img_w=32, num_classes=10)
    export_safetensors(teacher, tmp_path / "teacher.safetensors", {"model": "vit_debug", "overrides": json.dumps({**tiny, "num_classes": 10})})
    deit = load_config("imagenet_deit_b_distilled", TINY_MODEL + [
        "data.img_size=32", "train.epochs=0", "train.max_steps=2", "model.drop_path_rate=0",
        f"distill.teacher={tmp_path / 'teacher.safetensors'}", "distill.teacher_model=null",
        f"train.output_dir={tmp_path / 'deit'}"])  # fmt: skip
    s = train(deit)
    assert s["steps"] == 2 and 0 <= s["val_top1"] <= 100
    assert "distill: teacher vit_debug" in (tmp_path / "deit" / "train.log").read_text()


def test_clip_locked_image_recipe_runs_tiny(tmp_path):
    """The locked-image CLIP recipe (LiT, open_clip's ``--lock-image``) from an open_clip-format file on
    captioned digit shards, 2 steps with a tiny clip_b32: the image tower and its projection do not
    move, the text tower trains."""
    from safetensors.torch import load_file, save_file

    import vitscale
    from vitscale.cli import main
    from vitscale.interop import to_open_clip

    shards = tmp_path / "wds"
    assert main(["data", "digits-captions", str(shards), "--size", "16", "--shard-size", "100"]) == 0
    vision = {"img_h": 16, "img_w": 16, "patch_dim": 4, "hidden_size": 32, "ffn_hidden_size": 64, "num_attention_heads": 2,
              "num_layers": 2}  # fmt: skip
    text = {"hidden_size": 32, "ffn_hidden_size": 128, "num_attention_heads": 2, "num_layers": 1}
    torch.manual_seed(0)
    pre = vitscale.create_model("clip_b32", vision=vision, text=text, output_dim=32)
    save_file({k: v.contiguous() for k, v in to_open_clip(pre).items()}, tmp_path / "open_clip_model.safetensors")
    over = [f"model.vision.{k}={v}" for k, v in vision.items()] + [f"model.text.{k}={v}" for k, v in text.items()]
    cfg = load_config("clip_b32_locked_image", over + [
        "model.output_dim=32", f"data.train_path={shards}/train", f"data.val_path={shards}/val", "data.num_workers=0",
        "data.samples_per_epoch=64", "train.batch_size=16", "train.epochs=0", "train.max_steps=2", "train.log_every=1",
        "eval.every=0", "eval.batch_size=64", "checkpoint.every=0", "log.progress=none", "log.report=false",
        "train.cpu_threads=1", "precision.autocast=none", "parallel.dp_shard=1", "schedule.warmup_steps=1",
        "optim.lr=1e-3", f"checkpoint.init_from={tmp_path / 'open_clip_model.safetensors'}",
        f"train.output_dir={tmp_path / 'run'}"])  # fmt: skip
    assert cfg.clip.lock_image and cfg.optim.betas == (0.9, 0.98)  # the recipe's own values stay
    s = train(cfg)
    assert s["steps"] == 2 and 0 <= s["text_retrieval_recall@1"] <= 100
    log = (tmp_path / "run" / "train.log").read_text()
    assert "clip.lock_image: " in log and "(open_clip: open_clip's naming)" in log
    start, end = pre.state_dict(), load_file(tmp_path / "run" / "model.safetensors")
    image = [k for k in start if k.startswith(("visual.", "image_proj."))]
    assert image and all(torch.equal(end[k], start[k]) for k in image)  # locked: not moved
    assert not torch.equal(end["text_proj.weight"], start["text_proj.weight"])  # the text tower trained
