"""A new model family plugs in with its own files only (tests/toy_family: model.py, configs.py,
parallelize.py with its TP plan, the check a layout must pass and its blocks, and one FamilySpec that
names nothing else): through the CLI it then trains, evaluates, benches, gets a memory estimate,
exports, and refuses what it cannot do in one line — a dense-label teacher, a timm comparison —
like the built-in families (docs/architecture.md, "Add a model family"). No file outside tests/ knows it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

TESTS = Path(__file__).resolve().parents[1]
# A fresh process that has imported the toy family (its import registers it), then runs the CLI, or code.
CLI = "import sys; sys.path.insert(0, sys.argv.pop(1)); import toy_family; from vitscale.cli import main; sys.exit(main(sys.argv[1:]))"
CODE = "import sys; sys.path.insert(0, sys.argv.pop(1)); import toy_family; exec(sys.argv.pop(1))"
# toy_debug by hand (tests/toy_family/configs.py): 32x32x3 images, 8x8 patches -> N = 16 tokens of
# C*p*p = 192 values, width D = 32, MLP width F = 64, L = 2 blocks; 2 FLOPs per multiply-add:
# patch embedding 2*N*192*D + L blocks x (fc1 + fc2) 2*2*N*D*F + the classifier 2*D*K (norms, GELU,
# the mean over tokens: elementwise, not counted).
N, PATCH, D, F, L = 16, 192, 32, 64, 2


def toy_flops(classes: int) -> int:
    return 2 * N * PATCH * D + L * 2 * 2 * N * D * F + 2 * D * classes


def vitscale(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI, str(TESTS), *argv], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)  # fmt: skip


def in_toy_process(code: str) -> dict:
    """Run ``code`` (which prints one JSON line) in a process where the toy family is registered."""
    p = subprocess.run([sys.executable, "-c", CODE, str(TESTS), code], capture_output=True, text=True,
                       env=dict(os.environ), timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """A one-step run of toy_debug on digits through ``vitscale train``: (config path, run folder)."""
    tmp = tmp_path_factory.mktemp("toy")
    config = tmp / "toy.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": "toy_debug"},
        "data": {"format": "digits", "num_workers": 0},
        "train": {"max_steps": 1, "batch_size": 16, "log_every": 1, "cpu_threads": 1, "output_dir": str(tmp / "run")},
        "eval": {"batch_size": 100},
        "log": {"progress": "none", "report": False},
    }))  # fmt: skip
    train = vitscale("train", str(config))
    assert train.returncode == 0, train.stderr
    return config, tmp / "run"


@pytest.mark.slow
def test_toy_family_trains_evaluates_and_refuses_dense_labels(toy_run, tmp_path):
    config, run = toy_run
    summary = json.loads((run / "summary.json").read_text())
    assert summary["model"] == "toy_debug" and summary["steps"] == 1 and 0 <= summary["val_top1"] <= 100
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert math.isfinite(row["loss"])
    # TFLOP/s from the family's FLOP count (the FamilySpec names none: traced on the meta device)
    assert row["tflops"] == pytest.approx(row["img_per_s"] * 3 * toy_flops(10) / 1e12, rel=1e-9)
    weights = load_file(run / "model.safetensors")
    assert weights["head.weight"].shape == (10, 32)  # the class count came from the data (digits: 10)
    assert {"blocks.0.fc1.weight", "blocks.1.fc2.weight", "patch_embed.weight"} <= set(weights)

    commands = [  # independent processes: two at a time, one per core
        ("train", str(config), "parallel.activation_checkpointing=full", f"train.output_dir={tmp_path / 'ac'}"),
        ("eval", str(config), f"checkpoint.path={run}"),
        ("label-tokens", str(config), f"teacher.checkpoint={run}", str(tmp_path / "labels")),
    ]
    with ThreadPoolExecutor(2) as pool:
        ac, ev, lt = pool.map(lambda argv: vitscale(*argv), commands)
    # activation checkpointing through the family's plan (its blocks) changes nothing numerically
    assert ac.returncode == 0, ac.stderr
    (row_ac,) = [json.loads(line) for line in (tmp_path / "ac" / "metrics.jsonl").read_text().splitlines()]
    assert row_ac["loss"] == row["loss"]

    # vitscale eval rebuilds the run and reads the weights back: the same val accuracy as training
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["val_top1"] == summary["val_top1"]

    # no dense per-token logits: label-tokens refuses in one line naming the model
    assert lt.returncode == 2 and "ToyNet gives no per-token class logits" in lt.stderr
    assert len(lt.stderr.strip().splitlines()) == 1, lt.stderr


@pytest.mark.slow
def test_toy_family_benches_estimates_memory_exports_and_names_its_missing_adapter(toy_run, tmp_path):
    _, run = toy_run
    bench_json, export_dir = tmp_path / "bench.json", tmp_path / "export"
    commands = [  # one process with the toy family registered runs the CLI on each, in turn
        ["bench", "toy_debug", "--device", "cpu", "--batch-size", "4", "--steps", "2", "--rounds", "2", "--warmup", "0",
         "--json", str(bench_json)],
        ["bench", "toy_debug", "--compare", "timm", "--dry-run"],
        ["memory", "toy_debug", "--json", "--micro-batch", "4", "--dtype", "fp32"],
        ["memory", "toy_debug", "--tp", "3"],
        ["export", str(run), "--format", "torch-export", "--out", str(export_dir)],
    ]  # fmt: skip
    out = in_toy_process(f"commands = {commands!r}\n{CLI_AND_MEASURE}")
    bench, compare, memory, memory_tp, export = out["cli"]
    for rc, _, err in (bench, memory, export):
        assert rc == 0, err

    # vitscale bench: a timed training step, with the FLOPs counted as the trainer counts them
    res = json.loads(bench_json.read_text())
    assert res["flops_per_img"] == toy_flops(1000) and res["vitscale"]["img_per_s"] > 0 and res["speedup"] is None

    # no timm adapter: one line from the CLI, and the same from vitscale.interop
    assert compare[0] == 2 and compare[2].strip() == "vitscale bench: no timm adapter for family toy (its adapters: none)"
    assert out["to_timm"] == "no timm adapter for family toy (its adapters: none)"

    # vitscale memory: the family names no memory model, so it is measured on the meta device; at
    # one process in fp32 it equals what autograd saves on the CPU (and the states are exact)
    est = json.loads(memory[1])
    assert est["params"] == out["params"] and est["param_bytes"] == 4 * out["params"]
    assert est["optim_bytes"] == 8 * out["params"] and est["activation_bytes"] == out["saved_bytes"]
    # the family's plan says what tp must divide: one line
    assert memory_tp[0] == 2 and "mlp_hidden_size=64 is not divisible by 3" in memory_tp[2]
    assert len(memory_tp[2].strip().splitlines()) == 1, memory_tp[2]

    # vitscale export: the default serving graph (images -> logits), written, loaded back and checked
    info = json.loads((export_dir / "export.json").read_text())
    assert info["model"]["family"] == "toy" and set(info["graphs"]) == {"image"} and info["check"]["passed"]
    assert info["num_classes"] == 10 and info["graphs"]["image"]["output"]["shape"] == [1, 10]


# The CLI on each of ``commands`` ((exit code, stdout, stderr) each); what autograd saves in one
# training step of toy_debug (batch 4, fp32, CPU), parameters excluded; and what vitscale.interop says
# of a timm conversion.
CLI_AND_MEASURE = """
import contextlib, io, json, torch
import vitscale
from vitscale.cli import main
from vitscale.interop import to_timm
cli = []
for argv in commands:
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        rc = main(argv)
    cli.append((rc, o.getvalue(), e.getvalue()))
torch.manual_seed(0)
model = vitscale.create_model("toy_debug")
params = {p.untyped_storage().data_ptr() for p in model.parameters()}
seen = {}
def pack(t):
    if t.untyped_storage().data_ptr() not in params:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return t
with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    model(*model.example_inputs(4)).sum().backward()
try:
    to_timm(model)
    refusal = None
except NotImplementedError as e:
    refusal = str(e)
print(json.dumps({"cli": cli, "params": sum(p.numel() for p in model.parameters()), "saved_bytes": sum(seen.values()),
                  "to_timm": refusal}))
"""
