"""The run folder's lock record and the comparison a resume makes (``vitscale/run/folder.py``); the
same behaviours through the CLI are in ``tests/integration/test_run_trust.py``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from vitscale.config import Config, config_to_dict, load_config
from vitscale.run.folder import NEUTRAL, FolderInUse, RunLock, config_changes


def _changes(old: list[str], new: list[str]):
    a, b = (config_to_dict(load_config("digits_vit", o)) for o in (old, new))
    return config_changes(a, b, config_to_dict(Config()))


def test_what_counts_as_a_change():
    assert _changes([], []) == []
    # logging, evaluation, checkpoint cadence, workers, layout, kernels and paths may change freely, and
    # the teacher of label-tokens (a task group declared resume_neutral)
    harmless = ["train.log_every=3", "eval.every=10", "eval.batch_size=7", "checkpoint.every=9", "checkpoint.keep=3",
                "data.num_workers=4", "parallel.dp_shard=2", "train.sdpa=math", "train.compile=true",
                "train.output_dir=/elsewhere", "log.progress=none", "checkpoint.allow_changes=optim"]  # fmt: skip
    assert _changes([], harmless) == []
    tl = ["train.task=token_labeling", "token_label.path=labels"]  # the teacher group is token labeling's
    assert _changes(tl, tl + ["teacher.batch_size=8"]) == []
    assert {k for k, _, _ in _changes([], ["optim.lr=1e-3", "train.seed=1", "data.hflip=0.5", "train.batch_size=32",
                                           "model.hidden_size=64", "schedule.warmup_steps=3", "train.max_steps=9"])} == {
        "optim.lr", "train.seed", "data.hflip", "train.batch_size", "model.overrides.hidden_size", "schedule.warmup_steps",
        "train.max_steps"}  # fmt: skip
    assert _changes(["optim.lr=1"], ["optim.lr=1.0"]) == []  # 1 and 1.0: the same setting
    assert _changes(["model.pool=token"], []) == [("model.overrides.pool", "token", "avg")]
    # a key this vitscale adds since the run was written counts as its default
    old = config_to_dict(load_config("digits_vit"))
    del old["train"]["label_smoothing"]
    new = config_to_dict(load_config("digits_vit", ["train.label_smoothing=0.0"]))
    assert config_changes(old, new, config_to_dict(Config())) == []
    assert all(not k.startswith(("optim", "model", "data.train_path", "schedule")) for k in NEUTRAL)


def test_a_reused_pid_is_not_a_live_holder(tmp_path):
    """A record naming a live PID whose process started at another time (the PID was reused after the
    holder died) is stale: taken over."""
    lock = RunLock(tmp_path)
    record = {"host": socket.gethostname(), "pid": os.getppid(), "pid_start": 1, "started": "then"}
    (tmp_path / "run.lock").write_text(json.dumps(record))
    with lock:
        assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()
        assert RunLock.of(tmp_path) is lock and lock.acquire() is lock  # re-entrant in one process
        lock.release()
        assert lock.held
    assert not lock.held and not (tmp_path / "run.lock").exists()


def test_a_live_holder_is_named(tmp_path):
    code = ("import sys, time; from vitscale.run.folder import RunLock; RunLock(sys.argv[1]).acquire(); "
            "print('held', flush=True); time.sleep(60)")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUse, match=rf"is in use by another run \(host {socket.gethostname()}, pid {holder.pid}, started "):
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    with RunLock(tmp_path):  # gone: its record is taken over
        pass
