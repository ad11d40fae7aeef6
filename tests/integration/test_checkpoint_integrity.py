"""Damaged checkpoints and failed saves through the CLI: a damaged newest checkpoint is skipped with a
warning naming the file and the resume continues bit for bit from the older intact one; none
intact is one line naming the files; a disk that fills up mid-save leaves the older checkpoints
intact and no partial folder, and says so in one or two lines."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import torch
from helpers import read_losses

from vitscale.checkpoint import read_weights
from vitscale.checkpoint.storage import verify
from vitscale.cli import main

# a constant LR: step N gets the same LR whatever train.max_steps is, so a longer resumed run repeats steps exactly
TINY = ["model.num_layers=1", "train.batch_size=32", "data.num_workers=0", "log.flops=false", "eval.every=0",
        "log.progress=none", "checkpoint.every=2", "checkpoint.keep=5", "train.log_every=1", "log.report=false", "log.tensorboard=false",
        "schedule.name=constant", "schedule.warmup_steps=0"]  # fmt: skip
LONGER = ["checkpoint.allow_changes=train.max_steps"]  # resuming a run to train it longer


def test_garbage_in_newest_checkpoint_falls_back_to_older(tmp_path, capsys, caplog):
    run = tmp_path / "run"
    assert main(["train", "digits_vit", "train.max_steps=4", f"train.output_dir={run}", *TINY]) == 0
    first = read_losses(run)
    shard = run / "checkpoints" / "step_00000004" / "model-rank00000.safetensors"
    data = bytearray(shard.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 4096] = os.urandom(4096)  # 4 KiB of garbage in the middle of the weights
    shard.write_bytes(bytes(data))
    capsys.readouterr()

    assert main(["train", "digits_vit", "train.max_steps=6", f"train.output_dir={run}", *LONGER, *TINY, "--json"]) == 0
    out = capsys.readouterr()
    # logging's stderr fallback prints it, unless a handler is installed (pytest's capture is one)
    lines = out.err.splitlines() + [r.getMessage() for r in caplog.records if r.name == "vitscale.checkpoint"]
    warning = [line for line in lines if "skipping damaged checkpoint" in line]
    assert len(warning) == 1 and "step_00000004" in warning[0] and str(shard) in warning[0] and "checksum mismatch" in warning[0]
    assert warning[0] in (run / "train.log").read_text().splitlines()  # and the run's log keeps it
    summary = json.loads(out.out[out.out.index("\n{") + 1 :])
    assert summary["resumed_from"].endswith("step_00000002") and summary["steps_this_run"] == 4
    again = read_losses(run)
    assert again[3] == first[3] and again[4] == first[4]  # steps 3-4 re-run bit for bit from step 2
    assert all(torch.isfinite(torch.tensor(v)) for v in again.values())
    weights = read_weights(run / "model.safetensors")  # the export verifies, and holds the step-6 model
    assert all(torch.isfinite(v).all() for v in weights.values())
    assert verify(run / "checkpoints" / "step_00000006")[1] == []


def test_no_intact_checkpoint_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "digits_vit", "train.max_steps=2", f"train.output_dir={run}", *TINY]) == 0
    step = run / "checkpoints" / "step_00000002"
    (step / "checkpoint.json").write_bytes((step / "checkpoint.json").read_bytes()[:100])  # truncated index
    capsys.readouterr()
    assert main(["train", "digits_vit", "train.max_steps=4", f"train.output_dir={run}", *LONGER, *TINY]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"vitscale train: no intact checkpoint in {run / 'checkpoints'}: {step / 'checkpoint.json'}: not valid JSON")
    assert not (step.parent / "step_00000004").exists()  # nothing trained on


# ------------------------------------------------------------------------------------- a full disk
def _namespaces_work() -> bool:
    """Unprivileged user + mount namespaces (a private tmpfs without root), where the kernel allows."""
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k none /tmp"], capture_output=True)
    return probe.returncode == 0


def test_disk_full_mid_save_keeps_older_checkpoints(tmp_path):
    run, saved = tmp_path / "run", tmp_path / "after"
    assert main(["train", "digits_vit", "train.max_steps=2", f"train.output_dir={run}", *TINY]) == 0
    size = sum(p.stat().st_size for p in (run / "checkpoints" / "step_00000002").iterdir())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    train = [sys.executable, "-m", "vitscale", "train", "digits_vit", "train.max_steps=4", f"train.output_dir={run}", *LONGER, *TINY]
    ckpts = run / "checkpoints"
    if _namespaces_work():
        # checkpoints/ on a private tmpfs with room for the old checkpoint and half of the next one: a real ENOSPC
        script = (f'cp -a "{ckpts}" "{tmp_path}/c" && mount -t tmpfs -o size={size * 3 // 2} none "{ckpts}" && '
                  f'cp -a "{tmp_path}/c/." "{ckpts}/" && "$@"; rc=$?; cp -a "{ckpts}" "{saved}"; exit $rc')  # fmt: skip
        res = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", *train], capture_output=True, text=True, env=env, timeout=300)
        cause = "No space left on device"
    else:  # else a per-process file size limit, below one weights file: the write fails with EFBIG

        def limit():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (size // 4, size // 4))

        res = subprocess.run(train, capture_output=True, text=True, env=env, timeout=300, preexec_fn=limit)
        shutil.copytree(ckpts, saved)
        cause = "File too large"
    err = res.stderr.strip().splitlines()
    assert res.returncode == 1, res.stderr[-3000:]
    assert 1 <= len(err) <= 2 and f"could not save checkpoint {ckpts / 'step_00000004'}: {cause}" in err[-1], err
    assert "partial files were removed" in err[-1]
    assert sorted(p.name for p in saved.iterdir()) == ["step_00000002"]  # no .tmp-step_00000004 left behind
    assert verify(saved / "step_00000002")[1] == []  # the older checkpoint is intact
