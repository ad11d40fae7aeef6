"""A data format is one module: this file declares a toy format (``.npz`` arrays of images and labels)
with its builder, its own config fields, its up-front check and its detection for ``vitscale data
inspect``, registers it, and the CLI then trains, evaluates and inspects with it — no other file
changed (docs/architecture.md, "A data format")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from vitscale.cli import main
from vitscale.config.data import DataConfig, PathFields
from vitscale.data import DataFormat, Split, register_format
from vitscale.data.sources import TensorSource
from vitscale.errors import CheckError


# ------------------------------------------------------------------------------------ the format
@dataclass
class NpzData(PathFields, DataConfig):
    """``data.format=npz``: the paths, and the names of the arrays."""

    format: str = "npz"
    npz_images: str = "images"
    """The array of uint8 images, (N, H, W) or (N, C, H, W)."""
    npz_labels: str = "labels"
    """The array of integer class labels, (N,)."""


def _arrays(cfg, path: str) -> tuple[torch.Tensor, torch.Tensor]:
    with np.load(path, allow_pickle=False) as f:  # plain arrays: nothing in the file runs
        images, labels = f[cfg.npz_images], f[cfg.npz_labels]
    images = torch.from_numpy(images)
    return (images[:, None] if images.ndim == 3 else images), torch.from_numpy(labels)


def npz_split(cfg, name, *, img_size, num_channels, seed, classes):
    path = cfg.train_path if name == "train" else cfg.val_path
    if not path:
        return None
    images, labels = _arrays(cfg, path)
    images = images.expand(-1, num_channels, -1, -1).contiguous()  # (N, C, H, W) uint8
    names = list(classes) if classes is not None else [str(c) for c in range(int(labels.max()) + 1)]
    return Split(TensorSource(images, labels), names, info={"arrays": f"{cfg.npz_images}, {cfg.npz_labels}"})


def npz_check(cfg):
    for field in ("train_path", "val_path"):
        path = getattr(cfg, field)
        if path and not os.path.isfile(path):
            raise CheckError(f"data.{field}={path}: no such .npz file")


def register() -> None:
    """Make ``data.format=npz`` known (a format module does this at import; here the CLI's process and
    the test call it, so the format does not leak into the registry of pytest's own process, which
    imports every test file)."""
    register_format(DataFormat(
        "npz", npz_split, config=NpzData, check=npz_check, detect=lambda path: path.endswith(".npz"),
        summary="arrays of uint8 images and labels in a .npz file",
    ))  # fmt: skip


# ------------------------------------------------------------------------------------ the test
HERE = Path(__file__).resolve().parent
# The CLI in a fresh process that has imported this file and registered the format.
CLI = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import test_new_data_format; test_new_data_format.register(); "
       "from vitscale.cli import main; sys.exit(main(sys.argv[1:]))")  # fmt: skip
SHORT = ["train.max_steps=60", "train.epochs=0", "train.batch_size=32", "model.num_layers=1", "eval.every=0",
         "train.log_every=30", "log.progress=none", "log.report=false", "log.tensorboard=false", "checkpoint.export_safetensors=false"]  # fmt: skip


def vitscale(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI, str(HERE), *argv], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)  # fmt: skip


@pytest.mark.slow
def test_a_format_declared_in_one_file_trains_inspects_and_checks(tmp_path, capsys, monkeypatch):
    from vitscale.data import formats
    from vitscale.data.digits import load_digits_split

    monkeypatch.setitem(formats.FORMATS.entries, "npz", None)  # the test's format is unregistered when it ends
    register()

    for split in ("train", "val"):
        images, labels = load_digits_split(split, num_channels=1)
        np.savez(tmp_path / f"{split}.npz", pixels=images[:, 0].numpy(), y=labels.numpy())
    data = [f"data.train_path={tmp_path / 'train.npz'}", f"data.val_path={tmp_path / 'val.npz'}",
            "data.npz_images=pixels", "data.npz_labels=y"]  # fmt: skip
    train = vitscale("train", "digits_vit", "data.format=npz", *data, *SHORT, f"train.output_dir={tmp_path / 'npz'}")
    assert train.returncode == 0, train.stderr
    # the same images as data.format=digits: the same batches, so the same run to the last digit
    assert main(["train", "digits_vit", *SHORT, f"train.output_dir={tmp_path / 'digits'}"]) == 0
    npz, digits = (json.loads((tmp_path / r / "summary.json").read_text()) for r in ("npz", "digits"))
    assert npz["val_top1"] == digits["val_top1"] and npz["val_loss"] == digits["val_loss"], (npz, digits)
    assert npz["val_top1"] > 30  # learning (chance: 10%)
    # its own fields are data.<field> in the run's config.yaml, and load back
    stored = yaml.safe_load((tmp_path / "npz" / "config.yaml").read_text())["data"]
    assert stored["format"] == "npz" and stored["npz_images"] == "pixels" and stored["npz_labels"] == "y"

    # vitscale data inspect finds it by its detect() and reads it through the pipeline (in this process,
    # which has imported the format too)
    capsys.readouterr()
    assert main(["data", "inspect", str(tmp_path / "val.npz"), "npz_images=pixels", "npz_labels=y", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "npz" and report["samples"] == 300 and report["classes"] == 10
    assert report["arrays"] == "pixels, y" and report["decode"]["images"] == 64

    # its check runs before anything is read; its fields are checked like any other key (this process
    # has imported the format too)
    bad = {"missing": ["data.format=npz", f"data.train_path={tmp_path / 'nope.npz'}", f"train.output_dir={tmp_path / 'm'}"],
           "typo": ["data.format=npz", "data.npz_image=x"], "other format": ["data.npz_images=x"]}  # fmt: skip
    errors = {}
    for case, over in bad.items():
        assert main(["train", "digits_vit", *over, *SHORT]) == 2, case
        errors[case] = capsys.readouterr().err.strip()
    assert errors["missing"].endswith("nope.npz: no such .npz file") and len(errors["missing"].splitlines()) == 1
    assert "did you mean 'data.npz_images'" in errors["typo"]
    assert errors["other format"].endswith("data.npz_images is read by data.format=npz, not by data.format=digits: set "
                                           "data.format to it, or remove data.npz_images")
