"""Exact resume: a run restarted from a checkpoint (also after SIGKILL) continues on the same curve."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from vitscale.config import load_config
from vitscale.train import train

TINY = [
    "model.name=vit_debug", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=2",
    "model.num_attention_heads=2", "model.hidden_dropout=0.1", "model.drop_path_rate=0.1",
    "data.format=synthetic", "data.num_classes=10", "data.synthetic_size=96", "data.val_split=0.25",
    "data.num_workers=0", "train.label_smoothing=0.1", "train.batch_size=16", "train.cpu_threads=1", "train.grad_accum=2", "train.log_every=1", "train.ema_decay=0.9",
    "optim.lr=1e-3", "schedule.warmup_steps=3", "eval.every=4", "eval.batch_size=32", "log.progress=plain",
    "log.report=false", "log.tensorboard=false",
]  # fmt: skip
# every stochastic feature, for the in-process resume test
AUG = ["data.auto_augment=rand-m9-mstd0.5-inc1", "data.random_erasing=0.25", "data.mixup_alpha=0.8", "data.cutmix_alpha=1.0"]


def _curve(out: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: r[k] for k in ("loss", "lr", "grad_norm", "val_top1", "val_loss_ema") if k in r} for r in rows}


def _tiny(out, steps, every, extra=()):
    return load_config(None, TINY + [f"train.output_dir={out}", f"train.max_steps={steps}",
                                     f"checkpoint.every={every}", "checkpoint.keep=5", *extra])  # fmt: skip


def test_resume_from_checkpoint_is_bit_exact(tmp_path):
    full = tmp_path / "full"
    summary = train(_tiny(full, 10, 4, AUG))  # 6 samples per epoch-step -> crosses an epoch boundary
    assert summary["steps"] == 10 and "val_top1" in summary
    ref = _curve(full)
    assert sorted(ref) == list(range(1, 11))
    # a second folder holding only the step-4 checkpoint and the log up to a later, lost step
    part = tmp_path / "part"
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / "step_00000004", part / "checkpoints" / "step_00000004")
    lines = (full / "metrics.jsonl").read_text().splitlines()[:6]
    (part / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    resumed = train(_tiny(part, 10, 4, AUG))
    assert resumed["resumed_from"].endswith("step_00000004") and resumed["steps_this_run"] == 6
    assert _curve(part) == ref  # same losses, LRs, grad norms and evals, bit for bit
    assert resumed["val_top1"] == summary["val_top1"]
    from safetensors.torch import load_file

    a, b = load_file(full / "model.safetensors"), load_file(part / "model.safetensors")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)  # identical final weights
    # the same checkpoint as vitscale wrote it before its per-head projections had names of their own
    old = tmp_path / "old"
    idx = _write_with_former_names(full / "checkpoints" / "step_00000004", old / "checkpoints")
    assert "model.blocks.0.attn.qkv.weight" in idx and "optim.state.blocks.0.attn.qkv.weight.exp_avg" in idx
    assert not any("per_head" in k for k in idx)
    (old / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    resumed = train(_tiny(old, 10, 4, AUG))
    assert resumed["resumed_from"].endswith("step_00000004") and _curve(old) == ref
    c = load_file(old / "model.safetensors")
    assert c.keys() == a.keys() and all(a[k].equal(c[k]) for k in a)


def _write_with_former_names(step: Path, root: Path) -> dict:
    """The checkpoint ``step`` written again under ``root``, every tensor (weights, optimizer states,
    EMA) under its name before the per-head rename; returns the new checkpoint's tensor names."""
    from vitscale.checkpoint import Checkpointer
    from vitscale.checkpoint.discovery import find_checkpoint
    from vitscale.checkpoint.storage import read_full
    from vitscale.param_names import former_name

    ckpt, idx = find_checkpoint(step)
    state: dict = {}
    for fqn, t in read_full(ckpt, idx, list(idx["tensors"])).items():
        top, rest = former_name(fqn).split(".", 1)  # DCP joins nested keys with dots: the same names
        state.setdefault(top, {})[rest] = t
    ts = json.loads((step / "trainer_state.json").read_text())
    ts.pop("world_size")
    rng = json.loads((step / "rng_rank0.json").read_text())
    Checkpointer(root, keep=5).save(int(ts["step"]), state, ts, rng)
    return json.loads((root / step.name / "checkpoint.json").read_text())["tensors"]


def test_sigkill_mid_training_then_resume(tmp_path):
    ref_dir = tmp_path / "ref"
    train(_tiny(ref_dir, 16, 2))
    ref = _curve(ref_dir)

    out = tmp_path / "killed"
    args = [sys.executable, "-m", "vitscale", "train", "-", *TINY, f"train.output_dir={out}",
            "train.max_steps=16", "checkpoint.every=2", "checkpoint.keep=5"]  # fmt: skip
    args[args.index("-")] = str(_write_empty(tmp_path))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 120
    ckpts = out / "checkpoints"
    while time.time() < deadline and proc.poll() is None:
        if (ckpts / "step_00000004").is_dir():
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.stdout.read().decode()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done = _curve(out)
    assert 4 <= max(done) < 16  # killed part-way
    assert _curve(out).items() <= ref.items()  # the same curve up to the kill

    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "resumed from" in result.stdout
    assert _curve(out) == ref


def _write_empty(tmp_path: Path) -> Path:
    p = tmp_path / "empty.yaml"
    p.write_text("{}\n")
    return p
