"""DINOv3's Gram anchoring (``vitscale.tasks.gram``): the loss against a restatement of
facebookresearch/dinov3 ``dinov3/loss/gram_loss.py`` written out entry by entry, and the Gram teacher's
refresh schedule against ``dinov3/train/train.py``'s loop (lines 441-544) replayed step by step."""

from __future__ import annotations

import pytest
import torch

from vitscale.tasks.gram import gram_loss, refreshes_after, refreshes_before


def _reference(s, t, normalized, img_level, remove_neg, teacher_neg):
    """``GramLoss.forward`` entry by entry: rows normalised, every pair's dot product, negatives
    handled in the reference's order, the mean of the squared differences."""
    s, t = s.double(), t.double()
    if normalized:
        s, t = s / s.norm(dim=-1, keepdim=True).clamp(min=1e-12), t / t.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    mats_s, mats_t = (list(s), list(t)) if img_level else ([s.reshape(-1, s.shape[-1])], [t.reshape(-1, t.shape[-1])])
    total, count = 0.0, 0
    for a, b in zip(mats_s, mats_t):
        n = a.shape[0]
        for i in range(n):
            for j in range(n):
                gs, gt = float(a[i] @ a[j]), float(b[i] @ b[j])
                if remove_neg:
                    gs, gt = max(gs, 0.0), max(gt, 0.0)
                elif teacher_neg:
                    gt = max(gt, 0.0)
                    if gs < 0 and gt < 0:  # never: the teacher's is clamped first, as in the reference
                        gs = 0.0
                total += (gs - gt) ** 2
                count += 1
    return total / count


@pytest.mark.parametrize("normalized,img_level,remove_neg,teacher_neg", [
    (True, True, False, False), (True, False, False, False), (False, True, False, False),
    (True, True, True, False), (True, False, False, True),
])  # fmt: skip
def test_the_gram_loss_is_dinov3s(normalized, img_level, remove_neg, teacher_neg):
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 5, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    got = gram_loss(s, t, normalized=normalized, img_level=img_level, remove_neg=remove_neg,
                    remove_only_teacher_neg=teacher_neg)  # fmt: skip
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(_reference(s, t, normalized, img_level, remove_neg, teacher_neg), rel=1e-5)
    assert gram_loss(t, t, normalized=normalized, img_level=img_level).item() == 0.0


def test_the_gram_loss_refuses_what_the_reference_asserts():
    with pytest.raises(ValueError, match="exclusive"):
        gram_loss(torch.ones(1, 2, 3), torch.ones(1, 2, 3), remove_neg=True, remove_only_teacher_neg=True)
    with pytest.raises(ValueError, match=r"need \(B, N, D\)"):
        gram_loss(torch.ones(2, 3), torch.ones(2, 3), img_level=True)


@pytest.mark.parametrize("load_at,rep,every,first,most", [(0, True, 10, 25, 3), (5, False, 10, 0, None), (3, True, 4, 0, None)])
def test_the_gram_teacher_refreshes_as_dinov3s_loop(load_at, rep, every, first, most):
    """Replays ``train.py``: ``gram_load_ema_teacher`` before iteration ``load_at``, ``update_gram`` after
    iteration ``it`` when ``rep_update and it + 1 >= first and (it + 1) % every == 0`` and fewer than
    ``max_updates`` so far; iteration ``it`` is vitscale's optimizer update ``it + 1``."""
    expected, done = set(), 0
    for it in range(80):
        if it == load_at:
            expected.add(it)  # loaded before iteration it = after update it
        if rep and it + 1 >= first and (it + 1) % every == 0 and (most is None or done < most):
            expected.add(it + 1)
            done += 1
    got = {step for step in range(0, 81) if refreshes_after(step, load_at=load_at, rep_update=rep, every=every,
                                                             first=first, most=most)}  # fmt: skip
    assert got == expected
    if rep:  # the count a resumed run derives from its step, as DINOv3 does
        for step in range(1, 81):
            made = sum(1 for k in range(1, step) if k >= first and k % every == 0)
            assert refreshes_before(step, first=first, every=every) == made
