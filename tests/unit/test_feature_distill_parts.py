"""The feature-distillation parts composed (vitscale.tasks.feature_distill_heads.FeatureDistillParts):
a tiny vitscale ViT student learns two frozen ViT teachers of other widths, patch sizes and summary
kinds through its heads, PHI-S and running standardisation; a resume from the state dicts continues
bit for bit (heads, statistics and optimizer); the hand-over de-standardises into the teacher's space."""

from __future__ import annotations

import copy

import torch

from vitscale.models.registry import resolve_model
from vitscale.tasks.feature_distill_config import FeatureDistillConfig, FeatureTeacherConfig
from vitscale.tasks.feature_distill_heads import FeatureDistillParts, TeacherFeatures, split_tokens


def _vit(width, patch, seed, **kw):
    torch.manual_seed(seed)
    return resolve_model("vit_debug", hidden_size=width, ffn_hidden_size=2 * width, num_layers=1, num_attention_heads=2,
                         patch_dim=patch, img_h=16, img_w=16, **kw).create()  # fmt: skip


def _setup():
    student = _vit(16, 4, 0)  # 4x4 grid, 16 wide
    t_dino, t_pool = _vit(24, 2, 1).eval(), _vit(20, 8, 2, class_token_length=0, pool="avg").eval()  # 8x8 grid; 2x2 pooled
    dc = FeatureDistillConfig(teachers=[
        FeatureTeacherConfig(name="dino", path="x", standardize="phi_s", standardize_images=16, head_hidden_dim=32),
        FeatureTeacherConfig(name="pool", path="y", summary="pooled", standardize="running", grid_interpolation="bicubic"),
    ], teacher_drop=0.5)  # fmt: skip
    parts = FeatureDistillParts(16, dc.teachers, {"dino": 24, "pool": 20})
    opt = torch.optim.AdamW([*student.parameters(), *parts.parameters()], lr=1e-2)
    return student, (t_dino, t_pool), dc, parts, opt


def _teachers(teachers, images):
    with torch.no_grad():
        d = teachers[0].forward_features(images)
        p = teachers[1].forward_features(images)
    s_d, p_d = split_tokens(d, teachers[0].num_prefix_tokens, "class_token")
    s_p, p_p = split_tokens(p, 0, "pooled")
    return {"dino": TeacherFeatures(s_d, p_d, (8, 8)), "pool": TeacherFeatures(s_p, p_p, (2, 2))}


def _step(student, teachers, dc, parts, opt, images, step):
    s, p = split_tokens(student.forward_features(images), student.num_prefix_tokens)
    loss, metrics = parts(s, p, (4, 4), _teachers(teachers, images), drop=dc.teacher_drop, seed=5, step=step,
                          index=torch.arange(images.shape[0]) + 100 * step)  # fmt: skip
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach()), metrics


def _handover_error(student, teachers, parts, images):
    parts.eval()
    with torch.no_grad():
        s, p = split_tokens(student.forward_features(images), student.num_prefix_tokens)
        out = parts.handover("dino", s, p)
        heads = parts.heads.teachers["dino"](s, p)
    parts.train()
    want = _teachers(teachers, images)["dino"].summary
    torch.testing.assert_close(parts.norms["dino"]["summary"].standardize(out["summary"]), heads["summary"], atol=1e-4, rtol=1e-4)
    assert out["summary"].shape == want.shape and out["patch"].shape == (4, 16, 24)  # the student's grid
    # the error relative to the teachers' spread (1 = no better than their mean: a raw cosine would be
    # near 1 from the mean alone)
    return float(((out["summary"] - want) ** 2).sum() / ((want - want.mean(0)) ** 2).sum())


def test_a_student_learns_two_teachers_resumes_exactly_and_hands_over():
    student, teachers, dc, parts, opt = _setup()
    images = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(9))
    parts.check(16, (4, 4), _teachers(teachers, images))
    losses, saved = [], None
    for step in range(16):
        if step == 6:
            saved = [{k: v.clone() for k, v in m.state_dict().items()} for m in (student, parts)]
            saved.append(copy.deepcopy(opt.state_dict()))
            before = _handover_error(student, teachers, parts, images)  # PHI-S frozen by now: the same target space
        loss, m = _step(student, teachers, dc, parts, opt, images, step)
        losses.append(loss)
    assert losses[-1] < 0.7 * losses[0], losses
    assert bool(parts.norms["dino"]["patch"].frozen) and int(parts.norms["dino"]["patch"].seen) == 16  # PHI-S: 4 batches
    assert not bool(parts.norms["pool"]["summary"].frozen) and int(parts.norms["pool"]["summary"].seen) == 4 * 16
    assert {"train_dino_loss", "train_dino_summary_cos", "train_dino_patch_cos", "train_pool_loss", "train_pool_share"} <= set(m)
    assert all(not v.requires_grad for v in m.values())
    after = _handover_error(student, teachers, parts, images)
    assert after < 0.8 * before, (before, after)
    assert any("PHI-S over the first 16 images" in line for line in parts.describe())
    # the resume: fresh modules loaded from step 6's state continue to the same weights, bit for bit
    student2, _, _, parts2, opt2 = _setup()
    student2.load_state_dict(saved[0])
    parts2.load_state_dict(saved[1])
    opt2.load_state_dict(saved[2])
    for step in range(6, 16):
        _step(student2, teachers, dc, parts2, opt2, images, step)
    for a, b in ((student, student2), (parts, parts2)):
        for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(v, w), k


def test_parts_built_on_the_meta_device_initialise_like_fresh_ones():
    dc = _setup()[2]
    with torch.device("meta"):
        meta = FeatureDistillParts(16, dc.teachers, {"dino": 24, "pool": 20})
    meta = meta.to_empty(device="cpu")
    meta.init_weights()
    fresh = FeatureDistillParts(16, dc.teachers, {"dino": 24, "pool": 20})
    for (k, v), w in zip(fresh.state_dict().items(), meta.state_dict().values()):
        if k.startswith("norms."):
            assert torch.equal(v, w), k
        elif k.endswith("bias") and ".final.0." not in k and ".blocks." not in k:
            assert torch.count_nonzero(w) == 0, k
    w = meta.heads.teachers["dino"].heads["patch"].fc1.weight.detach()
    assert torch.isfinite(w).all() and 0.015 < float(w.std()) < 0.025
    assert torch.equal(meta.heads.teachers["dino"].heads["patch"].final[0].weight, torch.ones(32))  # LayerNorm reset
