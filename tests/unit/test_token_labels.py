"""Token labeling on plain tensors: label storage, crop/flip alignment, MixToken, the loss, ViT/VOLO students."""

from __future__ import annotations

import json
import types

import pytest
import torch
import torch.nn.functional as F

from vitscale.data.token_label_files import LabelFileFolder, label_format
from vitscale.data.token_label_targets import mix_ground_truth, scatter_logits, token_label_targets
from vitscale.data.token_labels import TokenLabelStore, TokenLabelWriter
from vitscale.errors import CheckError
from vitscale.models import create_model
from vitscale.models.volo import TokenMix
from vitscale.tasks.token_labeling import TokenLabelingTask, dense_forward, draw_mix_token
from vitscale.tasks.token_labeling_config import TokenLabelConfig


def _write_labels(root, n=6, grid=(4, 4), C=10, k=3, seed=0):
    """A label folder of random teacher logits; returns them ``(n, gh, gw, C)``, ``(n, C)``."""
    g = torch.Generator().manual_seed(seed)
    tok = torch.randn(n, *grid, C, generator=g).mul(3)
    cls = torch.randn(n, C, generator=g).mul(3)
    w = TokenLabelWriter(root, "train", n, grid, k, C, info={"teacher": "test"})
    w.write(torch.arange(0, n, 2), tok[0::2], cls[0::2])
    w.write(torch.arange(1, n, 2), tok[1::2], cls[1::2])
    w.close()
    return tok, cls


def test_writer_store_round_trip(tmp_path):
    tok, cls = _write_labels(tmp_path)
    store = TokenLabelStore(tmp_path, "train")
    assert (len(store), store.grid, store.topk, store.num_classes) == (6, (4, 4), 3, 10)
    assert (store.meta["format"], store.meta["version"]) == ("topk_logits", 2)
    idx = torch.tensor([4, 1])
    v, i = store.topk_maps(idx)  # (B, k, gh, gw): the teacher's top-k logits, as TokenLabeling stores them
    ref_v, ref_i = tok[idx].topk(3, dim=-1)
    torch.testing.assert_close(v, ref_v.permute(0, 3, 1, 2), atol=1e-2, rtol=1e-3)  # float16 storage
    assert torch.equal(i, ref_i.permute(0, 3, 1, 2))
    cv, ci = store.cls_topk(idx)
    torch.testing.assert_close(cv, cls[idx].topk(3, -1).values, atol=1e-2, rtol=1e-3)
    assert torch.equal(ci, cls[idx].topk(3, -1).indices)
    assert torch.equal(store.view_boxes(idx), torch.tensor([[0.0, 0.0, 1.0, 1.0]] * 2))
    # a missing row is an error at close time, and a bad index at read time
    w = TokenLabelWriter(tmp_path / "partial", "train", 3, (2, 2), 2, 10)
    w.write(torch.tensor([0]), tok[:1, :2, :2], cls[:1])
    with pytest.raises(RuntimeError, match="2 of 3"):
        w.close()
    with pytest.raises(IndexError):
        store.topk_maps(torch.tensor([6]))


def test_a_folder_of_softmax_scores_is_refused_in_one_line(tmp_path):
    _write_labels(tmp_path)
    meta = json.loads((tmp_path / "token_labels.json").read_text())
    del meta["format"], meta["version"]  # what an older vitscale wrote
    (tmp_path / "token_labels.json").write_text(json.dumps(meta))
    with pytest.raises(CheckError) as e:
        TokenLabelStore(tmp_path)
    assert "\n" not in str(e.value) and "run `vitscale label-tokens` again" in str(e.value)


def test_a_folder_without_token_labels_is_refused_in_one_line(tmp_path):
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "a.jpg").write_bytes(b"")
    with pytest.raises(CheckError, match="holds no token labels: neither a token_labels.json"):
        label_format(tmp_path)
    torch.save(torch.zeros(2, 1, 1, 1).half(), tmp_path / "cat" / "a.pt")
    assert label_format(tmp_path) == "tokenlabeling" and label_format(tmp_path, "vitscale") == "vitscale"
    _write_labels(tmp_path / "ours")
    assert label_format(tmp_path / "ours") == "vitscale"


def _reference_targets(values, indices, C, crop, flip, size, smoothing):
    """TokenLabeling's code, in float64, on the crop drawn in its own order (flip, then crop:
    label_transforms_factory.py lines 58-81): get_featuremaps, the coords of mixup.py lines 54-55,
    get_label (its roi_align boxes and the softmax), line 72's smoothing."""
    from torchvision.ops import roi_align

    B, k, H, W = values.shape
    maps = torch.zeros(B, C, H, W, dtype=torch.float64)
    for b in range(B):  # get_featuremaps
        for j in range(k):
            for y in range(H):
                for x in range(W):
                    maps[b, int(indices[b, j, y, x]), y, x] = float(values[b, j, y, x])
    coords = []
    for b in range(B):
        top, left, h, w = (float(c) for c in crop[b])
        if flip[b]:  # RandomHorizontalFlipWithLabel: label.flip(3), before the crop
            maps[b] = maps[b].flip(-1)
            left = 1.0 - left - w  # the same pixels, in the flipped image
        coords.append([top, left, top + h, left + w])  # (i, j, h, w) with [:, 2:] += [:, :2]
    boxes = torch.cat([torch.arange(B).view(B, 1).double(), torch.tensor(coords, dtype=torch.float64) * W - 0.5], 1)
    tok = roi_align(maps, boxes, output_size=(size, size))
    cls = roi_align(maps, boxes, output_size=(1, 1))
    target = torch.cat([cls.view(B, C, 1), tok.view(B, C, size * size)], 2).softmax(1)
    off = smoothing / C
    target = target * (1.0 - smoothing + off) + off
    return target[:, :, 0], target[:, :, 1:].view(B, C, size, size).permute(0, 2, 3, 1)


def _draw(B=4, k=5, H=6, W=6, C=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(B, k, H, W, generator=g).mul(4).half().float()  # top-k logits (half storage)
    indices = torch.rand(B, C, H, W, generator=g).argsort(1)[:, :k]  # k distinct classes per location
    crop = torch.tensor([[0.1, 0.2, 0.6, 0.5], [0.0, 0.0, 1.0, 1.0], [0.35, 0.05, 0.4, 0.9], [0.5, 0.3, 0.45, 0.3]])
    flip = torch.tensor([False, True, True, False])
    return values, indices, C, crop[:B], flip[:B]


def test_reference_box_targets_are_the_reference_code_in_float64():
    values, indices, C, crop, flip = _draw()
    for size, smoothing in ((4, 0.1), (9, 0.0)):
        cls, tok = token_label_targets(values, indices, C, crop, flip, (size, size), smoothing=smoothing,
                                       reference_box=True)  # fmt: skip
        ref_cls, ref_tok = _reference_targets(values, indices, C, crop, flip, size, smoothing)
        torch.testing.assert_close(cls.double(), ref_cls, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(tok.double(), ref_tok, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(cls.sum(1), torch.full((4,), 1.0 + smoothing / C))  # as the reference: 1 + s / C


def test_geometric_targets_follow_the_crop():
    values, indices, C, crop, flip = _draw(seed=1)
    dense = torch.zeros(4, C, 6, 6, dtype=torch.float64).scatter_(1, indices, values.double())  # zeros elsewhere
    torch.testing.assert_close(scatter_logits(values, indices, C).double(), dense)
    # the whole image at the map's own grid: every token's target is its location's softmax, flipped with the image
    full = torch.tensor([[0.0, 0.0, 1.0, 1.0]] * 4)
    cls, tok = token_label_targets(values, indices, C, full, flip, (6, 6))
    want = dense.softmax(1)
    want = torch.where(flip.view(4, 1, 1, 1), want.flip(-1), want).permute(0, 2, 3, 1)
    torch.testing.assert_close(tok.double(), want, atol=1e-6, rtol=1e-5)
    # the crop's (x1, y1, x2, y2) = (left, top, right, bottom): the bottom-right quarter is those cells
    quarter = torch.tensor([[0.5, 0.5, 0.5, 0.5]] * 4)
    _, tok = token_label_targets(values, indices, C, quarter, torch.zeros(4, dtype=torch.bool), (3, 3))
    torch.testing.assert_close(tok.double(), dense[:, :, 3:, 3:].softmax(1).permute(0, 2, 3, 1), atol=1e-6, rtol=1e-5)
    # any crop: the reference's box order run on the transposed map samples the same cells, so its
    # targets are ours transposed; the class target is the crop pooled (1x1 RoIAlign) and soft-maxed
    no_flip = torch.zeros(4, dtype=torch.bool)
    cls, tok = token_label_targets(values, indices, C, crop, no_flip, (4, 4), smoothing=0.1)
    ref_cls, ref_tok = _reference_targets(values.transpose(2, 3), indices.transpose(2, 3), C, crop, no_flip, 4, 0.1)
    torch.testing.assert_close(cls.double(), ref_cls, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(tok.double(), ref_tok.transpose(1, 2), atol=1e-6, rtol=1e-5)


def test_ground_truth_mix_is_the_reference_ratio():
    target = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]])
    labels = torch.tensor([0, 2])  # the first agrees with the target's top class, the second does not
    out = mix_ground_truth(target, labels, smoothing=0.3)
    gt = torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.1, 0.8]])  # on = 1 - 0.3 + 0.1, off = 0.1
    torch.testing.assert_close(out, torch.stack([target[0] * 0.5 + gt[0] * 0.5, target[1] * 0.9 + gt[1] * 0.1]))


def _save(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)


@pytest.mark.parametrize("obj, message", [
    ({"maps": torch.zeros(2, 5, 3, 3).half()}, "holds a dict, not a tensor"),
    (torch.zeros(5, 3, 3).half(), "shape [5, 3, 3], not [2, k, H, W]"),
    (torch.zeros(2, 5, 3, 3, dtype=torch.int64), "torch.int64, not float16"),
    (torch.stack([torch.zeros(5, 3, 3), torch.full((5, 3, 3), 10.0)]).half(), "class indices must be integers in [0, 10)"),
    (types.SimpleNamespace(a=1), "refused by torch.load(weights_only=True): the pickle holds more than tensors"),
    (None, "does not exist"),
    # 8 bytes viewed with stride 0 as [2, 5, 32768, 32768] (converting it asked for 16 GB and more): the one
    # bounded reader (vitscale.interop.pretrained.read_pickle) refuses the view before a value is read
    (torch.zeros(1).half().expand(2, 5, 1 << 15, 1 << 15), "nothing of it is read"),
])  # fmt: skip
def test_label_files_of_another_kind_are_refused_in_one_line(tmp_path, obj, message):
    good = torch.stack([torch.randn(5, 3, 3), torch.arange(5.0).view(5, 1, 1).expand(5, 3, 3)]).half()
    _save(tmp_path / "cat" / "a.pt", good)
    if obj is not None:
        _save(tmp_path / "cat" / "b.pt", obj)
    folder = LabelFileFolder(tmp_path, 10)
    folder.bind(["/data/train/cat/a.JPEG", "/data/train/cat/b.JPEG"])  # <class>/<name up to its first dot>.pt
    v, i = folder.topk_maps(torch.tensor([0, 0]))
    assert v.shape == (2, 5, 3, 3) and torch.equal(i[0, :, 0, 0], torch.arange(5))
    with pytest.raises(CheckError) as e:
        folder.topk_maps(torch.tensor([1]))
    assert "\n" not in str(e.value) and str(tmp_path / "cat" / "b.pt") in str(e.value) and message in str(e.value)


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
    task = _task(tmp_path, beta=0.7, mix_token=False, cls_target="ground_truth")
    model = create_model("volo_debug")
    batch = _batch()
    loss, metrics = task.loss(model, batch, step=0)
    with torch.no_grad():
        cls, tk = model(batch["image"], dense=True)
    ref_cls = F.cross_entropy(cls, batch["label"])
    ref_tok = -(tok.half().float().softmax(-1) * F.log_softmax(tk, -1)).sum(-1).mean()  # the whole image, every class
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
