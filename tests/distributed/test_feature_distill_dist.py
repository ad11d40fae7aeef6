"""Feature distillation on 2 gloo processes (vitscale.tasks.feature_distill_norm / _loss): each rank
standardises its half of the global batch, and its statistics (PHI-S and running, after the
all_reduce of the moments) are the same on both ranks and equal to one process's on the whole batch;
the teacher-dropping loss with the global count, averaged over the ranks as DDP averages gradients, is
one process's loss."""

from __future__ import annotations

import pytest
import torch
from _launch import run_distributed

pytestmark = pytest.mark.multiprocess

N, D, STEPS = 8, 12, 3  # global batch, width, batches


def _batches():
    g = torch.Generator().manual_seed(0)
    mix = torch.randn(D, D, generator=g) * torch.linspace(0.2, 4.0, D)
    return [torch.randn(N, 5, D, generator=g) @ mix.T + 1.0 for _ in range(STEPS)]  # patch tokens


def _standardise(rank: int, world: int):
    from vitscale.tasks.feature_distill_norm import FeatureStandardizer

    n = N // world
    out = {}
    for kind in ("phi_s", "running"):
        s = FeatureStandardizer(D, kind, images=2 * N).train()
        ys = [s(x[rank * n : (rank + 1) * n]) for x in _batches()]
        out[kind] = ({k: v.clone() for k, v in s.state_dict().items()}, torch.cat(ys))
    return out


def _loss(rank: int, world: int, count_global: bool):
    import torch.distributed as dist

    from vitscale.tasks.feature_distill_loss import TeacherLoss, feature_distill_loss

    g = torch.Generator().manual_seed(1)
    s = {n: {"summary": torch.randn(N, 6, generator=g)} for n in ("a", "b", "c")}
    t = {n: {"summary": torch.randn(N, 6, generator=g)} for n in ("a", "b", "c")}
    n = N // world
    sl = slice(rank * n, (rank + 1) * n)
    s = {k: {"summary": v["summary"][sl]} for k, v in s.items()}
    t = {k: {"summary": v["summary"][sl]} for k, v in t.items()}
    specs = [TeacherLoss("a"), TeacherLoss("b", weight=2.0), TeacherLoss("c")]
    index = torch.arange(N)[sl]
    count = None
    if count_global:  # the global sum of the coefficients over the ranks, per rank
        from vitscale.tasks.feature_distill_loss import drop_teachers, teacher_loss

        losses = torch.stack([teacher_loss(s[k], t[k], sp)[0] for k, sp in zip("abc", specs)])  # (T, B)
        c = drop_teachers(losses, 0.5, 3, 4, index).sum()
        if world > 1:
            dist.all_reduce(c)
        count = c / world
    loss, _ = feature_distill_loss(s, t, specs, drop=0.5, seed=3, step=4, index=index, count=count)
    return loss


def _worker():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = _standardise(rank, world)
    loss = _loss(rank, world, True)
    dist.all_reduce(loss)
    # numpy through the queue (a tensor's shared storage would outlive its process)
    plain = {kind: ({k: v.numpy() for k, v in st.items()}, y.numpy()) for kind, (st, y) in out.items()}
    return plain, float(loss / world)


def test_two_ranks_standardise_as_one_process_and_the_loss_averages_to_it():
    ranks = run_distributed(_worker, 2)
    one = _standardise(0, 1)
    for kind in ("phi_s", "running"):
        (s0, y0), (s1, y1) = ([{k: torch.from_numpy(v) for k, v in st.items()}, torch.from_numpy(y)]
                              for st, y in (ranks[0][0][kind], ranks[1][0][kind]))  # fmt: skip
        for k in s0:
            assert torch.equal(s0[k], s1[k]), (kind, k)  # the same statistics on every rank
            torch.testing.assert_close(s0[k], one[kind][0][k], atol=1e-5, rtol=1e-6, msg=f"{kind} {k}")
        assert bool(s0["frozen"]) and int(s0["seen"]) == 2 * N  # the window counts every rank's images
        ys = torch.cat([y0.reshape(STEPS, N // 2, 5, D), y1.reshape(STEPS, N // 2, 5, D)], dim=1)
        torch.testing.assert_close(ys.reshape(-1, 5, D), one[kind][1], atol=1e-4, rtol=1e-5)
    assert abs(ranks[0][1] - float(_loss(0, 1, True))) < 1e-6 and ranks[0][1] == ranks[1][1]
