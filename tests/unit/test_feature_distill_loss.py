"""Feature distillation losses (vitscale.tasks.feature_distill_loss) against UNIC's formulas written
out by hand per token, image and teacher (naver/unic modeling/losses.py, teacher_dropping.py): the
0.5 / 0.5 cosine + smooth-L1 loss, the per-teacher weights, UNIC's normalisation, teacher dropping
(the highest-loss teacher kept, keyed per image), and the detached per-teacher metrics."""

from __future__ import annotations

import math

import pytest
import torch

from vitscale.tasks.feature_distill_loss import (
    TeacherLoss,
    combine_teachers,
    drop_teachers,
    feature_distill_loss,
)


def _out(seed, b=3, n=4, dims=(("a", 5), ("b", 7))):
    g = torch.Generator().manual_seed(seed)
    return {name: {"summary": torch.randn(b, d, generator=g), "patch": torch.randn(b, n, d, generator=g)} for name, d in dims}


def _sl1(x, y, beta):
    d = abs(x - y)
    return 0.5 * d * d / beta if d < beta else d - 0.5 * beta


def _ref_image_loss(s, t, spec):
    """One teacher's loss of one image, by the formulas, in Python floats."""
    kinds = []
    for kind in ("summary", "patch"):
        if kind not in t:
            continue
        toks_s = s[kind].double().reshape(-1, s[kind].shape[-1])
        toks_t = t[kind].double().reshape(-1, t[kind].shape[-1])
        per_token = []
        for u, v in zip(toks_s, toks_t):
            cos = float(u @ v / (u.norm() * v.norm()))
            sl1 = sum(_sl1(float(x), float(y), spec.smooth_l1_beta) for x, y in zip(u, v)) / len(u)
            per_token.append(spec.cos_weight * (1 - cos) + spec.smooth_l1_weight * sl1)
        w = spec.summary_weight if kind == "summary" else spec.patch_weight
        kinds.append((w, sum(per_token) / len(per_token)))
    return sum(w * v for w, v in kinds) / sum(w for w, _ in kinds)


def _image(d, b):
    return {k: v[b] for k, v in d.items()}


def test_uncis_loss_without_dropping_is_the_mean_over_teachers_and_images():
    s, t = _out(0), _out(1)
    specs = [TeacherLoss("a"), TeacherLoss("b")]  # UNIC's 0.5 / 0.5, beta 1, kinds averaged
    loss, m = feature_distill_loss(s, t, specs)
    ref = [[_ref_image_loss(_image(s[n], b), _image(t[n], b), sp) for b in range(3)] for n, sp in zip("ab", specs)]
    assert math.isclose(float(loss), sum(map(sum, ref)) / 6, rel_tol=1e-5)
    assert math.isclose(float(m["train_a_loss"]), sum(ref[0]) / 3, rel_tol=1e-5)
    cos = torch.nn.functional.cosine_similarity(s["b"]["patch"], t["b"]["patch"], dim=-1).mean()
    torch.testing.assert_close(m["train_b_patch_cos"], cos)
    assert all(not v.requires_grad for v in m.values()) and "train_a_share" not in m


def test_weights_kinds_and_loss_settings_change_what_they_should():
    s, t = _out(0), _out(1)
    specs = [TeacherLoss("a", weight=3.0, cos_weight=1.0, smooth_l1_weight=0.0, summary_weight=0.0),
             TeacherLoss("b", weight=0.5, smooth_l1_beta=0.25, patch_weight=2.0)]  # fmt: skip
    t["b"] = {"summary": t["b"]["summary"], "patch": t["b"]["patch"]}
    loss, _ = feature_distill_loss(s, t, specs)
    ref = [[_ref_image_loss(_image(s[n], b), _image(t[n], b), sp) for b in range(3)] for n, sp in zip("ab", specs)]
    assert math.isclose(float(loss), (3.0 * sum(ref[0]) + 0.5 * sum(ref[1])) / 6, rel_tol=1e-5)
    only_summary = {"a": {"summary": t["a"]["summary"]}, "b": {"summary": t["b"]["summary"]}}  # a teacher's kinds
    loss2, m2 = feature_distill_loss(s, only_summary, [TeacherLoss("a"), TeacherLoss("b")])
    assert "train_a_patch_cos" not in m2 and math.isfinite(float(loss2))


def test_teacher_dropping_keeps_the_highest_loss_teacher_and_drops_others_at_p():
    g = torch.Generator().manual_seed(0)
    losses = torch.rand(3, 1500, generator=g)
    c = drop_teachers(losses, 0.5, seed=1, step=7, index=torch.arange(1500))
    top = losses.argmax(0)
    assert torch.all(c[top, torch.arange(1500)] == 1) and torch.all(c.sum(0) >= 1)
    others = torch.ones_like(c, dtype=torch.bool)
    others[top, torch.arange(1500)] = False
    assert abs(float(c[others].mean()) - 0.5) < 0.05  # each other teacher kept with probability 1 - p
    # keyed per image: the same image draws the same wherever it sits in the batch (any rank, a resume)
    perm = torch.randperm(1500, generator=g)
    c2 = drop_teachers(losses[:, perm], 0.5, seed=1, step=7, index=perm)
    assert torch.equal(c2, c[:, perm])
    assert not torch.equal(drop_teachers(losses, 0.5, seed=1, step=8, index=torch.arange(1500)), c)
    assert torch.equal(drop_teachers(losses, 0.0, 1, 7, torch.arange(1500)), torch.ones_like(losses))


def test_uncis_normalisation_with_dropping_and_the_share_metric():
    s, t = _out(0, b=6), _out(1, b=6)
    specs = [TeacherLoss("a"), TeacherLoss("b")]
    index = torch.arange(10, 16)
    loss, m = feature_distill_loss(s, t, specs, drop=0.5, seed=3, step=2, index=index)
    per = torch.stack([feature_distill_loss({n: s[n]}, {n: t[n]}, [sp])[1][f"train_{n}_loss"] for n, sp in zip("ab", specs)])
    assert per.shape == (2,)
    l_tb = torch.tensor([[_ref_image_loss(_image(s[n], b), _image(t[n], b), sp) for b in range(6)] for n, sp in zip("ab", specs)])
    c = drop_teachers(l_tb.float(), 0.5, 3, 2, index)
    assert math.isclose(float(loss), float((c * l_tb.float()).sum() / c.sum()), rel_tol=1e-5)
    assert math.isclose(float(m["train_a_share"] + m["train_b_share"]), 1.0, rel_tol=1e-6)
    # a global count: 2 ranks each dividing by (global sum c) / 2 average to one process's loss
    w = torch.ones(2)
    half = [combine_teachers(l_tb[:, i], w, c[:, i], count=c.sum() / 2) for i in (slice(0, 3), slice(3, 6))]
    assert math.isclose(float((half[0] + half[1]) / 2), float(combine_teachers(l_tb, w, c)), rel_tol=1e-6)
    with pytest.raises(ValueError, match="dataset indices"):
        feature_distill_loss(s, t, specs, drop=0.5)


def test_gradient_flows_to_the_student_only_and_shapes_must_match():
    s, t = _out(0), _out(1)
    for d in s.values():
        for v in d.values():
            v.requires_grad_(True)
    loss, _ = feature_distill_loss(s, t, [TeacherLoss("a"), TeacherLoss("b")], drop=0.5, index=torch.arange(3))
    loss.backward()
    assert s["a"]["patch"].grad is not None and torch.isfinite(s["a"]["patch"].grad).all()
    t["a"]["patch"] = t["a"]["patch"][:, :2]
    with pytest.raises(ValueError, match="teacher 'a': adaptor output"):
        feature_distill_loss(s, t, [TeacherLoss("a"), TeacherLoss("b")])
