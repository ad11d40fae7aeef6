"""VOLO under FSDP and tensor parallelism on 2 gloo processes follows the one-process loss curve.

The stem's BatchNorm is run with its running statistics (``eval()``, which also disables
drop-path) so that splitting the batch over data-parallel ranks does not change the statistics;
the token-labeling (dense) outputs are trained, so the aux head and class head both get gradients.
"""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch
import torch.nn.functional as F
from _launch import needs_cpu_fsdp
from helpers import assert_follow_one_process, two_rank_curves

pytestmark = pytest.mark.multiprocess

STEPS = 4
BATCH = 8
OVERRIDES = dict(qkv_bias=True)  # volo_debug: outlook heads 2, heads 4, MLP 96 / 192


def volo_curve(layout: dict, steps: int = STEPS, ac: str = "none"):
    import torch.distributed as dist

    from vitscale.distributed import init_distributed
    from vitscale.distributed.config import ParallelConfig, PrecisionConfig
    from vitscale.run import build_model

    dims = init_distributed(NS(**layout), "cpu")
    parallel = ParallelConfig(activation_checkpointing=ac)
    precision = PrecisionConfig(param_dtype="float32", reduce_dtype="float32")
    model = build_model("volo_debug", dims, parallel=parallel, precision=precision, seed=0, init="reference", overrides=OVERRIDES).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    g = torch.Generator().manual_seed(1)
    n = BATCH // dims.dp_size
    losses = []
    for _ in range(steps):
        x = torch.randn(BATCH, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (BATCH,), generator=g)
        sl = slice(dims.dp_rank * n, (dims.dp_rank + 1) * n)
        cls, tok = model(x[sl], dense=True)
        loss = F.cross_entropy(cls, y[sl]) + 0.5 * F.cross_entropy(tok.flatten(0, 2), y[sl].repeat_interleave(16))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.detach().clone()
        if dims.distributed:
            dist.all_reduce(value)
            value /= dims.world_size
        losses.append(value.item())
    return losses


def layouts():
    return {
        "fsdp": volo_curve(dict(dp_shard=2)),
        "tp": volo_curve(dict(dp_shard=1, tp=2)),
        "tp_full_ac": volo_curve(dict(dp_shard=1, tp=2), ac="full"),
    }


@needs_cpu_fsdp
def test_volo_fsdp_and_tp_follow_single_process_curve():
    assert_follow_one_process(two_rank_curves(layouts), volo_curve({}))
