"""Teacher feature standardisation (vitscale.tasks.feature_distill_norm): the Hadamard constructions,
PHI-S's formula (arXiv 2410.01680; NVlabs/RADIO examples/common/phi_s.py) and its isotropy, the
running mean / std, their inverses, the estimation window, the moments' combination over two shards
(the all_reduce's arithmetic), and an exact resume from the state dict."""

from __future__ import annotations

import pytest
import torch

from vitscale.tasks.feature_distill_norm import FeatureStandardizer, combine, hadamard, moments, rotation


def _features(n=300, d=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=g, dtype=torch.float64) * torch.linspace(0.1, 5.0, d, dtype=torch.float64)
    return (torch.randn(n, d, generator=g, dtype=torch.float64) @ mix.T + 3.0).float()


@pytest.mark.parametrize("n", [1, 2, 4, 8, 12, 20, 24, 28, 36, 40, 48, 60, 72, 96, 192])
def test_hadamard_is_orthogonal_with_entries_of_one_magnitude(n):
    h = hadamard(n)
    assert h is not None and h.shape == (n, n)
    torch.testing.assert_close(h @ h.T, torch.eye(n, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(h.abs(), torch.full((n, n), n**-0.5, dtype=torch.float64))


def test_common_vit_widths_have_a_hadamard_matrix_and_others_fall_back():
    for n in (384, 768, 1152, 1280, 1664):  # Paley I (12, 20, 104) or II (36) x Sylvester
        h = hadamard(n)
        assert h is not None
        rows = torch.arange(0, n, n // 8)  # a few rows against all: cheap, and any row could be wrong
        torch.testing.assert_close(h[rows] @ h.T, torch.eye(n, dtype=torch.float64)[rows], atol=1e-10, rtol=0)
    for n in (6, 10, 3):  # no Hadamard matrix of these orders exists
        assert hadamard(n) is None
        r, exact = rotation(n)
        assert not exact
        torch.testing.assert_close(r @ r.T, torch.eye(n, dtype=torch.float64), atol=1e-12, rtol=0)
        assert torch.equal(r, rotation(n)[0])  # the same rotation every time (every rank, every run)


def test_phi_s_is_radios_formula_and_isotropic():
    x = _features()
    s = FeatureStandardizer(12, "phi_s").train()
    y = s(x)
    xd = x.double()
    mu = xd.mean(0)
    e, u = torch.linalg.eigh(torch.cov((xd - mu).T))
    alpha = 1 / e.clamp_min(0).mean().sqrt()
    torch.testing.assert_close(s.mean.double(), mu, atol=1e-5, rtol=0)
    torch.testing.assert_close(s.scale.double(), alpha, atol=1e-6, rtol=1e-6)
    # the transform is alpha H U^T up to the signs of U's columns: the same covariance of y
    ref = (xd - mu) @ (alpha * hadamard(12) @ u.T).T
    torch.testing.assert_close(torch.cov(y.double().T), torch.cov(ref.T), atol=1e-4, rtol=0)
    var = y.double().var(0)
    torch.testing.assert_close(var, torch.ones(12, dtype=torch.float64), atol=1e-4, rtol=0)  # every dimension: 1
    torch.testing.assert_close(y.double().mean(0), torch.zeros(12, dtype=torch.float64), atol=1e-4, rtol=0)
    assert (y.double().var(0) - 1).abs().max() < 1e-4 and (x.double().var(0) - 1).abs().max() > 1  # it changed x


def test_running_is_the_per_dimension_mean_and_std():
    x = _features().reshape(30, 10, 12)  # patch tokens: 30 images x 10 tokens
    s = FeatureStandardizer(12, "running").train()
    y = s(x)
    flat = x.reshape(-1, 12)
    torch.testing.assert_close(s.mean, flat.mean(0), atol=1e-4, rtol=0)
    torch.testing.assert_close(s.std, flat.std(0), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(y, (x - flat.mean(0)) / flat.std(0), atol=1e-4, rtol=0)
    assert int(s.seen) == 30 and float(s.count) == 300


@pytest.mark.parametrize("kind", ["phi_s", "running", "none"])
def test_destandardize_inverts_standardize(kind):
    x = _features(d=12)
    s = FeatureStandardizer(12, kind).train()
    y = s(x)
    torch.testing.assert_close(s.destandardize(y), x, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(s.standardize(s.destandardize(y)), y, atol=1e-4, rtol=1e-5)


def test_a_width_without_hadamard_still_inverts_and_says_so():
    x = _features(d=10)
    s = FeatureStandardizer(10, "phi_s").train()
    y = s(x)
    assert not s.exact and "random rotation" in s.describe()
    torch.testing.assert_close(s.destandardize(y), x, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(y.double().var(0).mean(), torch.tensor(1.0, dtype=torch.float64), atol=1e-4, rtol=0)


def test_statistics_freeze_after_the_estimation_images_and_eval_does_not_update():
    x = _features(n=40)
    s = FeatureStandardizer(12, "phi_s", images=16).train()
    s(x[:8])
    assert not bool(s.frozen)
    s(x[8:16])
    assert bool(s.frozen) and int(s.seen) == 16
    frozen = {k: v.clone() for k, v in s.state_dict().items()}
    s(x[16:])  # past the window: nothing changes
    assert all(torch.equal(frozen[k], v) for k, v in s.state_dict().items())
    ref = FeatureStandardizer(12, "phi_s").train()
    ref(x[:16])
    torch.testing.assert_close(s.mean, ref.mean)
    e = FeatureStandardizer(12, "running").eval()
    e(x)
    assert int(e.seen) == 0 and torch.equal(e.mean, torch.zeros(12))


@pytest.mark.parametrize("kind", ["phi_s", "running"])
def test_two_shards_combined_equal_one_process_on_the_union(kind):
    """What every rank absorbs after the all_reduce of sums: the moments of the whole global batch."""
    x = _features(n=64)
    a, b = x[:24], x[24:]
    full = kind == "phi_s"
    one = FeatureStandardizer(12, kind)
    one.absorb((*moments(x, full), torch.tensor(64.0, dtype=torch.float64)))
    two = FeatureStandardizer(12, kind)
    two.absorb(combine((*moments(a, full), torch.tensor(24.0, dtype=torch.float64)),
                       (*moments(b, full), torch.tensor(40.0, dtype=torch.float64))))  # fmt: skip
    for k, v in one.state_dict().items():
        torch.testing.assert_close(two.state_dict()[k], v, atol=1e-9, rtol=1e-9, msg=k)
    assert int(two.seen) == 64


def test_a_resume_from_the_state_dict_continues_exactly():
    x = _features(n=48)
    s = FeatureStandardizer(12, "phi_s", images=32).train()
    s(x[:16])
    state = {k: v.clone() for k, v in s.state_dict().items()}
    s(x[16:32])
    r = FeatureStandardizer(12, "phi_s", images=32).train()
    r.load_state_dict(state)
    r(x[16:32])
    for k, v in s.state_dict().items():
        assert torch.equal(r.state_dict()[k], v), k
    assert r._frozen and bool(r.frozen)
    torch.testing.assert_close(r(x[32:]), s(x[32:]), atol=0, rtol=0)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="standardize='pca'"):
        FeatureStandardizer(8, "pca")
    s = FeatureStandardizer(8, "running").train()
    with pytest.raises(ValueError, match="width 6 given to a standardiser of width 8"):
        s(torch.zeros(2, 6))


def test_autocast_does_not_lower_the_standardisation():
    x = _features(n=64)
    s = FeatureStandardizer(12, "phi_s", images=64).train()
    s(x)
    want = s.standardize(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = s.standardize(x.bfloat16())
        back = s.destandardize(want)
    assert got.dtype == back.dtype == torch.float32
    torch.testing.assert_close(got, s.standardize(x.bfloat16().float()))  # the input's rounding only, no bf16 matmul
    torch.testing.assert_close(back, x, atol=1e-4, rtol=1e-5)


def test_init_weights_after_the_meta_device_is_a_fresh_standardiser():
    for kind in ("phi_s", "running"):
        with torch.device("meta"):
            m = FeatureStandardizer(12, kind)
        m = m.to_empty(device="cpu")
        m.init_weights()
        fresh = FeatureStandardizer(12, kind)
        for k, v in fresh.state_dict().items():
            assert torch.equal(m.state_dict()[k], v), (kind, k)
        if kind == "phi_s":
            assert "hadamard" not in fresh.state_dict() and torch.equal(m.hadamard, fresh.hadamard)
            torch.testing.assert_close(m.hadamard.double(), hadamard(12), atol=1e-7, rtol=0)


@pytest.mark.parametrize("kind", ["phi_s", "running"])
def test_a_batch_with_a_nonfinite_feature_is_not_absorbed(kind):
    """A teacher that emits NaN / inf: its step is not applied and stops the run; the statistics (which a
    checkpoint of that step saves) stay those of the batches before it, then go on as without it."""
    x = _features(n=32)
    s = FeatureStandardizer(12, kind).train()
    s(x[:16])
    before = {k: v.clone() for k, v in s.state_dict().items()}
    bad = x[16:24].clone()
    bad[3, 5] = float("nan")
    bad[0, 0] = float("inf")
    s(bad)
    for k, v in s.state_dict().items():
        assert torch.equal(before[k], v), k
    s(x[24:])
    ref = FeatureStandardizer(12, kind).train()
    ref(x[:16])
    ref(x[24:])
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(s.state_dict()[k], v, atol=0, rtol=0, msg=k)
