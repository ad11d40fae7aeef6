"""Variable resolution on the data side: the size and batch of every step from the keyed randomness
(the same on every rank layout and after a resume), NaFlex samples fitted to a sequence length at their
aspect ratio in timm's patch layout, and the one-line refusals of what cannot run."""

from __future__ import annotations

import math

import pytest
import torch

from vitscale.config.data import data_config
from vitscale.data.build import build_loaders
from vitscale.data.naflex import fit_grid, pad_batch, patchify
from vitscale.data.sizes import check_sizes, size_plan
from vitscale.data.sizesampler import SizedBatchSampler
from vitscale.errors import CheckError

STATS = dict(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), num_workers=0)


def _plan(accum=1, world=1, **data):
    d = data_config(format="digits", **data)
    return size_plan(d, patch=4, batch_size=8 * world * accum, parts=world * accum, seed=3, accum=accum)


@pytest.mark.parametrize("hw", [(24, 40), (32, 32), (40, 24), (8, 30), (100, 7), (5, 5)])
@pytest.mark.parametrize("seq_len", [4, 36, 64, 100])
def test_fit_grid_fills_the_sequence_at_the_aspect_ratio(hw, seq_len):
    h, w = hw
    gh, gw = fit_grid(h, w, seq_len, 4)
    assert 1 <= gh * gw <= seq_len
    # one more patch row (or column, at the image's scale) would not fit: the grid is as large as it can be
    s = max(gh / h, gw / w) * 1.0001
    assert math.ceil(h * s) * math.ceil(w * s) > seq_len or gh * gw == seq_len or min(gh, gw) == 1
    if min(gh, gw) > 2:  # the aspect ratio is kept up to one patch of rounding on each side
        assert abs(math.log((gh / gw) / (h / w))) <= math.log((gh + 1) / (gh - 1)) + math.log((gw + 1) / (gw - 1))


def test_fit_grid_known_values():
    assert fit_grid(24, 40, 64, 4) == (6, 10)  # 60 tokens: the 24x40 image at its own resolution
    assert fit_grid(32, 32, 64, 4) == (8, 8)
    assert fit_grid(40, 24, 36, 4) == (7, 5)
    assert fit_grid(10, 100, 3, 4) == (1, 3)  # past the most elongated grid: the long side is cut


def test_patch_layout_is_the_models():
    """The data side's patches, coordinates and mask are exactly what the NaFlex model reads (timm's layout)."""
    from vitscale.models.naflex.patches import to_patch_batch

    g = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8) for h, w in ((8, 12), (16, 4), (4, 4))]
    ours = pad_batch([patchify(im, 4) for im in images], [(im.shape[1] // 4, im.shape[2] // 4) for im in images], 9)
    ref = to_patch_batch(images, 4, seq_len=9)
    for k in ref:
        assert torch.equal(ours[k], ref[k]), k


def test_each_step_draws_its_size_from_seed_and_step():
    plan = _plan(image_sizes=(24, 32, 40))
    sizes = [plan.index(s) for s in range(300)]
    assert sizes == [_plan(image_sizes=(24, 32, 40)).index(s) for s in range(300)]  # a pure function of (seed, step)
    assert {0, 1, 2} == set(sizes) and max(sizes.count(k) for k in range(3)) < 130  # every size, about equally
    other = size_plan(data_config(format="digits", image_sizes=(24, 32, 40)), patch=4, batch_size=8, parts=1, seed=4, accum=1)
    assert sizes != [other.index(s) for s in range(300)]  # another seed, another draw


def test_progressive_schedule_grows_in_stages():
    plan = _plan(image_sizes=(24, 32, 40), size_schedule="progressive", size_stages=(0, 0.5, 0.8))
    plan.total_steps = 100
    got = [plan.sizes[plan.index(s)] for s in range(100)]
    assert got == [24] * 50 + [32] * 30 + [40] * 20


def test_token_budget_sets_each_sizes_batch():
    plan = _plan(world=2, seq_lens=(36, 64, 100), tokens_per_batch=4096)
    assert plan.batches == (112, 64, 40)  # budget // seq_len, a multiple of the 2 ranks
    plan = _plan(image_sizes=(24, 32, 40), tokens_per_batch=4096)
    assert plan.batches == (113, 64, 40)  # (side / patch)^2 tokens an image
    assert _plan(image_sizes=(24, 32), batch_sizes=(96, 48)).batches == (96, 48)


@pytest.mark.parametrize("world,accum", [(2, 1), (2, 2), (1, 2)])
def test_ranks_and_micro_batches_split_the_one_process_step(world, accum):
    """The union over ranks (and micro-batches) of a step is the one-process step, at one size."""
    n = 50
    one = SizedBatchSampler(n, _plan(seq_lens=(36, 64, 100), batch_sizes=(12, 8, 4)))
    split = _plan(accum=accum, world=world, seq_lens=(36, 64, 100), batch_sizes=(12, 8, 4))
    ranks = [SizedBatchSampler(n, split, rank=r, world_size=world) for r in range(world)]
    assert split.batches == one.plan.batches
    for step in range(40):  # several passes over the 50 samples
        got = [it for r in ranks for j in range(accum) for it in r.micro_batch(step * accum + j)]
        ref = one.micro_batch(step)
        assert sorted(got) == sorted(ref) and len({size for _, _, size in got}) == 1, step


def test_resume_continues_the_same_batches():
    plan = _plan(image_sizes=(24, 32, 40))
    full = SizedBatchSampler(200, plan)
    full.set_position(0, 0, through_epochs=True)
    it = iter(full)
    ref = [next(it) for _ in range(3 * len(full))]
    resumed = SizedBatchSampler(200, _plan(image_sizes=(24, 32, 40)))
    resumed.set_position(1, 3, through_epochs=True)  # epoch 1, its 4th batch: a new sampler, as after a restart
    it = iter(resumed)
    assert [next(it) for _ in range(len(full) * 2 - 3)] == ref[len(full) + 3:]


def test_naflex_loader_batches():
    d = data_config(format="digits_aspect", seq_lens=(36, 64), tokens_per_batch=640,
                   random_erasing=1.0, hflip=0.5, auto_augment="rand-m9-mstd0.5-inc1", **STATS)  # fmt: skip
    loaders = build_loaders(d, img_size=(32, 32), num_channels=3, seed=0, micro_batch_size=10, eval_batch_size=100, patch=4)
    seen = set()
    for i, b in enumerate(loaders.train):
        x = b["image"]
        B, L, F = x["patches"].shape
        seen.add(L)
        assert F == 4 * 4 * 3 and B == 640 // L and x["patch_valid"].shape == (B, L)
        n = x["patch_valid"].sum(1)
        assert torch.equal(n, b["grid"].prod(1)) and (n <= L).all()
        assert (x["patches"][~x["patch_valid"]] == 0).all()  # padding stays zero after normalisation
        if i == 6:
            break
    assert seen == {36, 64}
    # random erasing (drawn for every image here) changes real patches on the patch layout, never padding
    a, b = (next(iter(build_loaders(data_config(**{**vars(d), "random_erasing": p}), img_size=(32, 32), num_channels=3, seed=0,
                                    micro_batch_size=10, eval_batch_size=100, patch=4).train))["image"] for p in (1.0, 0.0))  # fmt: skip
    assert torch.equal(a["patch_valid"], b["patch_valid"]) and torch.equal(a["patch_coord"], b["patch_coord"])
    changed = (a["patches"] != b["patches"]).any(-1)  # (B, L) patches that erasing touched
    assert changed.any(1).float().mean() > 0.9 and not (changed & ~a["patch_valid"]).any()
    val = next(iter(loaders.val))["image"]
    assert val["patches"].shape[:2] == (100, 64)  # evaluation at the largest sequence length
    grids = {tuple(g) for g in next(iter(loaders.val))["grid"].tolist()}
    assert grids == {(6, 10), (8, 8), (10, 6)}  # the three aspect ratios, whole images


@pytest.mark.parametrize("data,msg", [
    (dict(image_sizes=(2, 32)), "data.image_sizes[0]=2 is smaller than one patch (4 px)"),
    (dict(image_sizes=(24, 30)), "data.image_sizes[1]=30 is not divisible by the model's patch size 4"),
    (dict(seq_lens=(36, 64), tokens_per_batch=50), "data.tokens_per_batch=50 is below one sequence per rank"),
    (dict(image_sizes=(24,), batch_sizes=(8, 8)), "data.batch_sizes has 2 entries for 1 sizes"),
    (dict(seq_lens=(36,), image_sizes=(24,)), "data.image_sizes and data.seq_lens are two ways"),
    (dict(image_sizes=(24, 32), size_stages=(0.5, 0.8)), "data.size_stages=[0.5, 0.8] must give"),
])  # fmt: skip
def test_check_sizes_refuses_in_one_line(data, msg):
    with pytest.raises(CheckError) as e:
        check_sizes(data_config(format="digits", **data), patch=4, batch_size=8, parts=2)
    assert msg in str(e.value) and "\n" not in str(e.value)


def _naflex_batch(grids, seq_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = [torch.randn(3, h * 4, w * 4, generator=g) for h, w in grids]
    return images, pad_batch([patchify(im, 4) for im in images], list(grids), seq_len)


def test_naflex_mixup_of_equal_grids_is_the_image_mixup():
    from vitscale.data.mixup import Mixup

    mix = Mixup(mixup_alpha=0.8, num_classes=10, label_smoothing=0.1, seed=1)
    images, x = _naflex_batch([(3, 5)] * 4, 15)
    labels = torch.tensor([1, 2, 3, 4])
    got, y = mix(x, labels, step=7, grid=torch.tensor([(3, 5)] * 4))
    ref_images, ref_y = mix(torch.stack(images), labels, step=7)
    assert torch.allclose(got["patches"], pad_batch([patchify(im, 4) for im in ref_images], [(3, 5)] * 4, 15)["patches"])
    assert torch.allclose(y, ref_y)


@pytest.mark.parametrize("mode", ["mixup", "cutmix"])
def test_naflex_mixup_mixes_the_central_overlap_and_weights_targets_by_tokens(mode):
    from vitscale.data.mixup import Mixup

    mix = Mixup(mixup_alpha=0.8 if mode == "mixup" else 0, cutmix_alpha=1.0 if mode == "cutmix" else 0, num_classes=4, seed=2)
    grids = [(6, 10), (8, 8), (10, 6), (4, 4)]
    _, x = _naflex_batch(grids, 64)
    labels = torch.tensor([0, 1, 2, 3])
    step = next(s for s in range(50) if mix.params(s, 100, 100)[0] == mode and 0.2 < mix.params(s, 100, 100)[1] < 0.8)
    out, y = mix(x, labels, step, grid=torch.tensor(grids))
    changed = (out["patches"] != x["patches"]).any(-1)  # (B, L)
    assert not (changed & ~x["patch_valid"]).any()  # padding never mixed
    assert torch.allclose(y.sum(1), torch.ones(4)) and changed.any()
    for i, (gh, gw) in enumerate(grids):
        j = 3 - i  # the partner: the reversed batch
        oh, ow = min(gh, grids[j][0]), min(gw, grids[j][1])
        rows, cols = x["patch_coord"][i][changed[i]].unbind(-1)  # changed patches lie in the central overlap
        assert (rows >= (gh - oh) // 2).all() and (rows < (gh - oh) // 2 + oh).all()
        assert (cols >= (gw - ow) // 2).all() and (cols < (gw - ow) // 2 + ow).all()
        if mode == "cutmix":  # the target weight of the partner is the share of the image's tokens it took
            assert y[i, labels[j]] == pytest.approx(int(changed[i].sum()) / (gh * gw), abs=1e-6)


def test_each_size_compiles_once():
    """Under train.compile a variable-resolution run compiles each size once with static shapes and
    reuses it (vitscale.distributed.compile.bound_recompiles): 3 sizes, 9 steps -> 3 graphs, none dynamic."""
    import torch._dynamo

    keys = ("automatic_dynamic_shapes", "cache_size_limit", "accumulated_cache_size_limit")
    saved = {k: getattr(torch._dynamo.config, k) for k in keys if hasattr(torch._dynamo.config, k)}
    with torch._dynamo.config.patch(**saved):  # the process's settings are restored afterwards
        _compiles_per_size()
    assert {k: getattr(torch._dynamo.config, k) for k in saved} == saved


def _compiles_per_size():
    import torch._dynamo

    from vitscale.distributed.compile import bound_recompiles

    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):  # counts compiles, runs the graph as it is
        graphs.append([tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)])
        return gm.forward

    bound_recompiles(3)
    block = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    fn = torch.compile(block, backend=backend)
    for step in range(9):
        fn(torch.randn(2, (36, 64, 100)[step % 3], 16))
    assert len(graphs) == 3 and all(all(isinstance(d, int) for s in g for d in s) for g in graphs)
    torch._dynamo.reset()
