"""Many nodes, simulated on localhost: two torchrun "nodes" (``--nnodes 2 --node-rank 0|1
--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT``, gloo) train ``digits_vit`` as one job.

- HSDP (``dp_replicate=2 dp_shard=2``, two processes per node) and TP inside a node with FSDP across
  follow the one-process loss curve (the layout tests' tolerance); a worker killed mid-run under
  ``--max-restarts 1``: torchrun restarts both nodes' workers, which resume from the newest checkpoint.
- FSDP across the node boundary: SIGUSR1 sent to one rank only stops both after the same step with a
  checkpoint; a node killed outright: the other exits within a bounded time with a one-line reason;
  started again, the job resumes and ends on the one-process curve.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _launch import free_port, needs_cpu_fsdp
from helpers import read_losses

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, needs_cpu_fsdp]

STEPS = 6
TOL = 2e-4  # as tests/distributed/test_dist_trainer.py
ARGS = [
    f"train.max_steps={STEPS}", "train.epochs=0", "train.log_every=1", "train.batch_size=8", "model.num_layers=2",
    "schedule.name=constant", "schedule.warmup_steps=0", "log.progress=plain", "eval.every=0", "checkpoint.every=2",
    "checkpoint.keep=5", "checkpoint.export_safetensors=false", "log.flops=false", "log.report=false", "log.tensorboard=false",
]  # fmt: skip


def _close(got: dict[int, float], ref: dict[int, float], label: str) -> None:
    assert sorted(got) == sorted(ref), f"{label}: logged steps {sorted(got)}"
    for s in ref:
        assert abs(got[s] - ref[s]) / abs(ref[s]) <= TOL, f"{label} step {s}: {got[s]} vs one process {ref[s]}"


class Job:
    """Two torchrun nodes of one job on localhost, each in a session of its own (a "machine")."""

    def __init__(self, out: Path, nproc: int, *extra: str, restarts: int = 0):
        port, self.out, self.nodes = free_port(), out, []
        # each restart's workers on a store of their own: a store shared with the rendezvous is keyed by each
        # agent's own restart count, which differs between the nodes (pytorch/pytorch#135712)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        for node in (0, 1):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", str(nproc),
                   "--node-rank", str(node), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                   "--rdzv-id", "two_nodes", "--max-restarts", str(restarts), "-m", "vitscale", "train", "digits_vit",
                   *ARGS, f"train.output_dir={out}", *extra]  # fmt: skip
            log = open(out.parent / f"{out.name}-node{node}-{time.monotonic_ns()}.log", "w+")  # noqa: SIM115
            self.nodes.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True), log))
            time.sleep(0.5)  # node 0's agent hosts the rendezvous store

    def wait_for(self, path: Path, timeout: float = 240) -> None:
        deadline = time.time() + timeout
        while not path.exists():
            assert time.time() < deadline and all(p.poll() is None for p, _ in self.nodes), f"no {path}:\n{self.logs()}"
            time.sleep(0.1)

    def workers(self, node: int) -> dict[int, int]:
        """{global rank: pid} of the node's training processes (its agent's children)."""
        agent = self.nodes[node][0].pid
        found = {}
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == agent:
                    env = dict(kv.split("=", 1) for kv in (d / "environ").read_text().split("\0") if "=" in kv)
                    found[int(env["RANK"])] = int(d.name)
            except (OSError, KeyError, ValueError, IndexError):
                continue
        return found

    def wait(self, timeout: float = 300) -> list[int]:
        return [p.wait(timeout=timeout) for p, _ in self.nodes]

    def logs(self, tail: int = 4000) -> str:
        out = []
        for node, (_, f) in enumerate(self.nodes):
            f.flush()
            f.seek(0)
            out.append(f"--- node {node}:\n{f.read()[-tail:]}")
        return "\n".join(out)


_REFERENCE: dict[int, float] = {}  # the one-process curve, the same for both tests: trained once


def _reference(out: Path) -> dict[int, float]:
    from vitscale.config import load_config
    from vitscale.train import train

    if not _REFERENCE:
        train(load_config("digits_vit", ARGS + [f"train.output_dir={out}", "log.progress=none"]))
        _REFERENCE.update(read_losses(out))
    return dict(_REFERENCE)


def test_hsdp_and_tp_across_two_nodes_restarts_resume(tmp_path):
    hsdp = Job(tmp_path / "hsdp", 2, "parallel.dp_replicate=2", "parallel.dp_shard=2", "checkpoint.async_mode=async_pinned",
               restarts=1)  # fmt: skip
    ref = _reference(tmp_path / "one")  # meanwhile
    assert max(ref.values()) - min(ref.values()) > 0.02, "the curve must move for the comparison to mean something"
    hsdp.wait_for(tmp_path / "hsdp" / "checkpoints" / "step_00000002")
    victim = hsdp.workers(1)
    assert len(victim) == 2, hsdp.logs()
    os.kill(next(iter(victim.values())), signal.SIGKILL)  # a worker dies; both agents restart their workers
    assert hsdp.wait() == [0, 0], hsdp.logs()
    logs = hsdp.logs()
    assert f"resumed from {tmp_path / 'hsdp' / 'checkpoints'}/step_0000000" in logs and "lost contact with another rank" in logs, logs
    _close(read_losses(tmp_path / "hsdp"), ref, "HSDP 2x2 over two nodes, restarted")
    summary = json.loads((tmp_path / "hsdp" / "summary.json").read_text())
    assert len(summary["segments"]) == 2 and summary["env"]["layout"]["dp_replicate"] == 2

    tp = Job(tmp_path / "tp", 2, "parallel.tp=2", "parallel.dp_shard=2")  # TP inside each node, FSDP across
    assert tp.wait() == [0, 0], tp.logs()
    _close(read_losses(tmp_path / "tp"), ref, "TP in a node x FSDP across")


def test_a_signal_to_one_rank_and_a_lost_node_then_resume(tmp_path):
    out = tmp_path / "fsdp"
    ref = _reference(tmp_path / "one")  # first: trained beside the job, it let the job finish before the signal
    job = Job(out, 1, "checkpoint.every=0")
    job.wait_for(out / "metrics.jsonl")
    (rank, pid), = job.workers(1).items()
    os.kill(pid, signal.SIGUSR1)  # the signal reaches one rank only
    codes = job.wait()
    logs = job.logs(tail=10**7)
    assert codes != [0, 0] and logs.count("SIGUSR1 received") == 1, logs[-8000:]
    line = next(x for x in logs.splitlines() if x.startswith("vitscale train: stopped by SIGUSR1 after step "))
    stopped = int(line.split("after step ")[1].split(";")[0])
    assert (out / "checkpoints" / f"step_{stopped:08d}").is_dir() and stopped < STEPS  # one checkpoint, both ranks' shards
    assert (out / "checkpoints" / f"step_{stopped:08d}" / "model-rank00001.safetensors").is_file()

    job = Job(out, 1)  # started again: resumes; then one node is lost outright, mid-step
    deadline = time.time() + 240
    while len(read_losses(out)) <= stopped:  # the first step after the resume is logged (metrics.jsonl was cut back to it)
        assert time.time() < deadline and all(p.poll() is None for p, _ in job.nodes), job.logs()
        time.sleep(0.02)
    machine = [job.nodes[1][0].pid, *job.workers(1).values()]  # torchrun starts each worker in a session of its own
    for pid in machine:
        os.killpg(pid, signal.SIGSTOP)  # the machine freezes (its peer now waits in a collective) ...
    seen = sorted(read_losses(out))
    time.sleep(1)
    t0 = time.time()
    for pid in machine:
        os.killpg(pid, signal.SIGKILL)  # ... and is gone: its agent and its worker
    try:
        code = job.nodes[0][0].wait(timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"steps logged when frozen: {seen}, stopped at {stopped}\n{job.logs()}") from None
    took = time.time() - t0
    logs = job.logs()
    assert code != 0 and took < 90, logs  # no hang: it ends, and says why
    reasons = [x for x in logs.split("--- node 1:")[0].splitlines() if x.startswith("vitscale train: ")]
    assert len(reasons) == 1 and reasons[0].startswith("vitscale train: lost contact with another rank ("), logs

    job = Job(out, 1)  # the job started again: resumes from the newest intact checkpoint and finishes
    assert job.wait() == [0, 0], job.logs()
    assert "resumed from " in job.logs()
    _close(read_losses(out), ref, "FSDP across two nodes, stopped twice")
    segments = json.loads((out / "summary.json").read_text())["segments"]  # the lost node's steps after its last
    assert segments[0]["end_step"] == stopped and segments[0]["ended"] == "SIGUSR1"  # checkpoint are trained again
    assert segments[-1]["end_step"] == STEPS and all(a["end_step"] == b["start_step"] for a, b in zip(segments, segments[1:]))
