"""Token labeling on plain tensors: label storage, crop/flip alignment, MixToken, the loss, ViT/VOLO students."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from vitscale.data.token_labels import TokenLabelStore, TokenLabelWriter, align_dense_labels, scatter_topk
from vitscale.models import create_model
from vitscale.models.volo import TokenMix
from vitscale.tasks.token_labeling import TokenLabelingTask, dense_forward, draw_mix_token
from vitscale.tasks.token_labeling_config import TokenLabelConfig


def _write_labels(root, n=6, grid=(4, 4), C=10, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    tok = torch.randn(n, *grid, C, generator=g).mul(3).softmax(-1)
    cls = torch.randn(n, C, generator=g).mul(3).softmax(-1)
    w = TokenLabelWriter(root, "train", n, grid, k, C, info={"teacher": "test"})
    w.write(torch.arange(0, n, 2), tok[0::2], cls[0::2])
    w.write(torch.arange(1, n, 2), tok[1::2], cls[1::2])
    w.close()
    return tok, cls


def test_writer_store_round_trip(tmp_path):
    tok, cls = _write_labels(tmp_path)
    store = TokenLabelStore(tmp_path, "train")
    assert (len(store), store.grid, store.topk, store.num_classes) == (6, (4, 4), 3, 10)
    idx = torch.tensor([4, 1])
    v, i = store.topk_maps(idx)  # (B, k, gh, gw)
    ref_v, ref_i = tok[idx].topk(3, dim=-1)
    torch.testing.assert_close(v, ref_v.permute(0, 3, 1, 2), atol=1e-3, rtol=1e-3)  # float16 storage
    assert torch.equal(i, ref_i.permute(0, 3, 1, 2))
    dense = store.dense(idx)  # (B, C, gh, gw), renormalised over the top-k
    torch.testing.assert_close(dense.sum(1), torch.ones(2, 4, 4))
    assert torch.equal(dense.argmax(1), tok[idx].argmax(-1))
    assert torch.equal(store.cls_targets(idx).argmax(1), cls[idx].argmax(-1))
    assert torch.equal(store.view_boxes(idx), torch.tensor([[0.0, 0.0, 1.0, 1.0]] * 2))
    # a missing row is an error at close time, and a bad index at read time
    w = TokenLabelWriter(tmp_path / "partial", "train", 3, (2, 2), 2, 10)
    w.write(torch.tensor([0]), tok[:1, :2, :2], cls[:1])
    with pytest.raises(RuntimeError, match="2 of 3"):
        w.close()
    with pytest.raises(IndexError):
        store.topk_maps(torch.tensor([6]))


def test_align_identity_crop_flip_and_subcrop():
    torch.manual_seed(0)
    dense = torch.rand(2, 5, 4, 4)
    dense = dense / dense.sum(1, keepdim=True)
    full = torch.tensor([[0.0, 0.0, 1.0, 1.0]] * 2)
    no_flip = torch.tensor([False, False])
    out = align_dense_labels(dense, full, no_flip, (4, 4))  # (B, oh, ow, C)
    torch.testing.assert_close(out, dense.permute(0, 2, 3, 1))
    out = align_dense_labels(dense, full, torch.tensor([True, False]), (4, 4))
    torch.testing.assert_close(out[0], dense[0].flip(-1).permute(1, 2, 0))
    torch.testing.assert_close(out[1], dense[1].permute(1, 2, 0))
    # the bottom-right quarter, at the map's own resolution: exactly that quarter
    quarter = torch.tensor([[0.5, 0.5, 0.5, 0.5]] * 2)
    out = align_dense_labels(dense, quarter, no_flip, (2, 2))
    torch.testing.assert_close(out, dense[:, :, 2:, 2:].permute(0, 2, 3, 1))
    # downsampling the whole map 4x4 -> 2x2 averages 2x2 cells
    out = align_dense_labels(dense, full, no_flip, (2, 2))
    torch.testing.assert_close(out, F.avg_pool2d(dense, 2).permute(0, 2, 3, 1))
    # a teacher view covering only the left half: the left half of the image is the whole map
    view = torch.tensor([[0.0, 0.0, 1.0, 0.5]] * 2)
    left = torch.tensor([[0.0, 0.0, 1.0, 0.5]] * 2)
    out = align_dense_labels(dense, left, no_flip, (4, 4), view=view)
    torch.testing.assert_close(out, dense.permute(0, 2, 3, 1))


def test_scatter_topk_is_a_distribution():
    v = torch.tensor([[[[0.5]], [[0.3]]]])  # (1, k=2, 1, 1)
    i = torch.tensor([[[[3]], [[1]]]])
    d = scatter_topk(v, i, 4)
    torch.testing.assert_close(d[0, :, 0, 0], torch.tensor([0.0, 0.375, 0.0, 0.625]))


def test_mix_token_box_is_keyed_and_lam_is_the_kept_area():
    a = draw_mix_token((14, 14), 8, 1.0, 1.0, seed=3, step=5)
    b = draw_mix_token((14, 14), 8, 1.0, 1.0, seed=3, step=5)
    assert a[0].box == b[0].box and a[1] == b[1]
    boxes = {draw_mix_token((14, 14), 8, 1.0, 1.0, seed=3, step=s)[0].box for s in range(20) if draw_mix_token((14, 14), 8, 1.0, 1.0, seed=3, step=s)[0]}
    assert len(boxes) > 5  # varies with the step
    mix, lam = a
    top, left, bottom, right = mix.box
    assert lam == pytest.approx(1 - (bottom - top) * (right - left) / 196)
    assert torch.equal(mix.perm, torch.arange(7, -1, -1))
    assert draw_mix_token((14, 14), 8, 1.0, 0.0, seed=3, step=5) == (None, 1.0)  # prob 0: never


def _task(tmp_path, C=10, **tl):
    cfg = types.SimpleNamespace(
        token_label=TokenLabelConfig(path=str(tmp_path), **tl),
        train=types.SimpleNamespace(label_smoothing=0.0, seed=0),
    )
    return TokenLabelingTask(cfg, None, C)


def _batch(n=4, size=32):
    torch.manual_seed(1)
    return {
        "image": torch.randn(n, 3, size, size),
        "label": torch.randint(0, 10, (n,)),
        "index": torch.arange(n),
        "crop": torch.tensor([[0.0, 0.0, 1.0, 1.0]] * n),
        "flip": torch.zeros(n, dtype=torch.bool),
    }


def test_loss_without_mix_is_cls_ce_plus_beta_token_ce(tmp_path):
    tok, _ = _write_labels(tmp_path, n=4, grid=(4, 4), k=10)  # k = C: exact distributions
    task = _task(tmp_path, beta=0.7, mix_token=False)
    model = create_model("volo_debug")
    batch = _batch()
    loss, metrics = task.loss(model, batch, step=0)
    with torch.no_grad():
        cls, tk = model(batch["image"], dense=True)
    ref_cls = F.cross_entropy(cls, batch["label"])
    ref_tok = -(tok.half().float() * F.log_softmax(tk, -1)).sum(-1).mean()
    torch.testing.assert_close(metrics["train_cls_loss"], ref_cls, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(metrics["train_token_loss"], ref_tok, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(loss, ref_cls + 0.7 * ref_tok, rtol=1e-3, atol=1e-3)
    loss.backward()
    assert model.aux_head.weight.grad.abs().sum() > 0


def test_mix_token_mixes_inputs_and_targets_with_one_box(tmp_path):
    _write_labels(tmp_path, n=4, grid=(4, 4), k=10)
    task = _task(tmp_path, mix_token=True)
    step = next(s for s in range(50) if draw_mix_token((4, 4), 4, 1.0, 1.0, 0, s)[0] is not None)
    mix, lam = draw_mix_token((4, 4), 4, 1.0, 1.0, 0, step)
    batch = _batch()
    cls_t, tok_t = task.targets(batch, (4, 4), "cpu")
    top, left, bottom, right = mix.box
    model = create_model("volo_debug").eval()  # eval: no dropout, fixed BN, deterministic
    loss, metrics = task.loss(model, batch, step)
    with torch.no_grad():
        cls, tk = model(batch["image"], dense=True, mix=mix)
    mixed_tok = tok_t.clone()
    mixed_tok[:, top:bottom, left:right] = tok_t.flip(0)[:, top:bottom, left:right]
    ref_tok = -(mixed_tok * F.log_softmax(tk, -1)).sum(-1).mean()
    ref_cls = -((lam * cls_t + (1 - lam) * cls_t.flip(0)) * F.log_softmax(cls, -1)).sum(-1).mean()
    torch.testing.assert_close(metrics["train_token_loss"], ref_tok, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(metrics["train_cls_loss"], ref_cls, rtol=1e-4, atol=1e-4)
    assert "train_top1" not in metrics


def test_vit_student_dense_outputs_and_pixel_mix_equals_token_mix():
    torch.manual_seed(0)
    model = create_model("vit_debug").eval()  # patch 8 on 32 px: 4x4 tokens
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        cls, tok = dense_forward(model, x)
        torch.testing.assert_close(cls, model(x))
        feats = model.forward_features(x)
        torch.testing.assert_close(tok, model.head(feats[:, 1:]).view(2, 4, 4, -1))
        assert model.cfg.pool == "token"  # restored
        mix = TokenMix((1, 0, 3, 2), torch.tensor([1, 0]))
        _, tok_mixed = dense_forward(model, x, mix)
        # tokens outside the box are untouched only up to attention mixing; inside the box the
        # patch embedding equals the partner's: check at the embedding level
        pe = model.patch_embed
        xm = x.clone()
        xm[:, :, 8:24, 0:16] = x[[1, 0], :, 8:24, 0:16]
        emb, emb_ref = pe(xm).view(2, 4, 4, -1), pe(x).view(2, 4, 4, -1)
        torch.testing.assert_close(emb[:, 1:3, 0:2], emb_ref[[1, 0], 1:3, 0:2])
        torch.testing.assert_close(emb[:, 0], emb_ref[:, 0])
    assert tok_mixed.shape == (2, 4, 4, 10)


def test_vit_student_trains_with_token_labels(tmp_path):
    _write_labels(tmp_path, n=4, grid=(2, 2), k=5)  # teacher grid 2x2 resampled to the 4x4 student grid
    task = _task(tmp_path, cls_target="teacher")
    model = create_model("vit_debug")
    loss, metrics = task.loss(model, _batch(), step=1)
    assert torch.isfinite(loss)
    loss.backward()
    assert model.head.weight.grad.abs().sum() > 0 and model.patch_embed.proj.weight.grad.abs().sum() > 0


def test_config_errors(tmp_path):
    with pytest.raises(ValueError, match="token_label.path"):
        TokenLabelingTask(types.SimpleNamespace(token_label=TokenLabelConfig(), train=None), None, 10)
    _write_labels(tmp_path)
    with pytest.raises(ValueError, match="classes"):
        _task(tmp_path, C=7)
