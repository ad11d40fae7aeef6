"""DINOv3's high-resolution stage, its data side: a mixture of (global, local) crop-size pairs, one
pair per optimizer step drawn by the pairs' ratios from (seed, epoch, step) — the same on 1 or N
ranks, with accumulation, and after a resume — and its settings refused in one line."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_views import _by_sample, _photos

from vitscale.data import build_loaders, data_config
from vitscale.data.views import mixture_index
from vitscale.tasks.dino_config import DinoConfig
from vitscale.tasks.dino_crops import dino_views

# facebookresearch/dinov3 dinov3/configs/train/dinov3_vit7b16_high_res_adapt.yaml lines 162-179
HIRES = dict(global_crops_sizes=[512, 768, 768, 768, 768], local_crops_sizes=[112, 112, 168, 224, 336],
             global_local_crop_pairs_ratios=[0.3, 0.3, 0.3, 0.05, 0.05])  # fmt: skip
SMALL = dict(global_crops_sizes=[16, 24], local_crops_sizes=[8, 8], global_local_crop_pairs_ratios=[0.75, 0.25],
             local_crops_number=2)  # fmt: skip


def test_the_mixtures_draws_are_keyed_and_honour_the_ratios():
    w = tuple(HIRES["global_local_crop_pairs_ratios"])
    draws = [mixture_index(w, 0, e, s) for e in range(4) for s in range(5000)]
    assert draws == [mixture_index(w, 0, e, s) for e in range(4) for s in range(5000)]  # a pure function of its key
    assert draws != [mixture_index(w, 1, e, s) for e in range(4) for s in range(5000)]  # another seed, other draws
    counts = Counter(draws)
    for k, r in enumerate(w):  # 20,000 steps: each share within 4 standard deviations of its ratio
        sd = (r * (1 - r) / len(draws)) ** 0.5
        assert abs(counts[k] / len(draws) - r) < 4 * sd, (k, counts[k] / len(draws), r)
    assert mixture_index((1.0,), 0, 0, 3) == 0


def test_dino_views_hold_one_views_per_pair():
    v = dino_views(DinoConfig(**HIRES), 16)
    assert [c.group("global").size for c in v.choices()] == [512, 768, 768, 768, 768]
    assert [c.group("local").size for c in v.choices()] == [112, 112, 168, 224, 336]
    assert v.weights == (0.3, 0.3, 0.3, 0.05, 0.05)
    assert [c.masks.grid for c in v.choices()] == [(32, 32), *[(48, 48)] * 4]  # iBOT's masks on each pair's patch grid
    assert dino_views(DinoConfig(), 16).mixture == ()  # DINOv2's one pair


def _loaders(root, *, micro, rank=0, world=1, accum=1, workers=0):
    cfg = data_config(format="imagefolder", train_path=str(root), num_workers=workers)
    views = dino_views(DinoConfig(**SMALL, ibot_mask_sample_probability=1.0), 4)
    return build_loaders(cfg, img_size=(32, 32), num_channels=3, seed=5, micro_batch_size=micro, eval_batch_size=4,
                         rank=rank, world_size=world, views=views, task="dino", grad_accum=accum).train  # fmt: skip


def _sizes(batches):
    return [(b["global"].shape[-1], b["local"].shape[-1], b["masks"].shape[-1]) for b in batches]


def test_each_step_cuts_one_pair_the_same_on_any_layout_and_after_a_resume(tmp_path):
    root = _photos(tmp_path / "photos", n=16)
    one = _loaders(root, micro=8)  # 2 steps of 8 an epoch
    epochs = [list(one) for _ in range(6)]
    sizes = [s for e in epochs for s in _sizes(e)]
    assert set(sizes) == {(16, 8, 16), (24, 8, 36)}  # both pairs met, masks on each pair's grid
    want = [mixture_index((0.75, 0.25), 5, e, s) for e in range(6) for s in range(2)]
    assert [0 if g == 16 else 1 for g, _, _ in sizes] == want
    ref = {e: _by_sample(b) for e, b in enumerate(epochs)}
    # 2 ranks of 4, and 2 micro-batches of 4 accumulated: each step's micro-batches share its pair, and
    # every sample's crops are the one-process run's
    for kw in ({"world": 2, "micro": 4}, {"accum": 2, "micro": 4}):
        ranks = [_loaders(root, rank=r, **kw) for r in range(kw.get("world", 1))]
        for e in range(6):
            got = {}
            for L in ranks:
                batches = list(L)
                step = [g for g, _, _ in _sizes(batches)]
                per = len(batches) // 2  # micro-batches per step on this rank
                assert step == [16 if k == 0 else 24 for k in want[2 * e:2 * e + 2] for _ in range(per)]
                got |= _by_sample(batches)
            assert got.keys() == ref[e].keys()
            assert all(torch.equal(got[i][0], ref[e][i][0]) and torch.equal(got[i][1], ref[e][i][1]) for i in got)
    resumed = _loaders(root, micro=8)
    resumed.load_state_dict({"epoch": 3, "batch_index": 1})  # mid-epoch
    assert _sizes(list(resumed)) == _sizes(epochs[3])[1:]
    workers = _loaders(root, micro=8, workers=2)
    assert _sizes(list(workers)) == _sizes(epochs[0])


@pytest.mark.parametrize("kw, msg", [
    ({**HIRES, "local_crops_sizes": [112, 112]}, "must have one entry per crop-size pair each"),
    ({**HIRES, "global_local_crop_pairs_ratios": [0.3, 0.3, 0.3, 0.05, 0.1]}, "must be shares in (0, 1] summing to 1"),
    ({**HIRES, "global_local_crop_pairs_ratios": [0.0, 0.6, 0.3, 0.05, 0.05]}, "must be shares in (0, 1] summing to 1"),
    ({**HIRES, "global_crops_sizes": [512, 768, 768, 768, 2048]}, "must be sides of 1 to 1024 pixels"),
    ({**HIRES, "local_crops_sizes": [112, 112, 168, 224, 1000]}, "a pair's local side 1000 is larger than its global side 768"),
    ({**HIRES, "global_crops_size": 256}, "global_crops_size=256 with a mixture of crop sizes"),
])  # fmt: skip
def test_a_bad_mixture_is_refused(kw, msg):
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        DinoConfig(**kw)
    DinoConfig(**HIRES, global_crops_size=512, local_crops_size=112)  # the first pair's sizes: accepted
