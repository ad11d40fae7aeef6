"""Mixup / CutMix: soft targets sum to 1, label smoothing, keyed by (seed, step)."""

import pytest
import torch

from vitscale.data import data_config
from vitscale.data.mixup import Mixup, build_mixup, smooth_one_hot


def test_smooth_one_hot():
    y = smooth_one_hot(torch.tensor([0, 2]), 4, 0.1)
    assert torch.allclose(y.sum(1), torch.ones(2))
    assert y[0, 0].item() == pytest.approx(0.925) and y[0, 1].item() == pytest.approx(0.025)


@pytest.mark.parametrize("mix,cut", [(0.8, 0.0), (0.0, 1.0), (0.8, 1.0)])
def test_targets_sum_to_one_and_match_lambda(mix, cut):
    m = Mixup(mix, cut, prob=1.0, switch_prob=0.5, label_smoothing=0.1, num_classes=10, seed=0)
    x = torch.randn(6, 3, 16, 16)
    y = torch.tensor([0, 1, 2, 3, 4, 5])
    modes = set()
    for step in range(12):
        xm, t = m(x, y, step)
        mode, lam, box = m.params(step, 16, 16)
        modes.add(mode)
        assert t.shape == (6, 10) and torch.allclose(t.sum(1), torch.ones(6))
        # the weight of the sample's own class is lam * (0.9 + 0.01) + (1 - lam) * 0.01
        assert torch.allclose(t[0, 0], torch.tensor(lam * 0.91 + (1 - lam) * 0.01))
        if mode == "mixup":
            assert torch.allclose(xm, x * lam + x.flip(0) * (1 - lam))
        else:
            y1, y2, x1, x2 = box
            assert lam == pytest.approx(1 - (y2 - y1) * (x2 - x1) / 256)
            assert torch.equal(xm[:, :, y1:y2, x1:x2], x.flip(0)[:, :, y1:y2, x1:x2])
        xm2, t2 = m(x, y, step)
        assert torch.equal(xm, xm2) and torch.equal(t, t2)  # keyed by (seed, step)
    assert modes == ({"mixup"} if cut == 0 else {"cutmix"} if mix == 0 else {"mixup", "cutmix"})


def test_prob_zero_and_build_mixup():
    m = Mixup(0.8, 0.0, prob=0.0, num_classes=5)
    x = torch.randn(2, 3, 4, 4)
    xm, t = m(x, torch.tensor([1, 4]), 0)
    assert xm is x and torch.equal(t, torch.eye(5)[[1, 4]])
    assert build_mixup(data_config(), 0.1, 10, 0) is None
    assert isinstance(build_mixup(data_config(mixup_alpha=0.2), 0.1, 10, 0), Mixup)
