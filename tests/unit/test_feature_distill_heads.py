"""Adaptor heads of feature distillation (vitscale.tasks.feature_distill_heads): RADIO's MLP2 layout
(radio/adaptor_mlp.py) computed by hand, UNIC's initialisation, one head per teacher and token kind,
the token split, the grid matching against F.interpolate on the (B, D, gh, gw) map, and the one-line
refusals of what cannot be matched."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vitscale.errors import CheckError
from vitscale.tasks.feature_distill_heads import (
    AdaptorHeads,
    AdaptorMLP,
    TeacherAdaptor,
    check_match,
    match_grid,
    split_tokens,
)


def test_mlp_is_fc1_residual_blocks_then_norm_gelu_linear():
    torch.manual_seed(0)
    m = AdaptorMLP(6, 10, 4, num_inner=2)
    x = torch.randn(3, 5, 6)
    h = x @ m.fc1.weight.T + m.fc1.bias
    for blk in m.blocks:
        ln, lin = blk[0], blk[2]
        h = h + F.gelu(F.layer_norm(h, (10,), ln.weight, ln.bias, ln.eps)) @ lin.weight.T + lin.bias
    ln, lin = m.final[0], m.final[2]
    ref = F.gelu(F.layer_norm(h, (10,), ln.weight, ln.bias, ln.eps)) @ lin.weight.T + lin.bias
    torch.testing.assert_close(m(x), ref, atol=1e-5, rtol=1e-5)
    assert m(x).shape == (3, 5, 4)


def test_mlp_init_is_uncis_truncated_normal_and_zero_bias():
    torch.manual_seed(0)
    m = AdaptorMLP(64, 256, 128)
    w = m.fc1.weight
    assert 0.019 < w.std() < 0.021 and w.mean().abs() < 1e-3  # trunc_normal_(std=0.02) (cut at +-2: in effect normal)
    assert torch.count_nonzero(m.fc1.bias) == 0 and torch.count_nonzero(m.final[2].bias) == 0


def test_heads_per_teacher_and_kind_with_their_widths():
    heads = AdaptorHeads(8, [("dino", 12, ("summary", "patch"), None, 0), ("sam", 6, ("patch",), 16, 1)])
    assert set(heads.teachers["dino"].heads) == {"summary", "patch"} and heads.teachers["sam"].kinds == ("patch",)
    assert heads.teachers["dino"].heads["summary"].fc1.out_features == 32  # 4 x the student's width (UNIC)
    assert heads.teachers["sam"].heads["patch"].fc1.out_features == 16 and len(heads.teachers["sam"].heads["patch"].blocks) == 1
    out = heads(torch.randn(2, 8), torch.randn(2, 9, 8))
    assert out["dino"]["summary"].shape == (2, 12) and out["dino"]["patch"].shape == (2, 9, 12)
    assert set(out["sam"]) == {"patch"} and out["sam"]["patch"].shape == (2, 9, 6)
    assert not torch.equal(heads.teachers["dino"].heads["summary"].fc1.weight, heads.teachers["dino"].heads["patch"].fc1.weight)
    with pytest.raises(ValueError, match="two teachers named 'a'"):
        AdaptorHeads(8, [("a", 4, ("summary",), None, 0), ("a", 4, ("summary",), None, 0)])
    with pytest.raises(ValueError, match="token kinds"):
        TeacherAdaptor(8, 4, ("cls",))


def test_split_tokens_class_token_or_pooled():
    t = torch.randn(2, 1 + 4 + 6, 3)  # class token, 4 registers, 6 patches
    s, p = split_tokens(t, 5)
    assert torch.equal(s, t[:, 0]) and torch.equal(p, t[:, 5:])
    s, p = split_tokens(t, 5, "pooled")
    torch.testing.assert_close(s, t[:, 5:].mean(1))
    with pytest.raises(ValueError, match="without a class token"):
        split_tokens(t[:, 5:], 0)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_match_grid_is_interpolation_of_the_feature_map(mode):
    x = torch.randn(2, 4 * 6, 5)  # a 4x6 grid of 5-wide tokens
    out = match_grid(x, (4, 6), (8, 3), mode)
    grid = x.transpose(1, 2).reshape(2, 5, 4, 6)
    ref = F.interpolate(grid, size=(8, 3), mode=mode, align_corners=False, antialias=True)  # one side shrinks
    torch.testing.assert_close(out, ref.flatten(2).transpose(1, 2))
    assert out.shape == (2, 24, 5)
    # a token keeps its position: a grid constant along rows stays constant along rows
    rows = torch.arange(4.0).repeat_interleave(6)[None, :, None].expand(1, 24, 1)
    up = match_grid(rows, (4, 6), (8, 12), "bilinear").reshape(8, 12)
    assert torch.allclose(up, up[:, :1].expand(8, 12)) and up[0, 0] < up[-1, 0]
    assert match_grid(x, (4, 6), (4, 6)) is x
    with pytest.raises(ValueError, match="not a 5x5 grid"):
        match_grid(x, (5, 5), (2, 2))


def test_check_match_refuses_in_one_line():
    a = TeacherAdaptor(8, 12, ("summary", "patch"))
    ok = dict(student_dim=8, student_grid=(4, 4), teacher_dim=12, teacher_tokens=9, teacher_grid=(3, 3))
    check_match("dino", a, **ok)
    cases = [
        (dict(teacher_tokens=None, teacher_grid=None), "gives no patch tokens"),
        (dict(teacher_tokens=10, teacher_grid=(3, 3)), "not a 3x3 grid, so the student's grid cannot be interpolated"),
        (dict(teacher_dim=16), "its features are 16 wide, its heads give 12"),
        (dict(student_dim=6), "its heads take features 8 wide, the student's are 6 wide"),
        (dict(student_grid=(0, 4)), "has no tokens to interpolate"),
    ]
    for change, says in cases:
        with pytest.raises(CheckError, match=says) as e:
            check_match("dino", a, **{**ok, **change})
        assert "\n" not in str(e.value) and "'dino'" in str(e.value)
    check_match("clip", TeacherAdaptor(8, 12, ("summary",)), **{**ok, "teacher_tokens": None, "teacher_grid": None})
