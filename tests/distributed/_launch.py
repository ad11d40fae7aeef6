"""Spawn N CPU processes on gloo for a test function; results come back through a queue."""

from __future__ import annotations

import os
import socket
import traceback

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, fn, args, queue):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1",
    )  # fmt: skip
    import torch

    torch.set_num_threads(1)
    try:
        result = (rank, "ok", fn(*args))
    except BaseException:  # noqa: BLE001 - report any failure to the parent
        result = (rank, "error", traceback.format_exc())
    queue.put(result)
    queue.close()
    queue.join_thread()  # the result has reached the parent before the teardown below
    import torch.distributed as dist

    if dist.is_initialized():
        if result[1] == "ok":
            dist.barrier()  # leave together: torch 2.6's gloo could hang destroying a group whose peer had gone
        dist.destroy_process_group()


def run_distributed(fn, world_size: int = 2, *args, timeout: float = 240.0):
    """Run ``fn(*args)`` on ``world_size`` processes; returns the list of per-rank return values."""
    ctx = mp.get_context(os.environ.get("VITSCALE_TEST_START_METHOD", "fork"))
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, queue)) for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    errors = []
    try:
        for _ in range(world_size):
            rank, status, out = queue.get(timeout=timeout)
            if status == "error":
                errors.append(f"rank {rank}:\n{out}")
            results[rank] = out
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world_size)]


def _cpu_fsdp_marker():
    import pytest
    import torch

    from vitscale.distributed.fsdp import fsdp_runs_on

    return pytest.mark.skipif(
        not fsdp_runs_on("cpu"),
        reason=f"torch {torch.__version__}'s FSDP2 cannot run on CPU (no record_event on CPU streams); "
        "these layouts are checked on newer torch (CI runs the newest)",
    )


# Tests that train under FSDP2 on gloo (every multi-process training layout wraps the model in it).
needs_cpu_fsdp = _cpu_fsdp_marker()
