"""UNIC's ladder of projectors (a teacher's ``head_ladder``, vitscale.tasks.feature_distill_heads): on a
tiny 3-block ViT student in float64, the heads' output is the hand-written sum over blocks
``sum_b head_b(x_b)`` (naver/unic ``modeling/unic.py`` lines 92-108), each ``x_b`` block ``b``'s class
token / patch tokens through the final norm, run block by block here; the widths are UNIC's (the last
block's 4 x the student's, the others' the student's); a run without the ladder builds the same heads
as before, with the same initial weights, and the ladder only adds ``ladder.*``; the refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vitscale.models.registry import resolve_model
from vitscale.tasks.feature_distill_config import FeatureTeacherConfig
from vitscale.tasks.feature_distill_heads import FeatureDistillParts, TeacherFeatures, student_tokens


def _student():
    torch.manual_seed(0)
    m = resolve_model("vit_debug", hidden_size=16, ffn_hidden_size=32, num_layers=3, num_attention_heads=2, patch_dim=4,
                      img_h=16, img_w=16, pool="token").create()  # fmt: skip
    return m.double().eval()


def _mlp(m, x):
    """RADIO's MLP2 with no inner block, by hand: final(fc1(x)) = Linear(GELU(LayerNorm(fc1 x)))."""
    h = x @ m.fc1.weight.T + m.fc1.bias
    ln, lin = m.final[0], m.final[2]
    return F.gelu(F.layer_norm(h, h.shape[-1:], ln.weight, ln.bias, ln.eps)) @ lin.weight.T + lin.bias


def _parts(**kw):
    torch.manual_seed(1)
    teachers = [FeatureTeacherConfig(name="t", path="x", standardize="none", **kw)]
    return FeatureDistillParts(16, teachers, {"t": 12}, student_blocks=3).double()


def test_the_ladder_is_the_sum_of_a_head_per_block_on_each_blocks_tokens():
    student, parts = _student(), _parts(head_ladder=True)
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    adaptor = parts.heads.teachers["t"]
    assert parts.heads.depth == 3 and adaptor.depth == 3
    for kind in ("summary", "patch"):  # UNIC's widths: hidden_dim (here the student's 16), last_hidden_dim (4 x 16)
        assert [r.fc1.out_features for r in adaptor.ladder[kind]] == [16, 16]
        assert adaptor.heads[kind].fc1.out_features == 64
    with torch.no_grad():
        summary, patches, grid = student_tokens(student, images, parts.heads.depth)
        got = adaptor(summary, patches)
        # by hand: the blocks one by one, each block's tokens through the final norm, a head each, summed
        x, _ = student._embed(images)
        want = {"summary": 0, "patch": 0}
        for b, block in enumerate(student.blocks):
            x = block(x)
            tok = student.fc_norm(student.norm(x))
            for kind, xb in (("summary", tok[:, 0]), ("patch", tok[:, student.num_prefix_tokens:])):
                head = adaptor.ladder[kind][b] if b < 2 else adaptor.heads[kind]
                want[kind] = want[kind] + _mlp(head, xb)
    assert grid == (4, 4) and len(summary) == len(patches) == 3
    assert got["summary"].shape == (2, 12) and got["patch"].shape == (2, 16, 12)
    for kind in want:
        torch.testing.assert_close(got[kind], want[kind], atol=1e-12, rtol=1e-12)
    # the last block's tokens as the contract gives them without the ladder (model(x, tokens=True))
    with torch.no_grad():
        s = student(images, tokens=True)
    torch.testing.assert_close(summary[-1], s.pooled, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(patches[-1], s.patches, atol=1e-12, rtol=1e-12)
    # and the loss of the parts runs on them (every head gets a gradient)
    parts.train()
    feats = {"t": TeacherFeatures(torch.randn(2, 12, dtype=torch.float64), torch.randn(2, 4, 12, dtype=torch.float64), (2, 2))}
    loss, _ = parts(summary, patches, grid, feats)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in parts.named_parameters() if n.endswith("weight")
               and ".final.0." not in n)  # fmt: skip


def test_the_ladder_width_and_a_run_without_it_unchanged():
    off, on = _parts(), _parts(head_ladder=True, head_ladder_hidden_dim=8)
    assert off.heads.depth == 0 and not any(".ladder." in k for k in off.state_dict())
    assert [r.fc1.out_features for r in on.heads.teachers["t"].ladder["patch"]] == [8, 8]
    sd_on = on.state_dict()
    for k, v in off.state_dict().items():  # the heads built first: their initialisation as without the ladder
        assert torch.equal(v, sd_on[k]), k
    assert sorted(set(sd_on) - set(off.state_dict()))[0].startswith("heads.teachers.t.ladder.")
    assert any("a ladder: the sum over the student's 3 blocks" in line for line in on.describe())


def test_the_ladder_refuses_what_it_cannot_sum():
    parts = _parts(head_ladder=True)
    with pytest.raises(ValueError, match="ladder sums heads on all 3 blocks' tokens, given the last block's"):
        parts.heads(torch.randn(2, 16, dtype=torch.float64), torch.randn(2, 4, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="give the student's depth"):
        FeatureDistillParts(16, [FeatureTeacherConfig(name="t", path="x", head_ladder=True)], {"t": 12})
    with pytest.raises(ValueError, match="head_ladder_hidden_dim is the ladder's width"):
        FeatureTeacherConfig(name="t", path="x", head_ladder_hidden_dim=8)
    with pytest.raises(ValueError, match="head_ladder='yes'"):
        FeatureTeacherConfig(name="t", path="x", head_ladder="yes")
