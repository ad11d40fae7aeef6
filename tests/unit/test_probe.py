"""The probes' solvers against scikit-learn on real data (the digits' 64 pixels), and their keyed draws."""

import numpy as np
import pytest
import torch

from vitscale.config import load_config
from vitscale.eval import probe


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float64)
    y = torch.tensor(d.target)
    return x[:1400], y[:1400], x[1400:], y[1400:]


def test_lbfgs_logistic_regression_is_scikit_learns(digits):
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    xtr, ytr, xte, yte = digits
    xs, xt = probe._standardize(xtr, xtr, xte)
    def objective(w, b, l2):
        return float(torch.nn.functional.cross_entropy(xs @ w + b, ytr) + 0.5 * l2 * (w * w).sum())

    for l2 in (1e-2, 1e-4):
        w, b = probe.fit_logistic(xs, ytr, 10, l2)
        ours = torch.softmax(xt @ w + b, dim=1).numpy()
        # the same objective: scikit-learn minimises C * sum(CE) + |W|^2 / 2, i.e. C = 1 / (l2 * n)
        with threadpool_limits(1):  # a small problem: BLAS threads only contend on a busy machine
            ref = LogisticRegression(C=1.0 / (l2 * len(ytr)), tol=1e-10, max_iter=10_000).fit(xs.numpy(), ytr.numpy())
        theirs = ref.predict_proba(xt.numpy())
        w_ref, b_ref = torch.tensor(ref.coef_.T), torch.tensor(ref.intercept_)
        # both at the optimum (scikit-learn's softmax is over-parametrised the same way; the penalty
        # centres its weights): objectives equal to 1e-7 relative, probabilities to 1e-3
        assert objective(w, b, l2) == pytest.approx(objective(w_ref, b_ref, l2), rel=1e-7), l2
        assert np.abs(ours - theirs).max() < 1e-3, l2
        assert (ours.argmax(1) == theirs.argmax(1)).mean() > 0.99


def test_linear_probe_picks_the_penalty_on_held_out_train_images(digits):
    xtr, ytr, xte, yte = digits
    fit, held = probe.holdout_split(ytr, 0.2, seed=0)
    assert len(set(fit.tolist()) | set(held.tolist())) == len(ytr) and not set(fit.tolist()) & set(held.tolist())
    for c in range(10):  # stratified: ~20% of every class
        n_c = int((ytr == c).sum())
        assert abs(int((ytr[held] == c).sum()) - 0.2 * n_c) <= 1
    assert torch.equal(held, probe.holdout_split(ytr, 0.2, seed=0)[1])  # keyed: the same split again
    assert not torch.equal(held, probe.holdout_split(ytr, 0.2, seed=1)[1])
    res = probe.linear_probe(xtr, ytr, xte, yte, 10, (1e-1, 1e-3), 0.2, 1000, seed=0)
    scores = res["linear_probe_holdout_top1"]
    assert set(scores) == {"0.1", "0.001"} and res["linear_probe_holdout_images"] == len(held)
    assert res["linear_probe_l2"] == max((1e-1, 1e-3), key=lambda v: (scores[f"{v:g}"], v))
    assert res["linear_probe_top1"] > 90.0  # pixels of the digits are linearly separable to ~95%


def test_fewshot_ridge_is_the_closed_form_and_reproducible(digits):
    from sklearn.linear_model import Ridge

    xtr, ytr, xte, yte = digits
    pick = torch.cat([torch.nonzero(ytr == c).flatten()[:5] for c in range(10)])  # 50 images < 65 features
    x, y = xtr[pick], ytr[pick]
    acc = probe.ridge_accuracy(x, y, xte, yte, 10, 1024.0)
    # the same regression by scikit-learn: whitened features + a constant 100 feature, targets in {-1, 1}
    mean, std = x.mean(0), x.std(0, unbiased=False) + 1e-5
    pad = lambda t: np.hstack([((t - mean) / std).numpy(), np.full((len(t), 1), 100.0)])  # noqa: E731
    ref = Ridge(alpha=1024.0, fit_intercept=False, solver="cholesky").fit(pad(x), 2 * np.eye(10)[y.numpy()] - 1)
    expected = 100.0 * float((ref.predict(pad(xte)).argmax(1) == yte.numpy()).mean())
    assert acc == pytest.approx(expected)
    more = torch.cat([torch.nonzero(ytr == c).flatten()[:10] for c in range(10)])  # 100 images > 65: the primal form
    ref = Ridge(alpha=1024.0, fit_intercept=False, solver="cholesky")
    m2, s2 = xtr[more].mean(0), xtr[more].std(0, unbiased=False) + 1e-5
    pad2 = lambda t: np.hstack([((t - m2) / s2).numpy(), np.full((len(t), 1), 100.0)])  # noqa: E731
    ref.fit(pad2(xtr[more]), 2 * np.eye(10)[ytr[more].numpy()] - 1)
    expected = 100.0 * float((ref.predict(pad2(xte)).argmax(1) == yte.numpy()).mean())
    assert probe.ridge_accuracy(xtr[more], ytr[more], xte, yte, 10, 1024.0) == pytest.approx(expected)

    res = probe.fewshot(xtr, ytr, xte, yte, 10, (1, 5), seeds=3, l2=1024.0, seed=0)
    assert len(res["fewshot_1shot_top1_seeds"]) == 3 and len(set(res["fewshot_1shot_top1_seeds"])) > 1  # seeds differ
    assert res["fewshot_5shot_top1"] == pytest.approx(np.mean(res["fewshot_5shot_top1_seeds"]))
    assert res["fewshot_5shot_top1"] > res["fewshot_1shot_top1"] > 10.0
    assert res == probe.fewshot(xtr, ytr, xte, yte, 10, (1, 5), seeds=3, l2=1024.0, seed=0)  # keyed draws


def test_probe_config_fields():
    cfg = load_config("digits_vit", ["eval.probe=fewshot", "eval.shots=1,5,10", "eval.probe_l2=1e-3"])
    assert cfg.eval.shots == (1, 5, 10) and cfg.eval.probe_l2 == (1e-3,)
    from vitscale.config import ConfigError

    with pytest.raises(ConfigError, match="eval.probe: 'lin' is not one of none, linear, fewshot"):
        load_config("digits_vit", ["eval.probe=lin"])


# ------------------------------------------------------------------ DINOv2's linear-evaluation features
def _tokens_by_hand(model, x):
    """The output of every block (forward hooks on a plain forward pass), each normalised as the model
    normalises its last (``norm``, then ``fc_norm``)."""
    outs = []
    hooks = [b.register_forward_hook(lambda m, a, out: outs.append(out)) for b in model.blocks]
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
    return [model.fc_norm(model.norm(t)) for t in outs]


@pytest.mark.parametrize("overrides", [dict(pool="token"), dict(pool="avg", class_token_length=3)],
                         ids=["class-token-pool", "mean-pool-with-registers"])  # fmt: skip
def test_dinov2_linear_features_are_the_class_tokens_and_the_mean_patch_token(overrides):
    from vitscale.models import create_model

    torch.manual_seed(0)
    model = create_model("vit_debug", hidden_size=32, ffn_hidden_size=64, num_attention_heads=2, num_layers=3,
                         **overrides).eval()  # fmt: skip
    x = torch.randn(2, 3, 32, 32)
    D, P = 32, model.num_prefix_tokens
    with torch.no_grad():
        hand = _tokens_by_hand(model, x)
        assert torch.equal(probe.read_features(model, x), model(x, pre_logits=True))  # the default: unchanged
        one = probe.read_features(model, x, "class_token_patch_mean", 1)
        assert one.shape == (2, 2 * D)
        torch.testing.assert_close(one, torch.cat([hand[-1][:, 0], hand[-1][:, P:].mean(1)], 1), rtol=0, atol=1e-6)
        four = probe.read_features(model, x, "class_token_patch_mean", 3)  # every block of three
        assert four.shape == (2, 4 * D)
        by_hand = torch.cat([hand[0][:, 0], hand[1][:, 0], hand[2][:, 0], hand[2][:, P:].mean(1)], 1)
        torch.testing.assert_close(four, by_hand, rtol=0, atol=1e-6)
        cls = probe.read_features(model, x, "class_token", 2)
        torch.testing.assert_close(cls, torch.cat([hand[1][:, 0], hand[2][:, 0]], 1), rtol=0, atol=1e-6)
        if overrides["pool"] == "token":  # the last block's class token is the pooled feature
            torch.testing.assert_close(one[:, :D], model(x, pre_logits=True), rtol=0, atol=1e-6)


def test_dinov2_linear_features_refuse_what_the_model_cannot_give():
    from vitscale.config import ConfigError
    from vitscale.models import create_model

    for overrides, message in [
        (dict(class_token=False, pool="avg"), "linear probe features=class_token reads the class token: this ViT has none"),
        (dict(num_layers=2), "linear probe blocks=4: the model has 2 blocks; read 2 or fewer"),
    ]:
        model = create_model("vit_debug", hidden_size=32, ffn_hidden_size=64, num_attention_heads=2, **overrides)
        with pytest.raises(ConfigError, match=message):
            probe.check_token_features(model, "class_token", 4 if "num_layers" in overrides else 1)
    for entry, message in [
        ({"kind": "linear_probe", "features": "cls"}, "'cls' is not one of pooled, class_token, class_token_patch_mean"),
        ({"kind": "linear_probe", "blocks": 0}, "blocks=0 must be >= 1"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config("digits_vit", [f"evals=[{entry}]"])
    with pytest.raises(ConfigError, match=r"eval.probe_blocks=0 must be at least 1"):
        load_config("digits_vit", ["eval.probe_blocks=0"])
    cfg = load_config("digits_vit", ["eval.probe=linear", "eval.probe_features=class_token_patch_mean", "eval.probe_blocks=4"])
    entry = probe.probe_entry(cfg.eval)
    assert (entry.features, entry.blocks) == ("class_token_patch_mean", 4)
