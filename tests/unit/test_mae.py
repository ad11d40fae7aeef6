"""MAE's parts against direct computations: the keyed masks, the loss (float64, MAE's formula written
out), the encoder on the visible patches (the blocks on the gathered sequence) and through its final
LayerNorm, the decoder's sin-cos table; the knn evaluator against a brute-force numpy vote on the
digits; RankMe against numpy's SVD."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitscale.eval.knn import knn_classify
from vitscale.models.registry import resolve_model
from vitscale.tasks.health import HOLD, RankWatch, effective_rank, rank_floor
from vitscale.tasks.mae import draw_shuffle, keep_count, mae_loss, sincos_2d
from vitscale.tasks.mae_config import MaeConfig


def test_masks_keep_the_ratio_and_are_keyed_by_sample_and_step():
    n = 64
    k = keep_count(n, 0.75)
    assert k == 16 and keep_count(49, 0.75) == 12  # int(N * (1 - ratio)), as MAE
    index = torch.tensor([5, 17, 3, 900])
    a = draw_shuffle(index, step=7, seed=0, num_patches=n)
    assert a.shape == (4, n) and all(
        sorted(r.tolist()) == list(range(n)) for r in a
    )  # a permutation per sample
    assert len({tuple(r[:k].tolist()) for r in a}) == 4  # different samples, different masks
    # the same (seed, step, sample) draws the same mask: a resumed run; split over two ranks, any order
    assert torch.equal(draw_shuffle(index, 7, 0, n), a)
    halves = torch.cat([draw_shuffle(index[2:], 7, 0, n), draw_shuffle(index[:2], 7, 0, n)])
    assert torch.equal(halves, a[[2, 3, 0, 1]])
    assert not torch.equal(draw_shuffle(index, 8, 0, n), a) and not torch.equal(
        draw_shuffle(index, 7, 1, n), a
    )


def test_a_mask_ratio_outside_zero_one_is_refused():
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="mask_ratio"):
            MaeConfig(mask_ratio=bad)


def test_the_loss_is_maes_formula_in_float64():
    g = torch.Generator().manual_seed(0)
    B, C, H, p = 3, 3, 8, 4
    images = torch.randn(B, C, H, H, generator=g)
    n = (H // p) ** 2
    pred = torch.randn(B, n, p * p * C, generator=g)
    removed = torch.tensor([[1, 0, 1, 1], [0, 1, 1, 1], [1, 1, 0, 1]])
    x, pr, m = images.double().numpy(), pred.double().numpy(), removed.double().numpy()
    for norm_pix in (True, False):
        # patches in (row, col) order, each flattened as (ph, pw, C) (MAE's patchify 'nchpwq->nhwpqc')
        target = np.stack([np.stack([x[b, :, r * p:(r + 1) * p, c * p:(c + 1) * p].transpose(1, 2, 0).reshape(-1)
                                     for r in range(H // p) for c in range(H // p)]) for b in range(B)])  # fmt: skip
        if norm_pix:
            target = (target - target.mean(-1, keepdims=True)) / np.sqrt(
                target.var(-1, ddof=1, keepdims=True) + 1e-6
            )
        want = (((pr - target) ** 2).mean(-1) * m).sum() / m.sum()
        got = mae_loss(pred, images, removed.bool(), p, norm_pix)
        assert got.dtype == torch.float32 and abs(float(got) - want) < 1e-5 * max(1.0, abs(want))


def test_the_encoder_on_the_visible_patches_is_the_blocks_on_the_gathered_sequence():
    torch.manual_seed(0)
    model = resolve_model(
        "vit_debug",
        hidden_size=32,
        ffn_hidden_size=64,
        num_layers=2,
        num_attention_heads=2,
        class_token_length=2,
    ).create()  # fmt: skip  (a class token and a register)
    model.eval()
    x = torch.randn(3, 3, 32, 32)
    keep = draw_shuffle(torch.arange(3), 0, 0, model.cfg.num_patches)[:, :5]
    got = model(x, keep=keep)
    with torch.no_grad():
        full = model._pos_embed(model.patch_embed(x), model.cfg.grid)  # every token with its position
        P = model.num_prefix_tokens
        seq = torch.cat([full[:, :P], torch.stack([full[b, P:][keep[b]] for b in range(3)])], dim=1)
        for block in model.blocks:
            seq = block(seq)
        want = model.norm(seq)
    assert got.shape == (3, P + 5, 32) and torch.allclose(got, want, atol=1e-6)
    assert torch.equal(model(x), model.forward_head(model.forward_features(x)))  # the plain path is unchanged


def test_the_decoder_reads_every_token_through_the_encoders_final_layernorm():
    """MAE's ``forward_encoder`` ends in ``self.norm(x)`` (facebookresearch/mae ``models_mae.py`` line
    168): the decoder's input is the blocks' output through the model's final LayerNorm — its
    ``fc_norm`` on a mean-pooled ViT (whose ``norm`` is the identity), its ``norm`` on a class-token
    one — so MAE's loss reaches that norm, and only the classifier is left frozen."""
    from vitscale.tasks.mae import MaeDecoder, encoded
    from vitscale.tasks.module import freeze_unreached

    kw = dict(hidden_size=32, ffn_hidden_size=64, num_layers=1, num_attention_heads=2, patch_dim=4)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for pool in ("avg", "token"):
        torch.manual_seed(0)
        model = resolve_model("vit_debug", pool=pool, **kw).create()
        final = model.fc_norm if pool == "avg" else model.norm
        assert isinstance(final, torch.nn.LayerNorm)
        with torch.no_grad():  # not the identity it starts as
            final.weight.uniform_(0.5, 1.5)
            final.bias.normal_()
        n = model.cfg.num_patches
        keep = draw_shuffle(torch.arange(2), 0, 0, n)[:, :16]
        got = encoded(model(x, tokens=True, keep=keep))
        blocks = model(x, keep=keep)  # forward_features: the blocks' output through norm (avg: the identity)
        assert got.shape == (2, 1 + 16, 32)
        assert torch.allclose(got, final(blocks) if pool == "avg" else blocks, atol=1e-6)
        assert pool == "token" or not torch.allclose(got, blocks, atol=1e-3)  # avg: normalised where it was not
        decoder = MaeDecoder(32, 4 * 4 * 3, MaeConfig(decoder_width=16, decoder_depth=1, decoder_heads=2))
        restore = torch.arange(n)[None].expand(2, -1)

        def reconstruction(m, decoder=decoder, keep=keep, restore=restore):
            return decoder(encoded(m(x, tokens=True, keep=keep)), restore, m.num_prefix_tokens, m.cfg.grid)

        assert freeze_unreached(model, reconstruction, others=(decoder,)) == ["head.weight", "head.bias"]


def test_decoder_position_table_is_the_2d_sincos_formula():
    gh, gw, width = 3, 5, 8
    table = sincos_2d(width, gh, gw).double()
    omega = 1.0 / 10000 ** (np.arange(2) / 2)
    for i in range(gh * gw):
        r, c = divmod(i, gw)
        want = np.concatenate([np.sin(c * omega), np.cos(c * omega), np.sin(r * omega), np.cos(r * omega)])
        assert np.allclose(table[i].numpy(), want, atol=1e-6)


def test_knn_is_the_brute_force_weighted_vote_on_the_digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = d.data.astype(np.float64), d.target
    rng = np.random.default_rng(0)
    x = x @ rng.standard_normal((64, 32))  # features of a fixed random projection (their signs vary)
    bank, bank_y, q, q_y = x[:1200], y[:1200], x[1200:], y[1200:]
    k, T = 20, 0.07
    nb = bank / np.linalg.norm(bank, axis=1, keepdims=True)
    nq = q / np.linalg.norm(q, axis=1, keepdims=True)
    hit1 = hit5 = 0
    for v, label in zip(nq, q_y):
        sims = nb @ v
        near = np.argsort(-sims)[:k]
        votes = np.zeros(10)
        for j in near:
            votes[bank_y[j]] += np.exp(sims[j] / T)
        order = np.argsort(-votes)
        hit1 += order[0] == label
        hit5 += label in order[:5]
    got = knn_classify(torch.tensor(bank, dtype=torch.float32), torch.tensor(bank_y), torch.tensor(q, dtype=torch.float32),
                       torch.tensor(q_y), 10, k, T)  # fmt: skip
    assert got["top1"] == pytest.approx(100 * hit1 / len(q_y)) and got["top5"] == pytest.approx(
        100 * hit5 / len(q_y)
    )
    assert got["top1"] > 90  # the digits' neighbours mostly share their class


def test_rankme_is_the_entropy_of_numpys_singular_values():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 16, generator=g) @ torch.diag(torch.logspace(0, -3, 16))  # a decaying spectrum
    s = np.linalg.svd(z.double().numpy(), compute_uv=False)
    p = s / s.sum() + 1e-7
    assert float(effective_rank(z)) == pytest.approx(float(np.exp(-(p * np.log(p)).sum())), rel=1e-4)
    assert float(effective_rank(torch.ones(8, 4))) == pytest.approx(
        1.0, abs=1e-3
    )  # complete collapse: rank 1
    assert float(effective_rank(torch.eye(6))) == pytest.approx(
        6.0, rel=1e-5
    )  # equal singular values: full rank
    assert rank_floor(64, 96) == 2.0 and rank_floor(4096, 1024) == pytest.approx(10.24)


def test_the_rank_warning_is_one_line_per_fall_that_holds():
    """One line once the rank has stayed below its floor at three log steps in a row (HOLD), none for a
    fall of two, and one again for the next fall that holds."""
    assert HOLD == 3
    watch = RankWatch()
    h, c = torch.randn(32, 8, generator=torch.Generator().manual_seed(1)), torch.ones(32, 8)  # healthy, collapsed
    said = []
    for step, z in enumerate([h, c, c, h, c, c, c, c, h, c, c, c], start=1):
        watch.keep(z)
        metrics, lines = watch.read(step)
        assert set(metrics) == {"train_rankme"}
        said += lines
    assert len(said) == 2, said
    assert said[0].startswith("warning: step 7: the effective rank (RankMe)") and "since step 5" in said[0]
    assert said[1].startswith("warning: step 12: ") and "since step 10" in said[1]


def test_knn_is_an_entry_of_evals_beside_the_linear_probe():
    from vitscale.config import load_config
    from vitscale.errors import ConfigError

    cfg = load_config("digits_vit", ["evals=[{kind: knn, k: 5, temperature: 0.1}, {kind: linear_probe}]"])
    knn, probe = cfg.evals
    assert (knn.kind, knn.k, knn.temperature, knn.fit_split, knn.split) == ("knn", 5, 0.1, "train", "val")
    assert probe.kind == "linear_probe"
    with pytest.raises(ConfigError, match="k=0 must be >= 1"):
        load_config("digits_vit", ["evals=[{kind: knn, k: 0}]"])
