"""docs/ssl.md's "Continuing from public weights on your own photos" runs as the page writes it: its
``hf download facebook/dinov2-small`` as a Hugging Face cache built here holding a tiny snapshot of
that name written by transformers itself (``Dinov2Model.save_pretrained``, random weights), then its
``vitscale train dino_vits14_continue`` (the recipe's own ``checkpoint.init_from``, read from the
cache), ``vitscale eval`` and ``vitscale convert --to transformers`` through the CLI (the model and the
crops shrunk, 2 steps on the CPU, the backbone frozen for the first) on real JPEGs; the exported folder
is loaded by ``transformers.AutoModel`` and gives the features vitscale reads from it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers import doc_commands, hub_cache, photo_jpeg
from safetensors.torch import load_file

import vitscale
from vitscale.cli import main
from vitscale.config import load_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "ssl.md"
SIZE = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "mlp_ratio": 2}  # transformers' names
TINY = {  # the recipe shrunk: width, depth, the crops and the head; the freeze the first of 2 steps
    "train": ["model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=1", "model.num_attention_heads=2",
              "model.img_h=56", "model.img_w=56", "data.img_size=56", "dino.global_crops_size=56",
              "dino.local_crops_size=28", "dino.local_crops_number=1", "dino.head_n_prototypes=64",
              "dino.head_bottleneck_dim=16", "dino.head_hidden_dim=32", "dino.freeze_backbone_steps=1",
              "train.max_steps=2", "train.batch_size=4", "eval.batch_size=4", "eval.probe_l2=[1e-3]",
              "data.num_workers=0", "train.device=cpu", "train.cpu_threads=1", "log.progress=none",
              "log.report=false", "train.log_every=1"],
    "eval": ["train.device=cpu"],
    "convert": [],
}  # fmt: skip


@pytest.fixture
def home(tmp_path):
    """``photos/`` (8 crops of scikit-learn's two sample photos, two levels deep) and ``labelled/{temple,flower}/``."""
    from sklearn.datasets import load_sample_images

    images = load_sample_images().images
    for k in range(8):
        path = tmp_path / "home" / "photos" / ("2024" if k % 2 else "") / f"{k}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(photo_jpeg(images[k % 2], k))
    for c, name in enumerate(("temple", "flower")):
        (tmp_path / "home" / "labelled" / name).mkdir(parents=True)
        for k in range(4):
            (tmp_path / "home" / "labelled" / name / f"{k}.jpg").write_bytes(photo_jpeg(images[c], 20 + k))
    return tmp_path / "home"


@pytest.mark.slow  # a training run, an evaluation, two conversions
def test_continuing_dinov2_from_the_hub_cache_as_docs_ssl_writes_it(home, tmp_path, monkeypatch, capsys):
    transformers = pytest.importorskip("transformers")
    from huggingface_hub import constants

    commands = doc_commands(DOC, "## Continuing from public weights on your own photos")
    assert [c[:2] for c in commands] == [["hf", "download"], ["vitscale", "train"], ["vitscale", "eval"],
                                         ["vitscale", "convert"]]  # fmt: skip
    repo, recipe = commands[0][2], commands[1][2]
    assert load_config(recipe).checkpoint.init_from == f"hf-hub:{repo}"  # the snapshot step 0 fetches starts the run

    # step 0: what `hf download` leaves, offline — a snapshot transformers wrote, in the cache layout
    torch.manual_seed(0)
    cfg = transformers.Dinov2Config(patch_size=14, image_size=518, layerscale_value=1e-5, drop_path_rate=0.1, **SIZE)
    released = transformers.Dinov2Model(cfg).eval()
    released.save_pretrained(tmp_path / "snapshot")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache(tmp_path / "hub", repo, tmp_path / "snapshot")))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    monkeypatch.chdir(tmp_path)  # the commands' relative paths: runs/..., the exported folder
    for cmd in commands[1:]:
        args = [a.replace("$HOME", str(home)) for a in cmd[1:]] + TINY[cmd[1]]
        if cmd[1] == "eval":
            args = [args[0], "--output", str(tmp_path / "eval.json"), *args[1:]]
        assert main(args) == 0, capsys.readouterr().err
    run = tmp_path / "runs" / "my_photos_dinov2"

    # step 1: started from the cached snapshot, the heads warming up on the frozen backbone for step 1
    log = (run / "train.log").read_text()
    assert re.search(r"checkpoint.init_from: 20 tensors from \S+/snapshots/\w+/model.safetensors \(transformers", log), log
    assert "pos_embed resampled from 1x1370x32 to 1x17x32" in log and "the backbone frozen for 1 steps" in log
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2
    for who in ("", "_teacher"):
        assert 0 <= summary[f"knn_top1{who}"] <= 100 and summary[f"knn_train_images{who}"] == 4

    # step 2: the student's k-NN on the labelled folder, as the run ended with it
    assert json.loads((tmp_path / "eval.json").read_text())["knn_top1"] == summary["knn_top1"]

    # step 3: the teacher as a transformers folder, loaded by transformers with every tensor in place, giving the
    # features vitscale reads from the same folder; the teacher, not the student
    out = tmp_path / commands[3][3]
    hf, info = transformers.AutoModel.from_pretrained(out, output_loading_info=True)
    assert type(hf).__name__ == "Dinov2Model" and not info["missing_keys"] and not info["unexpected_keys"]
    ours = vitscale.create_model("vit_s14_dinov2", pretrained=str(out), hidden_size=32, ffn_hidden_size=64, num_layers=1,
                                 num_attention_heads=2, img_h=56, img_w=56).eval()  # fmt: skip
    x = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf.eval()(pixel_values=x).pooler_output, ours(x), rtol=1e-4, atol=1e-5)
    student = load_file(run / "model.safetensors")
    assert not torch.equal(ours.state_dict()["blocks.0.mlp.fc1.weight"], student["blocks.0.mlp.fc1.weight"])

    # --to timm: one file timm's vit_small_patch14_dinov2 loads strictly at the run's size
    import timm

    assert main(["convert", str(run), str(tmp_path / "teacher_timm.safetensors"), "--key", "teacher", "--to", "timm"]) == 0
    tm = timm.create_model("vit_small_patch14_dinov2", pretrained=False, img_size=56, embed_dim=32, depth=1, num_heads=2,
                           mlp_ratio=2.0)  # fmt: skip
    tm.load_state_dict(load_file(tmp_path / "teacher_timm.safetensors"), strict=True)
