"""The digits dataset: fixed split, value range, upsampling, and `vitscale data digits`."""

import numpy as np
import torch
from PIL import Image

from vitscale.cli import main
from vitscale.data import build_loaders, data_config
from vitscale.data.digits import CLASS_NAMES, load_digits_split

DIGITS = dict(format="digits", num_workers=0, rrc_scale=(0.6, 1.0), hflip=0.0, crop_pct=1.0,
              mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def test_split_sizes_disjoint_stratified_and_fixed():
    xt, yt = load_digits_split("train")
    xv, yv = load_digits_split("val")
    assert xt.shape == (1497, 3, 8, 8) and xv.shape == (300, 3, 8, 8)
    assert xt.dtype == torch.uint8 and int(xt.min()) == 0 and int(xt.max()) == 255
    # 17 gray levels (0..16) mapped to 0..255
    assert len(torch.unique(torch.cat([xt.flatten(), xv.flatten()]))) == 17
    assert yv.bincount().min() >= 29 and yv.bincount().max() <= 31
    assert yt.bincount().tolist() == (torch.tensor([178, 182, 177, 183, 181, 182, 181, 179, 174, 180]) - yv.bincount()).tolist()
    from sklearn.datasets import load_digits
    d = load_digits()
    rows = {tuple(np.rint(im * 255 / 16).astype(np.uint8).flatten()) for im in d.images}
    assert all(tuple(x[0].flatten().tolist()) in rows for x in xv[:20])
    xt2, _ = load_digits_split("train")
    assert torch.equal(xt, xt2)


def test_split_is_scikit_learns_own():
    """The digits read from scikit-learn's CSV and the kept validation indices are exactly what
    ``load_digits`` and ``train_test_split(..., stratify=target, random_state=0)`` give."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from vitscale.data import digits

    d = load_digits()
    digits._load.cache_clear()
    images, target = digits._load()
    assert np.array_equal(images, d.images) and np.array_equal(target, d.target)
    train_idx, val_idx = train_test_split(np.arange(len(d.target)), test_size=300, stratify=d.target, random_state=0,
                                          shuffle=True)  # fmt: skip
    train, val = digits._split_indices()
    assert np.array_equal(val, np.sort(val_idx)) and np.array_equal(train, np.sort(train_idx))
    xv, yv = load_digits_split("val", num_channels=1)
    assert np.array_equal(xv[:, 0].numpy(), np.rint(d.images[np.sort(val_idx)] * 255 / 16).astype(np.uint8))
    assert np.array_equal(yv.numpy(), d.target[np.sort(val_idx)])


def test_digits_loaders_upsample_and_range():
    L = build_loaders(data_config(**DIGITS), img_size=(32, 32), num_channels=3, seed=0,
                      micro_batch_size=100, eval_batch_size=150)
    assert L.num_classes == 10 and L.class_names == list(CLASS_NAMES)
    assert len(L.train) == 14 and len(L.val) == 2
    b = next(iter(L.train))
    assert b["image"].shape == (100, 3, 32, 32)
    assert b["image"].min() >= -1.0 and b["image"].max() <= 1.0 and b["image"].max() > 0.9
    v = next(iter(L.val))
    assert v["image"].shape == (150, 3, 32, 32)
    assert (v["crop"] == torch.tensor([0.0, 0.0, 1.0, 1.0])).all()
    one = build_loaders(data_config(**{**DIGITS, "mean": (0.5,), "std": (0.5,)}), img_size=(16, 16), num_channels=1,
                        seed=0, micro_batch_size=10, eval_batch_size=10)
    assert next(iter(one.train))["image"].shape == (10, 1, 16, 16)


def test_cli_writes_digits_image_folder(tmp_path, capsys):
    assert main(["data", "digits", str(tmp_path), "--size", "16"]) == 0
    assert "1497 train and 300 val" in capsys.readouterr().out
    counts = {s: sum(len(list((tmp_path / s / c).glob("*.png"))) for c in CLASS_NAMES) for s in ("train", "val")}
    assert counts == {"train": 1497, "val": 300}
    img = Image.open(next((tmp_path / "val" / "three").glob("*.png")))
    assert img.size == (16, 16)
    cfg = data_config(format="imagefolder", train_path=str(tmp_path / "train"), val_path=str(tmp_path / "val"),
                     num_workers=0, crop_pct=1.0)
    L = build_loaders(cfg, img_size=(16, 16), num_channels=3, seed=0, micro_batch_size=32, eval_batch_size=300)
    # the built-in digits' class names, in digit order (classnames.txt), so the same class indices
    assert CLASS_NAMES == ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    assert L.class_names == CLASS_NAMES and (tmp_path / "classnames.txt").read_text().split() == CLASS_NAMES
    v = next(iter(L.val))
    assert v["image"].shape == (300, 3, 16, 16) and v["label"].bincount().tolist() == load_digits_split("val")[1].bincount().tolist()
