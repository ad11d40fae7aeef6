"""CLIP under FSDP (both towers, one unit per block) and tensor parallelism on 2 gloo processes
follows the one-process loss curve (the InfoNCE loss spans the whole data-parallel batch), and the
evaluation embeddings (gathered over ranks in dataset order) equal the one-process ones."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch
from _launch import needs_cpu_fsdp
from helpers import assert_follow_one_process, two_rank_curves

pytestmark = pytest.mark.multiprocess

STEPS = 3
BATCH = 8
OVERRIDES = dict(text={"encoder_seq_length": 16})


def clip_curve(layout: dict, local_loss: bool = False):
    import torch.distributed as dist

    from vitscale.distributed import init_distributed
    from vitscale.distributed.config import ParallelConfig, PrecisionConfig
    from vitscale.run import build_model
    from vitscale.tasks.contrastive_loss import ClipLoss

    dims = init_distributed(NS(**layout), "cpu")
    parallel = ParallelConfig(activation_checkpointing="none")
    precision = PrecisionConfig(param_dtype="float32", reduce_dtype="float32")
    model = build_model("clip_debug", dims, parallel=parallel, precision=precision, seed=0, init="reference", overrides=OVERRIDES)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    group = dims.dp_group()  # tp: the data-parallel group of one rank (both ranks of the replica hold the batch)
    assert group is None or dist.get_world_size(group) == dims.dp_size
    model._test_dp_group = group
    loss_fn = ClipLoss(local_loss=local_loss, group=group)
    g = torch.Generator().manual_seed(1)
    n = BATCH // dims.dp_size
    losses = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, 3, 32, 32, generator=g)
        t = torch.randint(1, 49000, (BATCH, 16), generator=g)
        t[:, -1] = 49407  # end of text
        sl = slice(dims.dp_rank * n, (dims.dp_rank + 1) * n)
        img, txt, scale = model(x[sl], t[sl])
        loss = loss_fn(img, txt, scale)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.detach().clone()
        if dims.distributed:
            dist.all_reduce(value)
            value /= dims.world_size
        losses.append(value.item())
    return losses + _eval_checksums(model, dims)


def _eval_checksums(model, dims):
    """Zero-shot style evaluation through the sharded model: this rank's strided shard of 10 pairs,
    embeddings gathered in dataset order; returns a checksum of them and the retrieval recall@1."""
    from vitscale.eval.retrieval import retrieval_recall
    from vitscale.eval.zeroshot import collect_embeddings

    g = torch.Generator().manual_seed(2)
    x = torch.randn(10, 3, 32, 32, generator=g)
    t = torch.randint(1, 49000, (10, 16), generator=g)
    t[:, -1] = 49407
    mine = list(range(dims.dp_rank, 10, dims.dp_size))
    loader = [
        {"image": x[mine[i : i + 3]], "text": t[mine[i : i + 3]], "label": torch.zeros(len(mine[i : i + 3]), dtype=torch.long),
         "index": torch.tensor(mine[i : i + 3])}
        for i in range(0, len(mine), 3)
    ]  # fmt: skip
    emb = collect_embeddings(model, loader, "cpu", group=getattr(model, "_test_dp_group", None))
    w = torch.arange(1, 11, dtype=torch.float32).unsqueeze(1)
    r = retrieval_recall(emb["image"], emb["text"])
    return [
        float((emb["image"] * w).sum()),
        float((emb["text"] * w).sum()),
        r["text_retrieval_recall@1"] + 1.0,
    ]


def layouts():
    return {
        "fsdp": clip_curve(dict(dp_shard=2)),
        "fsdp_local_loss": clip_curve(dict(dp_shard=2), local_loss=True),
        "tp": clip_curve(dict(dp_shard=1, tp=2)),
    }


@needs_cpu_fsdp
def test_clip_fsdp_and_tp_follow_single_process_curve():
    ref = clip_curve({})
    assert abs(ref[STEPS - 1] - ref[0]) > 1e-3  # training moves the loss
    assert_follow_one_process(two_rank_curves(layouts), ref)
