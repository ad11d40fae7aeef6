"""Two evaluation paper-cuts, through the CLI: ``'evals=[]'`` runs no evaluation (unset, a task's
default ``knn`` + ``linear_probe`` run), and ``vitscale eval ... eval.probe=linear`` reads a
backbone-only file — vitscale's or timm's ``num_classes=0`` layout, as DINOv2's backbones ship — whose
``head.*`` it never reads (the two files give the same probe: the timm one converted, not misread)."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import save_file

import vitscale
from vitscale.cli import main
from vitscale.config import load_config

pytestmark = pytest.mark.slow  # a training run and two probes: ~20 s on 2 cores

SMALL = ["model.overrides.hidden_size=32", "model.overrides.num_layers=1", "model.overrides.ffn_hidden_size=64",
         "data.num_workers=0"]  # fmt: skip


def test_empty_evals_means_none(tmp_path):
    assert load_config("digits_dino").evals is None  # unset: the task's defaults
    out = tmp_path / "run"
    assert main(["train", "digits_dino", *SMALL, "dino.head_n_prototypes=32", "dino.head_hidden_dim=32",
                 "dino.head_bottleneck_dim=16", "train.max_steps=2", "train.batch_size=16", "evals=[]",
                 "log.report=false", "log.progress=plain", f"train.output_dir={out}"]) == 0  # fmt: skip
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows and not [k for r in rows for k in r if k.startswith(("knn", "linear_probe"))]
    assert load_config(str(out / "config.yaml")).evals == ()  # and stays none when the run is read back


def test_probe_reads_a_backbone_only_file(tmp_path, capsys):
    from vitscale.interop import to_timm

    model = vitscale.create_model("vit_debug", num_classes=0, pool="avg", patch_dim=4, hidden_size=32, num_layers=1,
                                  ffn_hidden_size=64)  # fmt: skip
    model.init_weights()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "ours.safetensors")
    save_file({k: v.contiguous() for k, v in to_timm(model).items()}, tmp_path / "timm.safetensors")
    results = []
    for name in ("ours", "timm"):
        capsys.readouterr()
        assert main(["eval", "digits_vit", *SMALL, f"checkpoint.path={tmp_path / name}.safetensors",
                     "eval.probe=linear", "eval.probe_l2=[1e-3]"]) == 0  # fmt: skip
        res = json.loads(capsys.readouterr().out)
        assert res["load"]["missing"] == ["head.weight", "head.bias"]  # the classifier: never read by the probe
        results.append(res["linear_probe_top1"])
    assert results[0] == results[1] > 50
