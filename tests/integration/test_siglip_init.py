"""``train.loss=sigmoid`` on a CLIP starts as SigLIP does (arXiv 2303.15343: temperature 10, bias -10)
unless the user sets the model's own values; the run says so, and its weights evaluate and export."""

from __future__ import annotations

import json
import math

import pytest
from safetensors import safe_open

from vitscale.cli import main


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("wds")
    assert main(["data", "digits-captions", str(root), "--size", "16"]) == 0
    return root


def _train(shards, out, *extra):
    return main(["train", "digits_clip", "data.format=webdataset", f"data.train_path={shards}/train", f"data.val_path={shards}/val",
                 "data.caption_context_length=77", f"train.output_dir={out}", "train.max_steps=1", "train.epochs=0",
                 "train.batch_size=16", "optim.lr=0", "schedule.warmup_steps=0", "eval.every=0", "log.progress=none",
                 "log.report=false", *extra])  # fmt: skip


def _logits(run):
    with safe_open(str(run / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        meta = json.loads(f.metadata().get("overrides") or "{}")
        return f.get_tensor("logit_scale").item(), (f.get_tensor("logit_bias").item() if "logit_bias" in keys else None), meta


def test_sigmoid_loss_starts_as_siglip(shards, tmp_path, capsys):
    assert _train(shards, tmp_path / "siglip", "train.loss=sigmoid") == 0  # lr 0: the weights stay as initialised
    err = capsys.readouterr()
    assert "SigLIP's initialisation" in err.out + err.err
    scale, bias, meta = _logits(tmp_path / "siglip")
    assert scale == pytest.approx(math.log(10.0)) and bias == -10.0
    assert meta["logit_bias_init"] == -10.0  # the exported weights name the model they are
    # the user's own value wins, the other stays SigLIP's; softmax (CLIP) keeps its temperature, no bias
    from vitscale.config import load_config
    from vitscale.run.assemble import resolve_run_model

    own = resolve_run_model(load_config("digits_clip", ["train.loss=sigmoid", "model.logit_bias_init=-5"])).cfg
    assert (own.logit_scale_init, own.logit_bias_init) == (pytest.approx(math.log(10.0)), -5.0)
    clip = resolve_run_model(load_config("digits_clip")).cfg
    assert (clip.logit_scale_init, clip.logit_bias_init) == (pytest.approx(math.log(1 / 0.07)), None)
    # the SigLIP run's weights evaluate through `vitscale eval` from its run folder
    res = tmp_path / "eval.json"
    assert main(["eval", str(tmp_path / "siglip" / "config.yaml"), f"checkpoint.path={tmp_path / 'siglip'}", "--output", str(res)]) == 0
    assert 0 <= json.loads(res.read_text())["zeroshot_top1"] <= 100
