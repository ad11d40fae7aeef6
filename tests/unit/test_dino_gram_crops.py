"""DINOv3's Gram teacher's own crops and its loss weights (facebookresearch/dinov3 at 6876159): the Gram
crops cut from each global crop's box, larger, with its flip and either its distortions or none
(``dinov3/data/augmentations.py`` lines 66-108, 193-201); its patch features resized to the student's
grid (``ssl_meta_arch.py`` lines 493-510); the loss weights' schedule (``cosine_lr_scheduler.py``
``linear_warmup_cosine_decay``) against its formula written with numpy; the local terms' weight
(``ssl_meta_arch.py`` lines 601-633); and each new key refused in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image
from test_views import _photos

from vitscale.data import build_loaders, data_config
from vitscale.data.decode import pil_to_uint8_tensor
from vitscale.data.views import ViewTransform, check_views
from vitscale.tasks.dino_config import DinoConfig
from vitscale.tasks.dino_crops import dino_views
from vitscale.tasks.dino_loss import cross_entropy, dino_loss, warmup_cosine_at
from vitscale.tasks.gram import resize_patches

BASE = dict(global_crops_size=16, local_crops_number=2, local_crops_size=8, gram_loss_weight=1.0)
PLAIN = dict(color_jitter=0.0, gaussian_blur=[0.0, 0.0, 0.0], solarization=0.0)  # no distortion drawn true (but greyscale)


def _photo():
    y, x = np.mgrid[0:72, 0:96]
    a = np.stack([x * 255 / 96, y * 255 / 72, (3 * x + 5 * y) % 256], -1)
    return torch.from_numpy(np.clip(a, 0, 255).astype(np.uint8)).permute(2, 0, 1).contiguous()


def _cut(seed=0, index=0, **kw):
    tf = ViewTransform(data_config(format="digits"), (32, 32), 3, seed, dino_views(DinoConfig(**kw), 4))
    return tf.tensor_train(_photo(), 0, index).image


def _grey(t: torch.Tensor) -> torch.Tensor:
    """Luminance (PIL's ``L``): the same whether or not the crop drew its greyscale (p 0.2)."""
    return torch.from_numpy(np.array(Image.fromarray(t.permute(1, 2, 0).numpy()).convert("L"), dtype=np.float32))


def _resized(t: torch.Tensor, side: int) -> torch.Tensor:
    img = Image.fromarray(t.permute(1, 2, 0).numpy())
    return pil_to_uint8_tensor(img.resize((side, side), Image.Resampling.BICUBIC))


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_undistorted_gram_crops_are_the_global_boxes_larger_and_leave_every_other_view_as_it_was(index):
    alone = _cut(index=index, **BASE)
    both = _cut(index=index, **BASE, gram_teacher_crops_size=24, gram_teacher_no_distortions=True)
    assert both.crops["gram"][0].shape == (3, 24, 24) and len(both.crops["gram"]) == 2
    for name in ("global", "local"):  # the other views draw as without the Gram crops
        assert all(torch.equal(a, b) for a, b in zip(alone.crops[name], both.crops[name], strict=True)), name
    assert torch.equal(alone.masks, both.masks)
    # undistorted: the same crops whatever the distortions' probabilities (each drawn whatever its value)
    plain = _cut(index=index, **BASE, **PLAIN, gram_teacher_crops_size=24, gram_teacher_no_distortions=True)
    assert all(torch.equal(a, b) for a, b in zip(both.crops["gram"], plain.crops["gram"], strict=True))
    # the same box and flip as its global crop: brought to 16 px it is that crop undistorted, not the other one
    for k in range(2):
        near = (_grey(_resized(plain.crops["gram"][k], 16)) - _grey(plain.crops["global"][k])).abs().mean()
        far = (_grey(_resized(plain.crops["gram"][k], 16)) - _grey(plain.crops["global"][1 - k])).abs().mean()
        assert near < 1 and far > 5 * near, (k, near, far)


def test_distorted_gram_crops_share_the_global_crops_distortions():
    for index in range(4):
        v = _cut(index=index, **BASE, gram_teacher_crops_size=24, gram_teacher_no_distortions=False)
        for k in range(2):  # one crop at 24 px, distorted once; the global crop resized from it (DINOv3's order)
            assert torch.equal(v.crops["global"][k], _resized(v.crops["gram"][k], 16)), (index, k)


def test_the_loader_stacks_the_gram_crops_per_pair_and_normalises_them(tmp_path):
    root = _photos(tmp_path / "photos", n=8)
    dc = DinoConfig(**BASE, global_crops_sizes=[16, 24], local_crops_sizes=[8, 8], global_local_crop_pairs_ratios=[0.5, 0.5],
                    gram_teacher_crops_sizes=[24, 32], gram_teacher_no_distortions=True)  # fmt: skip
    cfg = data_config(format="imagefolder", train_path=str(root))
    views = dino_views(dc, 4)
    loader = build_loaders(cfg, img_size=(32, 32), num_channels=3, seed=5, micro_batch_size=4, eval_batch_size=4,
                           views=views, task="dino").train  # fmt: skip
    seen = set()
    for _ in range(4):
        for b in loader:
            g, gram = b["global"].shape[-1], b["gram"].shape
            assert gram == (8, 3, {16: 24, 24: 32}[g], {16: 24, 24: 32}[g]) and b["gram"].dtype == torch.float32
            seen.add(g)
    assert seen == {16, 24}
    assert "gram" not in dict(dino_views(DinoConfig(**BASE), 4).crops)  # no crops of its own: it reads the global crops
    check_views(views, cfg, (32, 32), "dino")  # the teacher's 32 px within the loader's 32


def test_the_gram_teachers_features_are_resized_as_maps_on_the_students_grid():
    y, x = torch.meshgrid(torch.arange(6.0), torch.arange(6.0), indexing="ij")
    feats = torch.stack([y, x, torch.ones_like(y)], -1).reshape(1, 36, 3)  # (B, N, D): each patch's row, column, 1
    for mode in ("bicubic", "bilinear"):
        out = resize_patches(feats, (6, 6), (4, 4), mode).reshape(4, 4, 3)
        assert out.shape == (4, 4, 3)
        assert torch.all(out[1:, :, 0] > out[:-1, :, 0]) and torch.all(out[:, 1:, 1] > out[:, :-1, 1])  # rows stay rows
        assert torch.allclose(out[:, :, 0], out[:, :1, 0].expand(4, 4)) and torch.allclose(out[..., 2], torch.ones(4, 4))
        want = torch.nn.functional.interpolate(feats.transpose(1, 2).reshape(1, 3, 6, 6), size=(4, 4), mode=mode,
                                               align_corners=False).flatten(2).transpose(1, 2)  # fmt: skip
        assert torch.allclose(resize_patches(feats, (6, 6), (4, 4), mode), want)
    with pytest.raises(ValueError, match="35 patch features are not a 6x6 grid"):
        resize_patches(feats[:, :35], (6, 6), (4, 4))


def _reference_schedule(start, peak, end, warmup, total, cosine=None):
    """``linear_warmup_cosine_decay`` as dinov3/train/cosine_lr_scheduler.py lines 76-85 state it."""
    cosine = total - warmup if cosine is None else cosine
    lin = np.linspace(start, peak, warmup, endpoint=False)
    cos = (peak - end) * (np.cos(np.linspace(0, np.pi, cosine)) + 1) / 2 + end
    return np.concatenate([lin, cos, np.full(total - warmup - cosine, end)])


@pytest.mark.parametrize("sched, total", [
    ([0.0, 0.0, 2.0, 10, 7], 25),   # the Gram-anchoring stage's Gram weight, 1000 epochs and 1 shrunk
    ([1.0, 1.0, 0.5, 10, 7], 25),   # its local weight
    ([1.5, 1.5, 1.5, 0, 0], 9),     # the high-resolution stage's constants
    ([0.5, 0.5, 0.5, 0], 9),        # DINOv3's default (no cosine_epochs: over the rest)
    ([0.0, 1.0, 0.2, 3], 12), ([0.3, 1.0, 0.2, 2, 1], 5),
])  # fmt: skip
def test_the_weight_schedules_are_dinov3s(sched, total):
    want = _reference_schedule(*sched[:4], total, *(sched[4:] or [None]))
    got = [warmup_cosine_at(it, sched, total) for it in range(total)]
    assert got == pytest.approx(want.tolist(), abs=1e-12)
    assert warmup_cosine_at(total + 5, sched, total) == sched[2]  # past the run: the end


def test_the_local_terms_weight_is_dinov3s_share_times_the_weight():
    g = torch.Generator().manual_seed(0)
    s_g = [torch.randn(4, 16, generator=g) for _ in range(2)]
    s_l = [torch.randn(4, 16, generator=g) for _ in range(3)]
    t = [torch.softmax(torch.randn(4, 16, generator=g), -1) for _ in range(2)]
    ce = lambda tt, ss: cross_entropy(tt, ss, 0.1).mean()  # noqa: E731
    glob = (ce(t[1], s_g[0]) + ce(t[0], s_g[1])) / 2  # DINOv3's DINOLoss with ignore_diagonal: the mean of 2 terms
    loc = sum(ce(tt, ss) for ss in s_l for tt in t) / 6  # and of the 6 local ones
    for w in (0.5, 0.0, 2.0):
        want = 2 / 8 * glob + 6 / 8 * w * loc  # dino_global_scale, dino_local_scale x weight (lines 602-633)
        assert dino_loss(s_g, s_l, t, 0.1, local_weight=w).item() == pytest.approx(want.item(), rel=1e-6)
    assert torch.equal(dino_loss(s_g, s_l, t, 0.1, local_weight=1.0), dino_loss(s_g, s_l, t, 0.1))


@pytest.mark.parametrize("kw, msg", [
    ({"gram_teacher_crops_size": 4096}, "gram_teacher_crops_size=4096 must be 1 to 2048 pixels"),
    ({"gram_teacher_crops_sizes": [24, 32]}, "lists one side per crop-size pair of a mixture"),
    ({"global_crops_sizes": [16, 24], "local_crops_sizes": [8, 8], "global_local_crop_pairs_ratios": [0.5, 0.5],
      "gram_teacher_crops_sizes": [24]}, "gram_teacher_crops_sizes=[24] must have one entry per crop-size pair (2"),
    ({"global_crops_sizes": [16, 24], "local_crops_sizes": [8, 8], "global_local_crop_pairs_ratios": [0.5, 0.5],
      "gram_teacher_crops_sizes": [24, 32], "gram_teacher_crops_size": 32}, "leave gram_teacher_crops_size out or set it to the first pair's, 24"),
    ({"gram_ema_teacher": True, "gram_rep_update": False, "gram_teacher_crops_size": 24}, "leave gram_teacher_crops_size(s) out"),
    ({"gram_global_teacher_resize_method": "nearest"}, "gram_global_teacher_resize_method='nearest': choose one of bicubic, bilinear"),
    ({"gram_loss_weight_schedule": [1.5, 1.5, 1.5]}, "must be [start, peak, end, warmup_steps] or"),
    ({"local_loss_weight_schedule": [-1, 1, 1, 0]}, "the weights (start, peak, end) must be finite numbers >= 0"),
    ({"local_loss_weight_schedule": [1, 1, 1, 2.5]}, "warmup_steps and cosine_steps must be whole optimizer steps >= 0"),
    ({"gram_loss_weight_schedule": [1, 1, math.inf, 0]}, "the weights (start, peak, end) must be finite numbers >= 0"),
    ({"gram_loss_weight": 0.0, "gram_loss_weight_schedule": [1, 1, 1, 0]}, "is for the Gram loss, which is off: set gram_loss_weight > 0"),
    ({"gram_loss_weight": 0.0, "gram_teacher_crops_size": 24}, "gram_teacher_crops_size=24 is for the Gram loss, which is off"),
])  # fmt: skip
def test_each_new_key_is_refused_in_one_line_out_of_range(kw, msg):
    with pytest.raises(ValueError) as e:
        DinoConfig(**{**BASE, **kw})
    assert msg in str(e.value) and "\n" not in str(e.value), str(e.value)
