"""A transformers folder through the CLI, as a user runs it: ``checkpoint.init_from`` a
``ViTForImageClassification`` snapshot (random weights written by transformers' ``save_pretrained``,
nothing downloaded) with no format flag, a step at ``optim.lr=0``, and ``vitscale convert --to
transformers`` of the run: transformers' ``from_pretrained`` loads the folder and gives the logits of
the model the run started from."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import randomize, rel_max

from vitscale.cli import main

T = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # a training run and transformers' imports: ~15 s on 2 cores


def test_init_from_a_transformers_folder_and_convert_back(tmp_path, capsys):
    cfg = T.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=32,
                      patch_size=4, num_labels=10, layer_norm_eps=1e-6)  # fmt: skip
    hf = T.ViTForImageClassification(cfg)
    randomize(hf)
    hf.save_pretrained(tmp_path / "hf")
    run = tmp_path / "run"
    args = ["model.hidden_size=32", "model.num_layers=1", "model.ffn_hidden_size=64", "model.pool=token",
            "data.num_workers=0", "train.max_steps=1", "optim.lr=0", "checkpoint.every=1", "log.report=false",
            "log.progress=plain", "evals=[]", "train.batch_size=16", f"checkpoint.init_from={tmp_path / 'hf'}",
            f"train.output_dir={run}"]  # fmt: skip
    assert main(["train", "digits_vit", *args]) == 0
    assert main(["convert", str(run), str(tmp_path / "back"), "--to", "transformers"]) == 0
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert written["architectures"] == ["ViTForImageClassification"] and written["layer_norm_eps"] == 1e-6
    again = T.ViTForImageClassification.from_pretrained(tmp_path / "back").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert rel_max(again(pixel_values=x).logits, hf.eval()(pixel_values=x).logits) < 1e-5
    # a run whose model has a norm epsilon the folder's config.json contradicts: one line, before training
    capsys.readouterr()
    assert main(["train", "digits_vit", *args[:-1], "model.norm_eps=0.00001", f"train.output_dir={tmp_path / 'bad'}"]) != 0
    err = capsys.readouterr().err
    assert "its config.json gives norm_eps=1e-06, the model has norm_eps=1e-05" in err and err.count("\n") == 1
    assert not (tmp_path / "bad" / "checkpoints").exists()
