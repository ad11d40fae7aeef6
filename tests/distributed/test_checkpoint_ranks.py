"""Checkpoints on 2 gloo processes: each rank writes and checksums its own shard files; a damaged file
of one rank makes both ranks skip that checkpoint together; a save failing on one rank fails on
both, removes the partial folder and keeps the older checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from _launch import run_distributed

pytestmark = pytest.mark.multiprocess


def _ranks(root: str) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from vitscale.checkpoint import Checkpointer, SaveError
    from vitscale.checkpoint.integrity import read_sealed_json

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,))
    root = Path(root)
    ck = Checkpointer(root, keep=5)

    def state(step):
        torch.manual_seed(step)
        return {"model": {"w": distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)]), "b": torch.full((3,), float(step))}}

    for step in (1, 2):
        ck.save(step, state(step), {"step": step, "data": {}})
    out = {"manifest": sorted(read_sealed_json(root / "step_00000002" / f"files-rank0000{rank}.json", 1 << 20)["files"])}
    dist.barrier()
    if rank == 0:  # damage rank 1's weights in the newest checkpoint
        f = root / "step_00000002" / "model-rank00001.safetensors"
        data = bytearray(f.read_bytes())
        data[-8:] = b"\xff" * 8
        f.write_bytes(bytes(data))
    dist.barrier()
    fresh = Checkpointer(root)
    out["latest"] = fresh.latest().name
    target = {"model": {"w": distribute_tensor(torch.zeros(8, 4), mesh, [Shard(0)]), "b": torch.zeros(3)}}
    out["step"] = fresh.load(fresh.latest(), target)["step"]
    out["w_ok"] = bool(torch.equal(target["model"]["w"].full_tensor(), state(1)["model"]["w"].full_tensor()))

    bad = state(3)
    if rank == 1:  # only rank 1 holds a tensor safetensors cannot store
        bad["zz"] = {"c": torch.zeros(2, dtype=torch.complex64)}
    try:
        ck.save(3, bad, {"step": 3, "data": {}})
        out["error"] = None
    except SaveError as e:
        out["error"] = str(e)
    dist.barrier()
    out["left"] = sorted(p.name for p in root.iterdir())
    return out


def test_ranks_checksum_skip_and_fail_together(tmp_path):
    r0, r1 = run_distributed(_ranks, 2, str(tmp_path))
    assert r0["manifest"] == ["model-rank00000.safetensors", "rng_rank0.json", "trainer_state.json"]
    assert r1["manifest"] == ["model-rank00001.safetensors", "rng_rank1.json"]  # each rank lists its own files
    assert r0["latest"] == r1["latest"] == "step_00000001"  # rank 1's damaged file: both skip step 2
    assert r0["step"] == r1["step"] == 1 and r0["w_ok"] and r1["w_ok"]
    for r in (r0, r1):
        assert r["error"] and "\n" not in r["error"] and "step_00000003" in r["error"] and "complex64" in r["error"], r["error"]
        assert r["left"] == ["step_00000001", "step_00000002"]  # no .tmp-step_00000003 left
