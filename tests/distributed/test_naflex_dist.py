"""The NaFlex ViT under FSDP2 and under tensor (+ sequence) parallelism on 2 gloo processes follows the
one-process loss curve step by step on padded NaFlex batches (masked attention, masked average and
MAP pooling, per-image position-embedding grids, sequence lengths that change every step and split
unevenly over the TP ranks)."""

from __future__ import annotations

from types import SimpleNamespace as NS

from _launch import needs_cpu_fsdp, run_distributed
from _workers import GLOBAL_BATCH, make_cfg
from helpers import assert_follow_one_process, two_rank_curves

STEPS = 4
TOL = 2e-4
MAP = {"pool": "map", "class_token_length": 0}
CASES = [
    ("fsdp", dict(dp_shard=2), {}),
    ("tp", dict(dp_shard=1, tp=2), {}),
    ("fsdp_map", dict(dp_shard=2), MAP),
    ("tp_map", dict(dp_shard=1, tp=2), MAP),
]


def naflex_batches(steps: int, seed: int = 1):
    """``steps`` NaFlex batches of GLOBAL_BATCH digits-sized images at random aspect ratios (sides 8-40
    px, patch 8), padded to a sequence length that changes from step to step; the label is the image's
    shape class (its rows), something the model can learn from its tokens."""
    import torch

    from vitscale.models.naflex import to_patch_batch

    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        sides = torch.randint(1, 6, (GLOBAL_BATCH, 2), generator=g) * 8
        images = [torch.randn(3, int(h), int(w), generator=g) for h, w in sides]
        batch = to_patch_batch(images, 8, seq_len=25 + 2 * step)  # 1 register + 25..31 patches: uneven over 2 TP ranks
        yield batch, sides[:, 0] // 8


def naflex_curve(layout: dict, overrides: dict, steps: int = STEPS) -> list[float]:
    """AdamW steps on the NaFlex batches; each data-parallel rank its slice; the global-mean loss per step."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from vitscale.distributed import init_distributed
    from vitscale.run import build_model

    dims = init_distributed(NS(**layout), "cpu")
    model = build_model("naflex_debug", dims, **make_cfg(), seed=0, init="reference", overrides=overrides)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.05)
    n = GLOBAL_BATCH // dims.dp_size
    losses = []
    for batch, y in naflex_batches(steps):
        sl = slice(dims.dp_rank * n, (dims.dp_rank + 1) * n)
        loss = F.cross_entropy(model({k: v[sl] for k, v in batch.items()}), y[sl])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.detach().clone()
        if dims.distributed:
            dist.all_reduce(value)
            value /= dims.world_size
        losses.append(value.item())
    return losses


def _curves(cases):
    return {label: naflex_curve(layout, ov) for label, layout, ov in cases}


@needs_cpu_fsdp
def test_naflex_layouts_follow_single_process_curve():
    (ref,) = run_distributed(_curves, 1, [("avg", {}, {}), ("map", {}, MAP)])
    got = two_rank_curves(_curves, CASES)
    assert sorted(got) == sorted(label for label, *_ in CASES)
    assert_follow_one_process(got, lambda label: ref["map" if label.endswith("map") else "avg"], TOL)
