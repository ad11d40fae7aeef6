"""Contrastive losses on one process: InfoNCE and SigLIP against direct formulas, gradients checked."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vitscale.tasks.contrastive_loss import ClipLoss, SigLipLoss, build_contrastive_loss


def _feats(n=6, d=5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    img = F.normalize(torch.randn(n, d, generator=g, dtype=dtype), dim=-1).requires_grad_()
    txt = F.normalize(torch.randn(n, d, generator=g, dtype=dtype), dim=-1).requires_grad_()
    return img, txt


def test_clip_loss_matches_formula_and_rewards_alignment():
    img, txt = _feats(dtype=torch.float32)
    scale = torch.tensor(10.0)
    logits = scale * img @ txt.t()
    labels = torch.arange(6)
    ref = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
    for local in (False, True):
        assert torch.allclose(ClipLoss(local_loss=local)(img, txt, scale), ref)
    # matched pairs score lower than shuffled ones
    assert ClipLoss()(img, img, scale) < ClipLoss()(img, img.roll(1, 0), scale)


def test_siglip_loss_matches_formula_and_gradcheck():
    img, txt = _feats()
    scale = torch.tensor(10.0, dtype=torch.float64, requires_grad=True)
    bias = torch.tensor(-10.0, dtype=torch.float64, requires_grad=True)
    z = scale * img @ txt.t() + bias
    y = 2 * torch.eye(6, dtype=torch.float64) - 1
    ref = -F.logsigmoid(y * z).sum() / 6
    loss = SigLipLoss()(img, txt, scale, bias)
    assert torch.allclose(loss.double(), ref)
    # the hand-written backward equals autograd through the formula
    g = torch.autograd.grad(loss, (img, txt, scale, bias))
    g_ref = torch.autograd.grad(ref, (img, txt, scale, bias))
    for a, b in zip(g, g_ref):
        assert torch.allclose(a.double(), b, atol=1e-5), (a, b)
    # without a bias too
    loss_nb = SigLipLoss()(img, txt, scale)
    ref_nb = -F.logsigmoid(y * (scale * img @ txt.t())).sum() / 6
    assert torch.allclose(loss_nb.double(), ref_nb)


def test_build_contrastive_loss_names():
    assert isinstance(build_contrastive_loss("softmax", local_loss=True), ClipLoss)
    assert isinstance(build_contrastive_loss("sigmoid"), SigLipLoss)
