"""What vitscale promises about runs, through the CLI and real run folders (docs/trust.md): a run that
diverges stops with the last good checkpoint intact and strict JSON outputs; one run per folder (a
lock, a stale one taken over, released on Ctrl-C); a resume continues the same run or says what
changed; a finished run says it is finished; bad settings and inputs are refused up front in one line
naming the field (exit code 2); every command's errors are one or two lines, ``--debug`` shows the
traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from PIL import Image

from vitscale.checkpoint import read_weights
from vitscale.checkpoint.storage import verify
from vitscale.cli import main

TINY = ["model.num_layers=1", "train.batch_size=16", "data.num_workers=0", "log.flops=false", "eval.every=0",
        "log.progress=plain", "train.log_every=1", "eval.batch_size=300"]  # fmt: skip
REPO = Path(__file__).parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "PYTHONUNBUFFERED": "1"}


def _strict(text: str):
    """JSON as any strict reader sees it: a bare NaN / Infinity is an error."""

    def refuse(name):
        raise ValueError(f"bare {name} in JSON")

    return json.loads(text, parse_constant=refuse)


def _err_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]


# ------------------------------------------------------------------------------------- divergence
def test_a_diverging_run_stops_with_the_last_good_checkpoint(tmp_path, capsys):
    """The repro of issue 12: optim.lr=1e6 on digits."""
    run = tmp_path / "run"
    rc = main(["train", "digits_vit", f"train.output_dir={run}", *TINY, "optim.lr=1e6", "train.max_steps=50", "checkpoint.every=1",
               "checkpoint.keep=10"])  # fmt: skip
    out = capsys.readouterr()
    err = [line for line in out.err.strip().splitlines() if line.startswith("vitscale train:")]
    assert rc == 1 and len(err) == 1, out.err[-2000:]
    assert "non-finite loss or gradient norm, 6 in a row, more than train.max_consecutive_nonfinite=5" in err[0]
    assert "none of them was applied" in err[0] and "step_00000006" in err[0] and "is intact" in err[0]
    records = [_strict(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 6 and records[-1]["grad_norm"] == "nan" and records[-1]["nonfinite_steps"] == 5  # strict
    assert "grad_norm nan" in out.out.splitlines()[-1]  # the console line keeps the field
    steps = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert steps[-1] == "step_00000006" and not any(p.name.startswith(".tmp") for p in (run / "checkpoints").iterdir())
    assert verify(run / "checkpoints" / steps[-1])[1] == []
    good = read_weights(run / "checkpoints" / steps[-1])  # the weights of the last applied step, finite
    first = read_weights(run / "checkpoints" / "step_00000001")
    assert all(torch.isfinite(v).all() and torch.equal(v, first[k]) for k, v in good.items())
    assert not (run / "model.safetensors").exists() and not (run / "summary.json").exists()
    assert not (run / "run.lock").exists()  # released


def test_without_a_budget_the_run_finishes_and_every_file_is_strict_json(tmp_path, capsys):
    run = tmp_path / "run"
    rc = main(["train", "digits_vit", "optim.lr=1e6", "train.max_steps=5", "train.max_consecutive_nonfinite=-1",
               "train.max_nonfinite_steps=-1", f"train.output_dir={run}", *TINY])  # fmt: skip
    assert rc == 0
    summary = _strict((run / "summary.json").read_text())
    assert summary["nonfinite_steps"] == 4 and summary["steps"] == 5
    for line in (run / "metrics.jsonl").read_text().splitlines():
        _strict(line)
    weights = read_weights(run / "model.safetensors")  # step 1's weights: the only step applied
    assert all(torch.isfinite(v).all() for v in weights.values())


# ------------------------------------------------------------------------------------- the lock
def _as_from_a_terminal() -> None:
    """In the child before it starts: Ctrl-C's default action. A process inherits an ignored SIGINT
    (a shell's background job, ``nohup``, ``make test &``), and Python then installs no
    KeyboardInterrupt handler: the run would train on through the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vitscale", *args], cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_as_from_a_terminal)  # fmt: skip


def _wait_for_step(proc: subprocess.Popen, run: Path) -> None:
    """Until ``proc`` holds the folder's lock and has logged a step."""
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            holder = json.loads((run / "run.lock").read_text())
            logged = (run / "metrics.jsonl").read_text().strip()
        except (OSError, ValueError):
            holder, logged = {}, ""
        if holder.get("pid") == proc.pid and logged:
            return
        time.sleep(0.1)
    raise AssertionError(f"the run did not start: {proc.communicate()}")


def test_one_run_per_folder(tmp_path, capsys, caplog):
    run = tmp_path / "run"
    # checkpoint.save_on_signal=[]: Ctrl-C ends it at once, no checkpoint (saving on Ctrl-C, the default:
    # tests/integration/test_preemption.py), so the runs below start afresh in the same folder
    long = ["train", "digits_vit", "train.max_steps=100000", f"train.output_dir={run}", "checkpoint.save_on_signal=[]", *TINY]
    first = _start(long, tmp_path)
    _wait_for_step(first, run)
    holder = json.loads((run / "run.lock").read_text())
    assert holder["pid"] == first.pid and holder["host"] == socket.gethostname()

    # a second run on the live folder: refused in one line naming the holder, nothing written
    before = (run / "metrics.jsonl").read_text()
    assert main(["train", "digits_vit", "train.max_steps=2", f"train.output_dir={run}", *TINY]) == 1
    err = _err_lines(capsys)
    assert len(err) == 1 and err[0].startswith(f"vitscale train: {run} is in use by another run (host {socket.gethostname()}, pid {first.pid}, started ")
    assert (run / "metrics.jsonl").read_text().startswith(before)
    assert "train.max_steps=2" not in (run / "train.log").read_text()  # the live run's log holds its own lines only

    # Ctrl-C: the run ends (exit code 130, one line) and releases the folder
    first.send_signal(signal.SIGINT)
    try:
        stdout, stderr = first.communicate(timeout=60)
    except subprocess.TimeoutExpired as e:  # say where the run was, then end it
        first.kill()
        raise AssertionError(f"the run did not end within 60 s of Ctrl-C: stdout ...{str(e.output)[-1500:]} "
                             f"stderr ...{str(e.stderr)[-1500:]}") from None  # fmt: skip
    assert first.returncode == 130 and stderr.strip().splitlines()[-1] == "vitscale train: interrupted", stdout[-2000:]
    assert not (run / "run.lock").exists()

    # a run killed outright (SIGKILL, a crashed node) leaves its record behind, the kernel its flock:
    # the same file as the one just released, back in place; the next run here sees the PID is gone
    (run / "run.lock").write_text(json.dumps(holder))
    with caplog.at_level("WARNING", logger="vitscale.run"):
        assert main(["train", "digits_vit", "train.max_steps=2", f"train.output_dir={run}", *TINY]) == 0
    taken = [r.getMessage() for r in caplog.records if "taking over the lock" in r.getMessage()]
    assert taken == [f"{run}: taking over the lock of pid {first.pid} (started {holder['started']}), which is no longer running"]
    assert not (run / "run.lock").exists()

    # another machine's lock cannot be checked from here: the message says how to remove it
    (run / "run.lock").write_text(json.dumps({"host": "gpu-node-17", "pid": 4242, "started": "2026-11-20T10:00:00+00:00"}))
    assert main(["train", "digits_vit", "train.max_steps=3", f"train.output_dir={run}", *TINY]) == 1
    err = _err_lines(capsys)
    assert err == [f"vitscale train: {run} is locked by a run on another machine (host gpu-node-17, pid 4242, started "
                   f"2026-11-20T10:00:00+00:00); if that run is no longer running, delete {run / 'run.lock'} and start again"]


# ------------------------------------------------------------------------------------- resume = the same run
def test_resume_means_the_same_run(tmp_path, capsys):
    run = tmp_path / "run"
    base = ["train", "digits_vit", f"train.output_dir={run}", *TINY]
    assert main([*base, "train.max_steps=2"]) == 0
    config = (run / "config.yaml").read_bytes()
    metrics = (run / "metrics.jsonl").read_bytes()
    capsys.readouterr()

    # the same command again (harmless settings changed): finished, nothing trained, nothing rewritten
    assert main([*base, "train.max_steps=2", "train.log_every=7", "data.num_workers=0", "eval.batch_size=100"]) == 0
    out = capsys.readouterr().out
    assert f"{run} is a finished run (step 2 of 2; newest checkpoint step_00000002): nothing to train" in out
    assert "model.safetensors" in out and "To train it longer, raise train.max_steps and add checkpoint.allow_changes=train.max_steps" in out
    assert (run / "config.yaml").read_bytes() == config and (run / "metrics.jsonl").read_bytes() == metrics
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000002"]

    # a changed config is refused with the changed keys and both ways out (exit code 2)
    assert main([*base, "train.max_steps=4", "optim.lr=1e-3", "model.hidden_size=64"]) == 2
    err = _err_lines(capsys)
    assert err[0].startswith(f"vitscale train: {run} holds a run with another config (its config.yaml; newest checkpoint step_00000002)")
    assert err[1:4] == ["  model.hidden_size: 96 -> 64", "  optim.lr: 0.003 -> 0.001", "  train.max_steps: 2 -> 4"]
    assert err[4] == ("Start a new run with another train.output_dir, or continue this one with the changes: "
                      "checkpoint.allow_changes=model.hidden_size,optim.lr,train.max_steps")
    assert (run / "config.yaml").read_bytes() == config

    # training longer, accepted explicitly: resumes at step 2, keeps the old config beside the new one
    assert main([*base, "train.max_steps=4", "checkpoint.allow_changes=train.max_steps"]) == 0
    out = capsys.readouterr().out
    assert "resuming" in out and "train.max_steps: 2 -> 4" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["steps_this_run"] == 2 and summary["resumed_from"].endswith("step_00000002")
    assert (run / "config.before_step_00000002.yaml").read_bytes() == config
    assert "max_steps: 4" in (run / "config.yaml").read_text()

    # starting over in a folder that holds checkpoints would mix two runs: refused
    assert main([*base, "train.max_steps=4", "checkpoint.resume=false"]) == 2
    assert "holds checkpoints of an earlier run (newest step_00000004) and checkpoint.resume=false" in _err_lines(capsys)[0]


# ------------------------------------------------------------------------------------- up-front checks
@pytest.mark.parametrize(
    "override, message",
    [
        ("train.batch_size=0", "train.batch_size=0 must be at least 1"),
        ("train.batch_size=-16", "train.batch_size=-16 must be at least 1"),
        ("train.grad_accum=0", "train.grad_accum=0 must be at least 1"),
        ("train.log_every=0", "train.log_every=0 must be at least 1"),
        ("train.max_steps=-5", "train.max_steps=-5 must be at least 0"),
        ("eval.every=-1", "eval.every=-1 must be at least 0"),
        ("checkpoint.every=-2", "checkpoint.every=-2 must be at least 0"),
        ("train.grad_accum=3", "train.batch_size=16 must be divisible by data-parallel size 1 x train.grad_accum 3"),
        ("data.img_size=30", "data.img_size=30 does not fit vit_debug: image 30x30 is not divisible by patch_dim 4; use a multiple of 4"),
        ("data.img_size=100000", "data.img_size=100000 is not a usable image side: use 1 to 8192 pixels"),
        ("model.img_h=0", "model.img_h=0 is not a usable image side"),
        ("data.max_image_pixels=-1", "data.max_image_pixels=-1 must be at least 0"),
    ],
)
def test_bad_settings_fail_up_front_in_one_line(tmp_path, capsys, override, message):
    run = tmp_path / "run"
    assert main(["train", "digits_vit", f"train.output_dir={run}", *TINY, "train.max_steps=1", override]) == 2
    err = _err_lines(capsys)
    assert len(err) == 1 and err[0].startswith(f"vitscale train: {message}"), err
    assert not run.exists()  # refused before anything was written (or any data read, any model built)


def _digit_folder(root: Path, classes: int, per_class: int) -> Path:
    from vitscale.data.digits import load_digits_split

    images, labels = load_digits_split("train", 3)
    for c in range(classes):
        (root / f"class_{c:02d}").mkdir(parents=True, exist_ok=True)
        picks = [i for i in range(len(labels)) if int(labels[i]) == c % 10][:per_class]
        for j, i in enumerate(picks):
            Image.fromarray(images[i].permute(1, 2, 0).numpy()).save(root / f"class_{c:02d}" / f"{j}.png")
    return root


def test_class_count_comes_from_the_data(tmp_path, capsys):
    two = _digit_folder(tmp_path / "two", 2, 8)
    run = tmp_path / "run"
    folder = ["data.format=imagefolder", f"data.train_path={two}", "data.val_split=0.25", "train.max_steps=1"]
    assert main(["train", "digits_vit", *folder, f"train.output_dir={run}", *TINY, "train.batch_size=4"]) == 0
    assert read_weights(run / "model.safetensors")["head.weight"].shape[0] == 2  # a 2-way head, not the digits' 10
    capsys.readouterr()

    twelve = _digit_folder(tmp_path / "twelve", 12, 2)
    folder = ["data.format=imagefolder", f"data.train_path={twelve}", "train.max_steps=1"]
    assert main(["train", "digits_vit", *folder, "model.num_classes=10", f"train.output_dir={tmp_path / 'r12'}", *TINY]) == 2
    err = _err_lines(capsys)
    assert err == [f"vitscale train: model.num_classes=10 but the data has 12 classes (data.train_path={twelve}): leave "
                   "model.num_classes out to take the count from the data, or set it to at least 12"]
    assert main(["train", "digits_vit", *folder, "data.num_classes=5", f"train.output_dir={tmp_path / 'r5'}", *TINY]) == 2
    assert "data.num_classes=5 but the dataset has 12 classes" in _err_lines(capsys)[0]


def test_oversized_images_and_symlink_loops(tmp_path, capsys, caplog):
    root = _digit_folder(tmp_path / "data", 2, 8)
    Image.new("1", (12000, 12000)).save(root / "class_00" / "huge.png")  # 144 M pixels: a few KB of PNG
    os.symlink("..", root / "class_01" / "loop")  # class_01/loop/class_01/loop/... and into class_00
    run = tmp_path / "run"
    with caplog.at_level("WARNING"):
        rc = main(["train", "digits_vit", "data.format=imagefolder", f"data.train_path={root}", "train.max_steps=1",
                   f"train.output_dir={run}", *TINY, "train.batch_size=17"])  # fmt: skip
    assert rc == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["skipped_files"] == 1  # the 17 files, each once; the huge one skipped, not decoded
    warnings = [r.getMessage() for r in caplog.records]
    huge = [w for w in warnings if "huge.png" in w]
    assert len(huge) == 1 and "12000x12000 = 144.0M pixels, more than data.max_image_pixels=89478485" in huge[0]
    loops = [w for w in warnings if "symlink loop" in w]
    assert len(loops) == 1 and f"{root / 'class_01' / 'loop'} -> {root}" in loops[0]


def _unshare_works() -> bool:
    return bool(shutil.which("unshare")) and subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k none /tmp"], capture_output=True
    ).returncode == 0


def test_output_folder_checked_up_front(tmp_path, capsys):
    afile = tmp_path / "a_file"
    afile.write_text("")
    assert main(["train", "digits_vit", "train.max_steps=1", f"train.output_dir={afile}", *TINY]) == 2
    assert _err_lines(capsys) == [f"vitscale train: train.output_dir={afile} is a file, not a folder: choose a folder for the run"]
    if not _unshare_works():
        pytest.skip("no unprivileged mount namespaces here: the read-only and full-disk cases need a private mount")
    ro, small = tmp_path / "ro", tmp_path / "small"
    ro.mkdir()
    small.mkdir()
    # one process in a private mount namespace: a read-only tmpfs, and one too small for a checkpoint
    code = ("import contextlib, io, json, sys; from vitscale.cli import main; out = []\n"
            "for d in sys.argv[1:]:\n"
            "    err = io.StringIO()\n"
            "    with contextlib.redirect_stderr(err):\n"
            f"        rc = main(['train', 'digits_vit', 'train.max_steps=1', *{TINY!r}, 'train.output_dir=' + d + '/run'])\n"
            "    out.append([rc, err.getvalue().strip().splitlines()])\n"
            "print(json.dumps(out))")  # fmt: skip
    script = f'mount -t tmpfs -o ro,size=1m none "{ro}" && mount -t tmpfs -o size=512k none "{small}" && "$@"'
    res = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", sys.executable, "-c", code, str(ro), str(small)],
                         capture_output=True, text=True, env=ENV, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr
    (rc_ro, err_ro), (rc_small, err) = json.loads(res.stdout.strip().splitlines()[-1])
    assert rc_ro == 2 and err_ro == [f"vitscale train: train.output_dir={ro / 'run'} cannot be written (Read-only file system: "
                                     f"{ro / 'run'}): choose a folder you can write to"], err_ro
    assert rc_small == 2 and len(err) == 1 and err[0].startswith(f"vitscale train: train.output_dir={small / 'run'}: "), err
    from vitscale.config import load_config
    from vitscale.run.assemble import resolve_run_model
    from vitscale.run.checks import checkpoint_bytes

    cfg = load_config("digits_vit", TINY)
    params, need = checkpoint_bytes(cfg, resolve_run_model(cfg))
    assert need > 512 << 10 and (f"free on its disk, one checkpoint of vit_debug ({params / 1e6:.1f}M parameters: weights, "
                                 f"optimizer state in fp32) takes about {need / 2**20:.1f} MiB") in err[0]


# ------------------------------------------------------------------------------------- errors, every command
def test_errors_are_one_or_two_lines_from_every_command(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    assert main(["train", "digits_vit", "train.max_steps=1", f"train.output_dir={run}", *TINY]) == 0
    capsys.readouterr()
    missing = tmp_path / "missing"
    nan_run = tmp_path / "nan_run"  # a run folder whose exported weights hold a NaN (not written by vitscale)
    shutil.copytree(run, nan_run)
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(run / "model.safetensors"), "pt") as f:
        meta = {k: v for k, v in f.metadata().items() if k != "vitscale.checksum"}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors["head.bias"][3] = float("nan")
    save_file(tensors, str(nan_run / "model.safetensors"), metadata=meta)
    cases = {
        "train": (["train", "digits_vit", "data.format=imagefolder", f"data.train_path={missing}", f"train.output_dir={tmp_path / 't'}"],
                  f"image folder '{missing}' does not exist"),
        "eval": (["eval", "digits_vit", f"checkpoint.path={missing}"], f"no checkpoint at '{missing}'"),
        "eval, weights that do not fit": (
            ["eval", "digits_vit", f"checkpoint.path={run}", "model.num_layers=1", "model.hidden_size=64"],
            "tensors of another shape (cls_token: 1x1x96 in the file, 1x1x64 in the model; pos_embed: 1x65x96 in the "
            "file, 1x65x64 in the model; ...); set model.* as for the run that wrote these weights"),
        "init_from that does not fit": (
            ["train", "digits_vit", f"checkpoint.init_from={run}", f"train.output_dir={tmp_path / 'ft'}", "train.max_steps=1",
             *TINY, "model.num_layers=2"],
            f"checkpoint.init_from={run} holds a vit with num_layers=1; the model (model.name with model.overrides) "
            "has num_layers=2: set model.num_layers=1 (or model.name to the weights' variant)"),  # the first field that differs
        "label-tokens": (["label-tokens", "digits_vit", f"teacher.checkpoint={run}", "model.num_layers=2", str(tmp_path / "labels")],
                         f"teacher.checkpoint={run} does not fit the model (VisionTransformer): "),
        "convert": (["convert", str(missing), str(tmp_path / "out.safetensors")], f"no checkpoint at '{missing}'"),
        "convert, permission denied": (["convert", str(run), "/sys/vitscale.safetensors"], "/sys/vitscale.safetensors.tmp: Permission denied"),
        "export": (["export", str(missing)], f"{missing}: no such run folder"),
        "export, non-finite weights": (["export", str(nan_run)],
                                       f"{nan_run / 'model.safetensors'}: non-finite values in head.bias: these weights are not used"),
        "bench": (["bench", "vit_nope", "--device", "cpu"], "unknown model 'vit_nope'"),
        "report": (["report", str(missing)], f"{missing}: no such run folder"),
    }
    for name, (argv, text) in cases.items():
        rc = main(argv)
        err = _err_lines(capsys)
        assert rc != 0 and 1 <= len(err) <= 2 and text in err[-1], (name, err)
        if "does not fit" in text:
            assert "missing (blocks.1.norm1.weight, blocks.1.norm1.bias, ...)" in err[-1] or "another shape" in err[-1]
        assert err[-1].startswith(f"vitscale {argv[0]}: ") and "Traceback" not in "".join(err), (name, err)

    # --debug (before or after the command) and VITSCALE_DEBUG=1: the error goes on with its traceback
    for argv, env in ((["--debug", "eval", "digits_vit", f"checkpoint.path={missing}"], "0"),
                      (["eval", "digits_vit", f"checkpoint.path={missing}", "--debug"], "0"),
                      (["eval", "digits_vit", f"checkpoint.path={missing}"], "1")):  # fmt: skip
        monkeypatch.setenv("VITSCALE_DEBUG", env)
        with pytest.raises(FileNotFoundError, match="no checkpoint at"):
            main(argv)
    res = subprocess.run([sys.executable, "-m", "vitscale", "--debug", "eval", "digits_vit", f"checkpoint.path={missing}"],
                         capture_output=True, text=True, env=ENV, timeout=300)  # fmt: skip
    assert res.returncode == 1 and res.stderr.startswith("Traceback (most recent call last)"), res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("FileNotFoundError: no checkpoint at")
