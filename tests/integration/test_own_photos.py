"""docs/ssl.md opens with the three commands a person runs on a folder of their own photos — train
``dino_vits16_1gpu`` on it, evaluate the backbone on a labelled folder, export it — and this test runs
them as the page writes them (through the CLI, the model shrunk, 2 steps on the CPU) on real JPEGs it
writes: nested folders, a hidden folder of thumbnails, no classes. The run's report opens with the
k-NN and probe results it ended with, and draws each collapse signal on its own axis."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers import doc_commands, photo_jpeg
from safetensors.torch import load_file

from vitscale.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "ssl.md"
PHOTOS = [f"{y}{i}.jpg" for y in ("", "2023/", "2023/trip/", "2024/") for i in range(3)]
CLASSES = ("temple", "flower")
TINY = {  # the recipe shrunk: width, depth, the head and the crops; 2 steps on the CPU (everything else the recipe's)
    "train": ["model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=1", "model.num_attention_heads=2",
              "model.img_h=64", "model.img_w=64", "data.img_size=64", "dino.global_crops_size=64",
              "dino.local_crops_size=32", "dino.local_crops_number=1", "dino.head_n_prototypes=64",
              "dino.head_bottleneck_dim=16", "dino.head_hidden_dim=32", "train.max_steps=2", "train.epochs=0",
              "train.batch_size=4", "eval.batch_size=4", "eval.probe_l2=[1e-3]", "data.num_workers=0",
              "train.device=cpu", "train.cpu_threads=1", "log.progress=none", "train.log_every=1"],
    "eval": ["train.device=cpu"],
    "convert": [],
}  # fmt: skip


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """``photos/`` (12 crops of scikit-learn's two sample photos, nested, with a hidden ``.thumbnails``) and
    ``labelled/{temple,flower}/`` (4 other crops of each)."""
    from sklearn.datasets import load_sample_images

    root = tmp_path_factory.mktemp("home")
    images = load_sample_images().images
    for k, name in enumerate(PHOTOS):
        path = root / "photos" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(photo_jpeg(images[k % 2], k))
    (root / "photos" / ".thumbnails").mkdir()
    (root / "photos" / ".thumbnails" / "0.jpg").write_bytes(b"a thumbnail cache, not read")
    for c, name in enumerate(CLASSES):
        (root / "labelled" / name).mkdir(parents=True)
        for k in range(4):
            (root / "labelled" / name / f"{k}.jpg").write_bytes(photo_jpeg(images[c], 20 + k))
    return root


@pytest.mark.slow  # 12 s on the shared 2-core machine: a training run, its report, an evaluation, a conversion
def test_the_three_commands_of_docs_ssl_on_a_folder_of_photos(home, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the commands' relative paths: runs/my_photos, the exported file
    commands = doc_commands(DOC, "## On your own images")
    assert [c[:2] for c in commands] == [["vitscale", "train"], ["vitscale", "eval"], ["vitscale", "convert"]]
    for cmd in commands:
        args = [a.replace("$HOME", str(home)) for a in cmd[1:]] + TINY[cmd[1]]
        if cmd[1] == "eval":
            args = [args[0], "--output", str(tmp_path / "eval.json"), *args[1:]]
        assert main(args) == 0, capsys.readouterr().err
    run = tmp_path / "runs" / "my_photos"

    # trained on the 12 photos at every depth, none of the hidden folder (an epoch: 3 steps of 4); no classifier;
    # evaluated on the labelled folder's halves
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if "loss" in r] == pytest.approx([1 / 3, 2 / 3])
    summary = json.loads((run / "summary.json").read_text())
    for who in ("", "_teacher"):
        assert 0 <= summary[f"knn_top1{who}"] <= 100 and 0 <= summary[f"linear_probe_top1{who}"] <= 100
        assert summary[f"knn_train_images{who}"] == summary[f"knn_val_images{who}"] == 4  # half of each class each
    model = load_file(run / "model.safetensors")
    assert "pos_embed" in model and not any(k.startswith("head.") for k in model)
    assert not (run / "classnames.txt").exists()

    # the report opens with those results, in percent, and each collapse signal has its own axis
    page = (run / "report.html").read_text()
    assert "no evaluation results logged" not in page
    headline = {k: v for v, k in re.findall(r'<div class="v">([^<]+)</div><div class="k">([^<]+)</div>', page)}
    for key in ("knn_top1", "linear_probe_top1", "knn_top1_teacher", "linear_probe_top1_teacher"):
        assert headline[key] == f"{summary[key]:.2f}%", (key, headline)
    assert not any(k.endswith(("_images", "_feature_dim", "_l2")) or "_images_" in k for k in headline)
    from vitscale.tools.report import read_run
    from vitscale.tools.report.plots import plan

    panels = {p.id: keys for p, keys in plan([read_run(run)], compare=False)}
    assert panels["collapse"] == ["train_rankme"] and panels["teacher_entropy"] == ["train_teacher_entropy"]
    assert panels["teacher_kl"] == ["train_teacher_kl_uniform"]
    assert panels["linear_probe"] == ["linear_probe_top1", "linear_probe_top5", "linear_probe_top1_teacher",
                                      "linear_probe_top5_teacher"]  # fmt: skip

    # step 2: the k-NN and the probe of the student's weights on the labelled folder
    evaluated = json.loads((tmp_path / "eval.json").read_text())
    assert evaluated["knn_top1"] == summary["knn_top1"] and evaluated["knn_train_images"] == 4
    assert evaluated["linear_probe_top1"] == summary["linear_probe_top1"]

    # step 3: the teacher's backbone in timm's layout, as docs/ssl.md says to load it
    import timm

    out = tmp_path / "my_photos_vits16.safetensors"
    sd = load_file(out)
    timm_model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=0, init_values=1e-5,
                                   embed_dim=32, depth=1, num_heads=2, mlp_ratio=2.0, img_size=64)  # fmt: skip
    timm_model.load_state_dict(sd, strict=True)
    assert timm_model(torch.zeros(1, 3, 64, 64)).shape == (1, 32)  # the backbone's features, no classifier
