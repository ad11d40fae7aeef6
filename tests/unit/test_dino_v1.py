"""DINO v1 (Caron et al. 2021, arXiv 2104.14294; facebookresearch/dino ``main_dino.py``) against its
formulas, written out here in float64 from the paper and the reference's documented behaviour: the
centred, sharpened teacher and its momentum centre, the multi-crop cross-entropy and its term count, the
three forms of the prototypes' layer (DINO v1's ``norm_last_layer``, DINOv2's weight norm, DINOv3's plain
linear layer), the batch-normalised head, and the gradient clipping of each parameter (DINO v1) or of
each part (DINOv2 / DINOv3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vitscale.distributed.utils import clip_grad_norms_, grad_norms
from vitscale.tasks.dino_config import DinoConfig
from vitscale.tasks.dino_head import DinoHead
from vitscale.tasks.dino_loss import dino_loss, softmax_centered, update_center
from vitscale.train.nonfinite import clip_gradients


def _t(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def _softmax(a, axis=-1):
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _v1_step(student_crops, teacher_global, centre, t_temp, s_temp=0.1, m=0.9):
    """One DINO v1 loss and centre update, from the paper's Algorithm 1 and section 3.1: the teacher's
    targets ``softmax((t - C) / tau_t)`` of the 2 global crops, every (teacher crop, student crop) pair
    of different views, ``-sum P_t log P_s`` averaged over the batch, the mean over the pairs; then
    ``C <- m C + (1 - m) mean(t)`` over the teacher's rows of both crops."""
    targets = [_softmax((t - centre) / t_temp) for t in teacher_global]
    total, terms = 0.0, 0
    for iq, q in enumerate(targets):
        for v, s in enumerate(student_crops):
            if v == iq:
                continue
            log_p = s / s_temp - np.log(np.exp(s / s_temp).sum(axis=1, keepdims=True))
            total += float(-(q * log_p).sum(axis=1).mean())
            terms += 1
    new_centre = m * centre + (1 - m) * np.concatenate(teacher_global).mean(axis=0, keepdims=True)
    return total / terms, new_centre


@pytest.mark.parametrize("n_local", [2, 8])
def test_the_centred_teacher_and_the_loss_are_dino_v1s_number_for_number(n_local):
    b, k, t_temp = 6, 11, 0.04
    t_glob = [_t(b, k, seed=s, scale=0.7).numpy() for s in (1, 2)]
    s_crops = [_t(b, k, seed=10 + s).numpy() for s in range(2 + n_local)]
    centre = _t(1, k, seed=3, scale=0.1).numpy()
    want_loss, want_centre = _v1_step(s_crops, t_glob, centre, t_temp)

    c = torch.tensor(centre, dtype=torch.float32)
    teacher = torch.tensor(np.concatenate(t_glob), dtype=torch.float32)
    targets = softmax_centered(teacher, c, t_temp)  # dino.centering: softmax (before the centre moves)
    update_center(c, teacher, 0.9)  # dino.center_momentum 0.9 (main_dino.py line 366)
    s = [torch.tensor(x, dtype=torch.float32) for x in s_crops]
    got = dino_loss(s[:2], s[2:], [targets[:b], targets[b:]], 0.1)
    assert float(got) == pytest.approx(want_loss, rel=1e-5)
    np.testing.assert_allclose(c.double().numpy(), want_centre, rtol=1e-6, atol=1e-7)


def test_without_local_crops_dinov2s_term_count_is_a_third_more_than_dino_v1s():
    """DINO v1 averages its 2 pairs; DINOv2 (and vitscale) divide by 3 at 0 local crops (its line 147)."""
    b, k = 5, 7
    t_glob = [_t(b, k, seed=s, scale=0.5).numpy() for s in (4, 5)]
    s_crops = [_t(b, k, seed=s).numpy() for s in (6, 7)]
    want, _ = _v1_step(s_crops, t_glob, np.zeros((1, k)), 0.04)
    targets = [softmax_centered(torch.tensor(t, dtype=torch.float32), torch.zeros(1, k), 0.04) for t in t_glob]
    got = dino_loss([torch.tensor(x, dtype=torch.float32) for x in s_crops], [], targets, 0.1)
    assert float(got) == pytest.approx(want * 2 / 3, rel=1e-5)


def _gelu(a):
    return 0.5 * a * (1 + np.vectorize(math.erf)(a / math.sqrt(2)))


def _mlp(head, x, bn: bool):
    """The head's MLP in float64 from its weights: Linear, [BatchNorm over the batch, biased variance,
    eps 1e-5], GELU (exact), ..., Linear to the bottleneck."""
    layers = [m for m in head.mlp if isinstance(m, torch.nn.Linear)]
    norms = [m for m in head.mlp if isinstance(m, torch.nn.BatchNorm1d)]
    h = x
    for i, lin in enumerate(layers):
        h = h @ lin.weight.double().detach().numpy().T + lin.bias.double().detach().numpy()
        if i < len(layers) - 1:
            if bn:
                w, beta = norms[i].weight.double().detach().numpy(), norms[i].bias.double().detach().numpy()
                h = (h - h.mean(axis=0)) / np.sqrt(h.var(axis=0) + 1e-5) * w + beta
            h = _gelu(h)
    return h / np.linalg.norm(h, axis=1, keepdims=True)


@pytest.mark.parametrize("last", ["normalized", "weight_norm", "linear"])
@pytest.mark.parametrize("bn", [False, True])
def test_the_head_is_dino_v1s_mlp_and_the_prototypes_each_references_form(last, bn):
    torch.manual_seed(0)
    head = DinoHead(12, 9, nlayers=3, hidden_dim=16, bottleneck_dim=5, last_layer=last, use_bn=bn).double()
    if last == "weight_norm":
        with torch.no_grad():
            head.last_g.copy_(torch.linspace(0.5, 2.0, 9, dtype=torch.float64)[:, None])  # g trains: any value
    x = _t(10, 12, seed=1).numpy()
    z = _mlp(head, x, bn)
    v = head.last_v.detach().numpy()
    if last == "linear":  # DINOv3: a plain linear layer
        w = v
    else:  # W = g V / ||V||: g held at 1 (DINO v1's norm_last_layer), or trained (DINOv2)
        g = head.last_g.detach().numpy() if last == "weight_norm" else 1.0
        w = g * v / np.linalg.norm(v, axis=1, keepdims=True)
    got = head(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(got, z @ w.T, rtol=1e-10, atol=1e-12)
    trained = {n for n, q in head.named_parameters() if q.requires_grad}
    assert ("last_g" in trained) == (last == "weight_norm")
    assert ("last_g" in dict(head.named_parameters())) == (last != "linear")
    assert sum(isinstance(m, torch.nn.BatchNorm1d) for m in head.mlp) == (2 if bn else 0)


def test_the_prototypes_start_as_each_reference_draws_them():
    torch.manual_seed(0)
    lin = DinoHead(8, 4096, nlayers=2, hidden_dim=8, bottleneck_dim=64, last_layer="linear").last_v.detach()
    assert float(lin.std()) == pytest.approx(0.02, rel=0.02) and abs(float(lin.mean())) < 1e-3  # trunc_normal_(std=0.02)
    wn = DinoHead(8, 4096, nlayers=2, hidden_dim=8, bottleneck_dim=64, last_layer="normalized").requires_grad_(False)
    bound = 1 / math.sqrt(64)  # nn.Linear's default (kaiming_uniform, a = sqrt 5): U(-1/sqrt(in), 1/sqrt(in))
    assert float(wn.last_v.abs().max()) <= bound and float(wn.last_v.abs().max()) > 0.95 * bound
    assert torch.equal(wn.last_g, torch.ones(4096, 1))
    assert torch.allclose(wn.weight().norm(dim=1), torch.ones(4096))  # unit prototypes


def test_the_head_keys_are_refused_in_one_line():
    with pytest.raises(ValueError, match="head_last_layer='wn'.*weight_norm, normalized, linear"):
        DinoConfig(head_last_layer="wn")
    with pytest.raises(ValueError, match="head_use_bn=true with iBOT"):
        DinoConfig(head_use_bn=True)
    assert DinoConfig(head_use_bn=True, ibot_loss_weight=0).head_use_bn


def _params(*shapes, seed=0):
    out = []
    for i, s in enumerate(shapes):
        p = torch.nn.Parameter(torch.zeros(s))
        p.grad = _t(*s, seed=seed + i, scale=3.0).float()
        out.append(p)
    return out


def test_each_parameter_and_each_part_is_clipped_on_its_own():
    shapes = [(4, 3), (5,), (2, 2, 2), (7,)]
    params = _params(*shapes)
    raw = [p.grad.double().numpy().copy() for p in params]
    np.testing.assert_allclose(grad_norms(params).double().numpy(), [np.linalg.norm(g) for g in raw], rtol=1e-6)
    clip = 3.0
    # DINO v1 (utils.clip_gradients): each gradient times min(1, clip / (||g|| + 1e-6))
    norm, scale = clip_gradients(params, clip, world=1, fold=True, groups=torch.arange(4))
    assert scale is None  # scaled in place, not folded into the fused kernels
    want = [g * min(1.0, clip / (np.linalg.norm(g) + 1e-6)) for g in raw]
    for p, w in zip(params, want, strict=True):
        np.testing.assert_allclose(p.grad.double().numpy(), w, rtol=1e-6)
    assert float(norm) == pytest.approx(math.sqrt(sum((g**2).sum() for g in raw)), rel=1e-6)  # the global norm, logged
    assert all(np.linalg.norm(p.grad.double().numpy()) <= clip + 1e-5 for p in params)
    # DINOv2 / DINOv3: each part (here params 0-1 and 2-3) by its own norm
    params = _params(*shapes)
    clip_grad_norms_(params, torch.tensor([0, 0, 1, 1]), clip)
    for part in ((0, 1), (2, 3)):
        n = math.sqrt(sum((raw[i] ** 2).sum() for i in part))
        for i in part:
            np.testing.assert_allclose(params[i].grad.double().numpy(), raw[i] * min(1.0, clip / (n + 1e-6)), rtol=1e-6)


def test_a_batch_normalised_head_is_refused_under_torchrun_in_one_line():
    from vitscale.config import load_config
    from vitscale.distributed.parallel_dims import ParallelDims
    from vitscale.errors import CheckError
    from vitscale.run.assemble import resolve_run_model
    from vitscale.run.checks import check_run

    cfg = load_config("digits_dino", ["dino.head_use_bn=true", "dino.ibot_loss_weight=0"])
    model = resolve_run_model(cfg)
    with pytest.raises(CheckError, match=r"^dino.head_use_bn=true on 2 processes: DINO v1 synchronises .*SyncBatchNorm"):
        check_run(cfg, ParallelDims(dp_shard=2, world_size=2), "train", model)
    check_run(cfg, ParallelDims(), "train", model)  # one process: accepted


@pytest.mark.parametrize("scope", ["part", "parameter"])
def test_the_trainer_clips_each_dino_head_and_the_backbone_or_each_parameter_apart(tmp_path, scope):
    """A step of DINO v1's head (batch-normalised, DINOv3's plain prototypes here, 2 local crops): the
    trainer's groups for ``train.grad_clip_scope`` are the backbone and the DINO head (``part``) or each
    parameter; after its clipping each group's gradient norm is ``min(raw, clip)``. The teacher's head
    normalises by the batch (train mode), its backbone runs in eval mode."""
    from vitscale.config import load_config
    from vitscale.train.trainer import Trainer

    cfg = load_config("digits_dino", [
        "data.num_workers=0", "log.flops=false", "checkpoint.every=0", "eval.every=0", "log.progress=none",
        "train.device=cpu", "model.num_layers=1", "train.batch_size=8", "dino.head_n_prototypes=32",
        "dino.head_hidden_dim=32", "dino.head_bottleneck_dim=16", "dino.ibot_loss_weight=0", "dino.head_use_bn=true",
        "dino.head_last_layer=linear", "dino.local_crops_number=2", "train.grad_clip=0.01",
        f"train.grad_clip_scope={scope}", f"train.output_dir={tmp_path / 'run'}"])  # fmt: skip
    t = Trainer(cfg)
    try:
        t.step = 1
        t.forward_backward(t._to_device(next(t._batches())), 0)
        teacher = t.task.teacher
        assert teacher["head"].training and not teacher["backbone"].training
        params = [p for p in t.module.parameters() if p.grad is not None]
        groups = t._clip_groups(params)
        parts = t.module.clip_parts()
        assert len(parts) == 2 and parts[1] is t.task.student.head  # no iBOT head here
        if scope == "part":
            where = {id(q): i for i, m in enumerate(parts) for q in m.parameters()}
            assert groups.tolist() == [where[id(q)] for q in params] and set(groups.tolist()) == {0, 1}
        else:
            assert groups.tolist() == list(range(len(params)))
        raw = {}
        for g, q in zip(groups.tolist(), params, strict=True):
            raw[g] = raw.get(g, 0.0) + float(q.grad.double().square().sum())
        clip_gradients(params, 0.01, world=1, fold=t.skip_on_device, groups=groups)
        after = {}
        for g, q in zip(groups.tolist(), params, strict=True):
            after[g] = after.get(g, 0.0) + float(q.grad.double().square().sum())
        for g in raw:
            assert math.sqrt(after[g]) == pytest.approx(min(math.sqrt(raw[g]), 0.01), rel=1e-4)
        assert any(math.sqrt(v) > 0.01 for v in raw.values())  # the clip bound somewhere
    finally:
        t.close()
