"""Asynchronous checkpoints (``checkpoint.async_mode``): the state as it was at the save, whatever the
loop does to it afterwards; the next save waits for the previous; a background failure is the
synchronous save's one-line error with its partial folder removed; NaN refused; a process killed during
the background write leaves the previous checkpoint the newest intact one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from vitscale.checkpoint import Checkpointer, NonFiniteWeights, SaveError, list_checkpoints
from vitscale.checkpoint.storage import read_full, read_index


def _state(step: float) -> dict:
    return {"model": {"w": torch.full((64, 64), step), "b": torch.arange(8.0) + step}, "optim": {"n": torch.tensor(int(step))}}


@pytest.mark.parametrize("mode", ["async", "async_pinned"])
def test_the_state_at_the_save_whatever_happens_next(tmp_path, mode):
    ck = Checkpointer(tmp_path, keep=2, async_mode=mode)
    live = _state(1.0)
    for step in (1, 2, 3):
        assert ck.save(step, live, {"step": step, "data": {}}) is None  # staged; written in the background
        assert ck.pending is not None and ck.pending.step == step
        for t in (live["model"]["w"], live["model"]["b"]):
            t.add_(100.0)  # the optimizer changes the live tensors at once
    assert ck.wait().name == "step_00000003" and ck.pending is None
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]  # keep=2, pruned once written
    assert not list(tmp_path.glob(".tmp-*"))
    for step in (2, 3):
        path = tmp_path / f"step_{step:08d}"
        got = read_full(path, read_index(path), ["model.w", "model.b"])
        assert torch.equal(got["model.w"], torch.full((64, 64), 1.0 + 100 * (step - 1)))  # as it was at the save
    # a resume path reads it like any checkpoint (checksums verified)
    fresh = _state(0.0)
    assert Checkpointer(tmp_path).load(ck.root / "step_00000003", fresh)["step"] == 3
    assert torch.equal(fresh["model"]["b"], torch.arange(8.0) + 201.0)


def test_background_failures_are_the_synchronous_errors(tmp_path):
    ck = Checkpointer(tmp_path, keep=3, async_mode="async")
    ck.save(1, _state(1.0), {"step": 1, "data": {}})
    ck.wait()
    bad = _state(2.0)
    bad["model"]["w"][3, 3] = float("nan")
    ck.save(2, bad, {"step": 2, "data": {}})
    with pytest.raises(NonFiniteWeights, match=r"not saving checkpoint .*step_00000002: non-finite values in model\.w.*older checkpoints"):
        ck.wait()
    odd = _state(3.0)
    odd["model"]["q"] = torch.zeros(2, dtype=torch.complex64)  # a dtype safetensors cannot hold: fails in the write
    ck.save(3, odd, {"step": 3, "data": {}})
    with pytest.raises(SaveError, match=r"could not save checkpoint .*step_00000003: .*partial files were removed"):
        ck.wait()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1] and not list(tmp_path.glob(".tmp-*"))


def test_killed_during_the_background_write_keeps_the_previous_checkpoint(tmp_path):
    """A process killed (SIGKILL) while its checkpoint is written in the background: the folder is still
    ``.tmp-step_…`` (renamed only once sealed), the next run removes it and resumes the previous one."""
    script = textwrap.dedent(f"""
        import sys, threading, time, torch
        import vitscale.checkpoint.storage as storage
        from vitscale.checkpoint import Checkpointer
        write = storage.write_safetensors
        lock = threading.Lock()
        def say(word):  # two threads print: each line whole (print writes the text and its newline apart)
            with lock:
                sys.stdout.write(word + "\\n"); sys.stdout.flush()
        def slow(*a, **k):  # the background write of step 2 stalls half way (the test kills the process there)
            out = write(*a, **k)
            if ".tmp-step_00000002" in str(a[0]):
                say("writing")
                time.sleep(60)
            return out
        storage.write_safetensors = slow
        ck = Checkpointer({str(tmp_path)!r}, keep=3, async_mode="async")
        state = {{"model": {{"w": torch.ones(256, 256)}}}}
        ck.save(1, state, {{"step": 1, "data": {{}}}}); ck.wait()
        ck.save(2, state, {{"step": 2, "data": {{}}}})
        say("staged")
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    seen = [p.stdout.readline().strip() for _ in range(2)]
    assert sorted(seen) == ["staged", "writing"], seen  # the loop went on while the write was under way
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert (tmp_path / ".tmp-step_00000002").is_dir() and not (tmp_path / "step_00000002").exists()
    assert Checkpointer(tmp_path).latest().name == "step_00000001"  # the newest intact one
    assert not (tmp_path / ".tmp-step_00000002").exists()
