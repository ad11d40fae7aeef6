"""The DeiT recipe's own augmentation (timm's rand-m9-mstd0.5-inc1, bicubic) trains through the CLI on
an image folder of real photos: it used to end at its first batch ("Interpolation mode 'bicubic' is
unsupported with Tensor input", torchvision's RandAugment on tensors)."""

from pathlib import Path

import yaml
from PIL import Image

from vitscale.cli import main


def _photo_folder(root: Path) -> Path:
    """``root/{train,val}/{china,flower}/*.jpg``: crops of scikit-learn's two sample photos."""
    from sklearn.datasets import load_sample_images

    for split, n in (("train", 6), ("val", 2)):
        for name, a in zip(("china", "flower"), load_sample_images().images, strict=True):
            (root / split / name).mkdir(parents=True)
            for k in range(n):
                y, x = (k * 23) % 100, (k * 41) % 200
                Image.fromarray(a[y:y + 320, x:x + 420]).save(root / split / name / f"{k}.jpg", quality=90)
    return root


def test_deit_recipe_trains_with_its_own_augmentation_on_photos(tmp_path, capsys):
    data, run = _photo_folder(tmp_path / "photos"), tmp_path / "run"
    rc = main(["train", "imagenet_deit_b_distilled", f"data.train_path={data / 'train'}", f"data.val_path={data / 'val'}",
               "distill.teacher=null", "model.name=vit_debug", "train.max_steps=2", "train.epochs=0", "train.batch_size=4",
               "eval.batch_size=4", "data.num_workers=0", "precision.autocast=none", "train.device=cpu",
               "log.report=false", "log.progress=none", "train.cpu_threads=1", f"train.output_dir={run}"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    d = yaml.safe_load((run / "config.yaml").read_text())["data"]
    assert (d["auto_augment"], d["interpolation"], d["img_size"]) == ("rand-m9-mstd0.5-inc1", "bicubic", 224)
    summary = yaml.safe_load((run / "summary.json").read_text())
    assert summary["steps"] == 2 and 0 <= summary["val_top1"] <= 100


def test_deit3_recipe_trains_as_it_ships_on_photos(tmp_path, capsys):
    """DeiT III's recipe (3-Augment + colour jitter, repeated augmentation, mixup / cutmix, LAMB, binarised
    BCE, LayerScale, constant stochastic depth) at its own 192 px, only the data paths and the width
    replaced: 2 steps and the evaluation through the CLI."""
    import json

    data, run = _photo_folder(tmp_path / "photos"), tmp_path / "run"
    rc = main(["train", "imagenet_deit3_b16", f"data.train_path={data / 'train'}", f"data.val_path={data / 'val'}",
               "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=2", "model.num_attention_heads=2",
               "train.max_steps=2", "train.epochs=0", "train.batch_size=6", "eval.batch_size=4", "data.num_workers=0",
               "precision.autocast=none", "train.device=cpu", "log.report=false", "log.progress=none", "train.cpu_threads=1",
               "train.log_every=1", f"train.output_dir={run}"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert (cfg["data"]["auto_augment"], cfg["data"]["img_size"], cfg["data"]["repeated_aug"]) == ("3a", 192, 3)
    assert (cfg["optim"]["name"], cfg["train"]["loss"], cfg["train"]["bce_sum"], cfg["train"]["bce_target_thresh"]) == ("lamb", "sigmoid", False, 0.0)
    ov = cfg["model"]["overrides"]
    assert ov["layer_scale_init"] == 1e-4 and ov["drop_path_constant"] and ov["hidden_size"] == 32
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert len(rows) == 2 and all(0.3 < r["loss"] < 1.2 for r in rows)  # BCE averaged over the 2 classes: log 2 at the start
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and 0 <= summary["val_top1"] <= 100
