"""``benchmarks/trainer_vs_timm.py`` and ``benchmarks/mnist_imagefolder.py``: the IDX reader and the
image folder it writes, the timm command line that builds the same model as ours, the timm log parser
and the dry run."""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitscale
from vitscale.config import load_config
from vitscale.interop import timm_kwargs, to_timm

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


vs_timm = _load("trainer_vs_timm")
mnist = _load("mnist_imagefolder")


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def test_idx_files_become_an_image_folder_of_the_same_pixels(tmp_path):
    rng = np.random.default_rng(0)
    images, labels = (
        rng.integers(0, 256, (7, 28, 28), dtype=np.uint8),
        np.array([3, 0, 9, 3, 1, 0, 7], np.uint8),
    )
    images_file, labels_file = mnist.FILES["train"]
    _write_idx(tmp_path / images_file, images)
    _write_idx(tmp_path / labels_file, labels)
    assert np.array_equal(mnist.read_idx(tmp_path / images_file), images)
    assert mnist.write_split(tmp_path, tmp_path / "out", "train") == 7
    assert sorted(p.name for p in (tmp_path / "out" / "train").iterdir()) == [str(c) for c in range(10)]
    for i, label in enumerate(labels):
        with Image.open(tmp_path / "out" / "train" / str(label) / f"{i:05d}.png") as im:
            assert im.mode == "L" and np.array_equal(np.asarray(im), images[i])
    # --train-limit: the first N images of the file, nothing after them
    assert mnist.write_split(tmp_path, tmp_path / "first3", "train", limit=3) == 3
    written = sorted(p.relative_to(tmp_path / "first3" / "train").as_posix() for p in (tmp_path / "first3").rglob("*.png"))
    assert written == sorted(f"{label}/{i:05d}.png" for i, label in enumerate(labels[:3]))
    (tmp_path / "bad.gz").write_bytes(gzip.compress(b"\x00\x00\x0d\x01" + struct.pack(">I", 1) + b"abcd"))
    with pytest.raises(ValueError, match="not an IDX file of unsigned bytes"):
        mnist.read_idx(tmp_path / "bad.gz")


def test_timm_command_line_builds_our_model():
    """The ``--model-kwargs`` and flags given to timm's train.py, parsed as train.py parses them, make a
    timm model that takes our weights and computes our logits."""
    import timm
    from timm.utils import ParseKwargs

    model, kwargs = vs_timm.vitscale_model("digits_vit", num_classes=10)
    args = vs_timm.timm_model_args(kwargs)
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-kwargs", nargs="*", default={}, action=ParseKwargs)
    for flag in ("--num-classes", "--in-chans"):
        parser.add_argument(flag, type=int)
    parser.add_argument("--gp")
    parser.add_argument("--drop", type=float, default=0.0)
    parser.add_argument("--drop-path", type=float, default=None)
    ns = parser.parse_args(args)
    tm = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=ns.num_classes, in_chans=ns.in_chans,
                           global_pool=ns.gp, drop_rate=ns.drop, drop_path_rate=ns.drop_path, **ns.model_kwargs)  # fmt: skip
    ours = vitscale.create_model(
        "vit_debug", **{**load_config("digits_vit").model.overrides, "num_classes": 10}
    )
    ours.init_weights()
    tm.load_state_dict(to_timm(ours), strict=True)
    x = torch.randn(2, 3, 32, 32)
    ours.eval(), tm.eval()
    with torch.no_grad():
        torch.testing.assert_close(tm(x), ours(x), rtol=1e-4, atol=1e-4)
    assert sum(p.numel() for p in tm.parameters()) == sum(p.numel() for p in model.parameters())
    assert timm_kwargs(model)["global_pool"] == "avg" and ns.gp == "avg"


def test_timm_log_and_recipe_checks(tmp_path):
    out = tmp_path / "timm_seed0"
    out.mkdir()
    (out / "summary.csv").write_text("epoch,train_loss,eval_loss,eval_top1,eval_top5,lr\n"
                                     "0,1.0,0.5,97.5,99.9,0.002\n1,0.8,0.4,98.25,100.0,0.0\n")  # fmt: skip
    log = tmp_path / "timm_seed0.log"
    log.write_text(
        "Train: 0 [ 936/937 (100%)]  Loss: 0.774 (1.29)  Time: 0.299s,  213.77/s  (0.250s,  256.00/s)  LR: 1.5e-03  Data: 0.002 (0.035)\n"
        "Train: 1 [ 900/937 ( 96%)]  Loss: 0.700 (0.80)  Time: 0.200s,  320.00/s  (0.300s,  213.33/s)  LR: 1.0e-03  Data: 0.002 (0.035)\n"
        "Train: 1 [ 936/937 (100%)]  Loss: 0.690 (0.79)  Time: 0.200s,  320.00/s  (0.500s,  128.00/s)  LR: 1.0e-06  Data: 0.002 (0.035)\n"
    )  # fmt: skip
    got = vs_timm.read_timm(out, log, epochs=2, batch_size=64)
    assert got["val_top1"] == [97.5, 98.25]
    assert got["trainer_train_s"] == pytest.approx(
        0.25 * 937 + 0.5 * 937
    )  # the last running mean of each epoch
    assert got["trainer_img_per_s"] == pytest.approx(64 * 2 * 937 / (0.75 * 937))
    assert vs_timm.read_timm(out, log, epochs=3, batch_size=64) is None  # an unfinished run
    expected = {"train": {"seed": 1, "compile": None, "output_dir": "a"}, "optim": {"lr": 0.003}}
    assert vs_timm._same_recipe(
        {"train": {"seed": 1, "compile": False, "output_dir": "b"}, "optim": {"lr": 0.003}}, expected
    )
    assert not vs_timm._same_recipe(
        {"train": {"seed": 2, "compile": False, "output_dir": "a"}, "optim": {"lr": 0.003}}, expected
    )


def test_dry_run_prints_both_commands(tmp_path, capsys):
    data = tmp_path / "data"
    for split, n in (("train", 5), ("val", 2)):
        for c in ("0", "1"):
            (data / split / c).mkdir(parents=True)
            for i in range(n):
                Image.new("L", (28, 28)).save(data / split / c / f"{i}.png")
    checkout = tmp_path / "timm-src"
    checkout.mkdir()
    argv = [
        "--data",
        str(data),
        "--out-dir",
        str(tmp_path / "runs"),
        "--seeds",
        "3",
        "--batch-size",
        "4",
        "--dry-run",
    ]
    with pytest.raises(SystemExit, match="no train.py there"):
        vs_timm.main([*argv, "--timm-src", str(checkout)])
    (checkout / "train.py").write_text("")
    assert vs_timm.main([*argv, "--timm-src", str(checkout)]) == 0
    lines = capsys.readouterr().out.splitlines()
    vit_cmd, timm_cmd = lines[1], lines[3]
    assert (
        "eval.every=2" in vit_cmd and "train.seed=3" in vit_cmd and "data.hflip=0.0" in vit_cmd
    )  # 10 images / 4
    for flag in ("--sched-on-updates", "--color-jitter 0", "--train-interpolation bilinear", "--crop-pct 1.0",
                 "--num-classes 2", "--gp avg", "--seed 3", "-j 1"):  # fmt: skip
        assert flag in timm_cmd, flag
    warmup = (tmp_path / "runs" / "timm_seed3_warmup.yaml").read_text()
    assert warmup == f"warmup_epochs: {100 / 2!r}\n"  # 100 steps in epochs of 2 steps
