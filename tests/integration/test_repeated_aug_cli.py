"""``data.repeated_aug`` through ``vitscale train``: a digits run with 3 repeats trains and records it,
the DeiT recipe ships with it, and what cannot repeat is refused in one line (exit 2)."""

import pytest
import yaml

from vitscale.cli import main
from vitscale.config import load_config

QUIET = ["data.num_workers=0", "log.flops=false", "eval.every=0", "log.progress=none", "log.report=false",
         "checkpoint.every=0", "train.epochs=0"]  # fmt: skip
TINY_VIT = ["model.num_layers=1", "model.hidden_size=16", "model.ffn_hidden_size=32"]


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("vitscale "), err  # one line, no traceback
    return lines[0]


def test_digits_train_with_repeated_aug(tmp_path, capsys):
    run = tmp_path / "run"
    rc = main(["train", "digits_vit", "data.repeated_aug=3", "train.max_steps=3", "train.batch_size=32",
               "train.log_every=1", f"train.output_dir={run}", *TINY_VIT, *QUIET])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["repeated_aug"] == 3
    summary = yaml.safe_load((run / "summary.json").read_text())
    assert summary["steps"] == 3 and 0 <= summary["val_top1"] <= 100


def test_deit_recipe_repeats_three_times():
    assert load_config("imagenet_deit_b_distilled").data.repeated_aug == 3
    assert load_config("digits_vit").data.repeated_aug == 1


@pytest.mark.parametrize(("extra", "message"), [
    (["data.repeated_aug=0"], "data.repeated_aug=0 must be a whole number of at least 1"),
    (["data.repeated_aug=3", "data.format=parquet", "TRAIN=parquet"],
     "data.repeated_aug=3: data.format=parquet with data.parquet_mode=stream streams its training samples, with no "
     "index to repeat: set data.parquet_mode=index, or data.repeated_aug=1"),
    (["data.repeated_aug=3", "data.format=webdataset", "TRAIN=wds", "data.webdataset_mode=stream"],
     "data.webdataset_mode=stream streams its training samples"),
])  # fmt: skip
def test_what_cannot_repeat_is_one_line(digits_data, tmp_path, capsys, extra, message):
    args = [a for a in extra if not a.startswith("TRAIN=")]
    for a in extra:
        if a.startswith("TRAIN="):
            kind = a.split("=", 1)[1]
            args += [f"data.train_path={digits_data / kind / 'train'}", f"data.val_path={digits_data / kind / 'val'}"]
    capsys.readouterr()
    rc = main(["train", "digits_vit", "train.max_steps=1", "train.batch_size=8", f"train.output_dir={tmp_path / 'run'}",
               *args, *TINY_VIT, *QUIET])  # fmt: skip
    assert rc == 2
    assert message in _one_line(capsys.readouterr().err)


def test_parquet_index_mode_repeats(digits_data, tmp_path, capsys):
    """The refusal's fix works: Parquet read by index trains with repeats."""
    rc = main(["train", "digits_vit", "data.repeated_aug=3", "data.format=parquet", "data.parquet_mode=index",
               f"data.train_path={digits_data / 'parquet' / 'train'}", f"data.val_path={digits_data / 'parquet' / 'val'}",
               "train.max_steps=2", "train.batch_size=8", f"train.output_dir={tmp_path / 'run'}", *TINY_VIT, *QUIET])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
