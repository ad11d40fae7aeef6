"""Non-finite steps on 2 FSDP2 ranks (gloo): a NaN batch on rank 1 only stops the update on both
ranks together — weights, optimizer state and EMA stay as they were on each rank's shards — with the
fused optimizer (skipped on the device through ``found_inf``, here CPU fused kernels on DTensor
shards) and with the foreach one (the host reads the all-reduced flag)."""

from __future__ import annotations

import pytest
from _launch import needs_cpu_fsdp, run_distributed

pytestmark = pytest.mark.multiprocess


def _ranks(out: str, fused: str) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from vitscale.config import load_config
    from vitscale.train.trainer import Trainer

    cfg = load_config("digits_vit", [
        "data.num_workers=0", "log.flops=false", "log.progress=none", "model.num_layers=1", "train.batch_size=8",
        "train.ema_decay=0.9", f"optim.fused={fused}", "parallel.dp_shard=2", f"train.output_dir={out}",
    ])  # fmt: skip
    t = Trainer(cfg)
    rank = dist.get_rank()

    def local(x):
        return (x.to_local() if isinstance(x, DTensor) else x).detach().clone()

    def snapshot():
        return ([local(p) for p in t.model.parameters()], [local(p) for p in t.ema.module.parameters()],
                [local(v) for s in t.optimizer.state.values() for v in s.values()])  # fmt: skip

    loader = t._batches()
    t.step = 1
    t.train_step(loader)  # a good step: optimizer state exists
    before = snapshot()
    batch = next(loader)
    if rank == 1:  # only this rank's data is bad
        batch = {**batch, "image": torch.full_like(batch["image"], float("nan"))}
    t.step = 2
    t.train_step(iter([batch]))
    after = snapshot()
    same = all(torch.equal(a, b) for xs, ys in zip(before, after) for a, b in zip(xs, ys))
    t.step = 3
    t.train_step(loader)  # and the next good step is applied again
    later = snapshot()
    moved = not any(torch.equal(a, b) for xs, ys in zip(after[:2], later[:2]) for a, b in zip(xs, ys) if a.numel() > 1)
    total = t.guard.check(3, None)
    t.close()
    return {"unchanged": same, "moved_after": moved, "nonfinite": total, "on_device": t.skip_on_device}


def _both(out: str) -> list[dict]:
    return [_ranks(f"{out}/{fused}", fused) for fused in ("fused", "foreach")]


@needs_cpu_fsdp
def test_nan_on_one_rank_skips_the_step_on_both(tmp_path):
    for rank in run_distributed(_both, 2, str(tmp_path)):
        for r, fused in zip(rank, ("fused", "foreach")):
            assert r == {"unchanged": True, "moved_after": True, "nonfinite": 1, "on_device": fused == "fused"}, (fused, r)
