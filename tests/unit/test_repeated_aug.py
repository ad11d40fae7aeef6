"""data.repeated_aug (DeiT's RASampler): each image ``repeats`` times per epoch on consecutive ranks,
each repeat with its own keyed augmentation, the epoch's length kept, the same global batches on any
number of ranks, and exact after a resume mid-epoch."""

from collections import Counter

import pytest
import torch
from helpers import assert_same_batch, take

from vitscale.data import build_loaders, data_config
from vitscale.data.keyed import epoch_permutation
from vitscale.data.sampler import ShardedBatchSampler
from vitscale.errors import CheckError, ConfigError

N, SEED = 96, 3


def _epoch_items(world, micro, repeats, epoch=0, n=N, drop_last=True):
    """Every rank's items of ``epoch``, as ``[step][rank] -> items``."""
    samplers = [ShardedBatchSampler(n, micro, seed=SEED, rank=r, world_size=world, repeats=repeats, drop_last=drop_last)
                for r in range(world)]  # fmt: skip
    for s in samplers:
        s.set_position(epoch, 0)
    per_rank = [list(s) for s in samplers]
    assert len({len(b) for b in per_rank}) == 1
    return [[per_rank[r][b] for r in range(world)] for b in range(len(per_rank[0]))]


def test_epoch_length_is_kept():
    for world, micro in ((1, 8), (2, 4), (4, 2), (3, 5)):
        plain = ShardedBatchSampler(N, micro, seed=SEED, world_size=world)
        rep = ShardedBatchSampler(N, micro, seed=SEED, world_size=world, repeats=3)
        assert len(rep) == len(plain) == N // (micro * world)
        steps = _epoch_items(world, micro, 3)
        assert len(steps) == len(rep) and all(len(items) == micro for step in steps for items in step)
    tail = ShardedBatchSampler(N, 10, seed=SEED, world_size=2, repeats=3, drop_last=False)
    assert len(tail) == 5  # ceil(96 / 20), as without repeats


def test_each_image_repeats_times_on_different_ranks():
    """96 samples an epoch, 3 repeats: 32 images, each exactly 3 times over the 4 ranks, each repeat
    (0, 1, 2) once and on another rank; they are the first 32 of the epoch's permutation."""
    steps = _epoch_items(world=4, micro=2, repeats=3)
    seen: dict[int, list[tuple[int, int]]] = {}
    for step in steps:
        for rank, items in enumerate(step):
            for epoch, index, size, repeat in items:
                assert epoch == 0 and size is None
                seen.setdefault(index, []).append((rank, repeat))
    assert len(seen) == N // 3
    assert set(seen) == set(epoch_permutation(N, SEED, 0)[: N // 3].tolist())
    for index, where in seen.items():
        assert sorted(r for _, r in where) == [0, 1, 2], index
        assert len({rank for rank, _ in where}) == 3, (index, where)  # three different ranks
    other = {i for step in _epoch_items(4, 2, 3, epoch=1) for items in step for _, i, _, _ in items}
    assert other != set(seen)  # the next epoch draws another third


def test_partial_epoch_end_wraps_like_the_plain_sampler():
    """Without drop_last: 96 samples over 5 ranks of 4 end in a global batch of 16, which wraps round
    to the stream's start (4 more positions, so every rank gets one): the first 32 images of the
    permutation 3 times each, and positions 0-3 again (image 0 three more times, image 1 once)."""
    steps = _epoch_items(world=5, micro=4, repeats=3, drop_last=False)
    counts = Counter(i for step in steps for items in step for _, i, _, _ in items)
    perm = epoch_permutation(N, SEED, 0).tolist()
    assert counts == Counter({i: 3 for i in perm[:32]}) + Counter({perm[0]: 3, perm[1]: 1})


def test_same_global_batch_on_one_or_two_ranks():
    """The union over ranks of a step's items (image, repeat) is the one-process step's, as a
    multiset and in the strided order."""
    one = _epoch_items(world=1, micro=8, repeats=3)
    two = _epoch_items(world=2, micro=4, repeats=3)
    assert len(one) == len(two) == N // 8
    for a, b in zip(one, two):
        assert Counter(a[0]) == Counter(b[0] + b[1])
        assert b[0] == a[0][0::2] and b[1] == a[0][1::2]


def test_repeated_aug_1_is_todays_sampler():
    """repeats=1: the items are the (epoch, index) of the keyed permutation, cut into global batches
    and dealt strided, as before repeated augmentation existed."""
    perm = epoch_permutation(N, SEED, 2).tolist()
    s = ShardedBatchSampler(N, 4, seed=SEED, rank=1, world_size=2)
    s.set_position(2, 0)
    assert list(s) == [[(2, i) for i in perm[b * 8:(b + 1) * 8][1::2]] for b in range(N // 8)]


# ---------------------------------------------------------------- through the loader (augmentation)
def _cfg(**kw):
    base = dict(format="synthetic", synthetic_size=N, num_classes=7, num_workers=0, val_split=0.0,
                auto_augment="rand-m9-mstd0.5-inc1", random_erasing=0.5, hflip=0.5, rrc_scale=(0.3, 1.0))
    return data_config(**(base | kw))


def _train(cfg, micro=6, rank=0, world=1):
    return build_loaders(cfg, img_size=(16, 16), num_channels=3, seed=SEED, micro_batch_size=micro,
                         eval_batch_size=10, rank=rank, world_size=world).train  # fmt: skip


def test_repeats_get_different_augmentations_and_repeat_0_keeps_todays():
    """Over an epoch, the 3 repeats of an image have 3 different crops and pixels; repeat 0 is the
    sample repeated_aug=1 gives the same (epoch, index) (its keys are unchanged)."""
    L = _train(_cfg(repeated_aug=3))
    epoch = list(L)
    by_image: dict[int, list[tuple]] = {}
    for b in epoch:
        for j, i in enumerate(b["index"].tolist()):
            by_image.setdefault(i, []).append((b["crop"][j], b["image"][j]))
    assert len(by_image) == N // 3 and all(len(v) == 3 for v in by_image.values())
    for i, reps in by_image.items():
        crops = {tuple(c.tolist()) for c, _ in reps}
        assert len(crops) == 3, (i, crops)
        assert not torch.equal(reps[0][1], reps[1][1]) and not torch.equal(reps[1][1], reps[2][1])
    # repeat 0 of each image: the sample the plain sampler's transform gives at (epoch 0, index)
    plain = _train(_cfg()).dataset
    repeated = L.dataset
    for i in list(by_image)[:6]:
        a, b = plain[(0, i)], repeated[(0, i, None, 0)]
        assert torch.equal(a["image"], b["image"]) and a["crop"] == b["crop"] and a["erase"] == b["erase"]
        c = repeated[(0, i, None, 1)]
        assert not torch.equal(a["image"], c["image"])


def test_one_and_two_ranks_give_the_same_samples_and_augmentations():
    one = take(_train(_cfg(repeated_aug=3), micro=8), 5)
    two = [take(_train(_cfg(repeated_aug=3), micro=4, rank=r, world=2), 5) for r in range(2)]
    for step in range(5):
        for r in range(2):
            for k in ("image", "label", "index", "crop", "flip"):
                assert torch.equal(two[r][step][k], one[step][k][r::2]), (step, r, k)


def test_resume_mid_epoch_continues_exactly():
    cfg = _cfg(repeated_aug=3)
    ref = take(_train(cfg), 16 + 3)  # epoch 0 (16 batches of 6) and 3 of epoch 1
    first = _train(cfg)
    take(first, 7)
    state = first.state_dict()
    assert state == {"epoch": 0, "batch_index": 7}
    resumed = _train(cfg)
    resumed.load_state_dict(state)
    rest = take(resumed, 16 - 7 + 3)
    for x, y in zip(rest, ref[7:], strict=True):
        assert_same_batch(x, y)


def test_workers_give_the_same_batches():
    a = take(_train(_cfg(repeated_aug=3)), 3)
    b = take(_train(_cfg(repeated_aug=3, num_workers=2, persistent_workers=True)), 3)
    for x, y in zip(a, b):
        assert_same_batch(x, y)


@pytest.mark.parametrize("value", [0, -2])
def test_fewer_than_one_repeat_is_refused(value):
    with pytest.raises((CheckError, ConfigError), match=rf"data.repeated_aug={value} must be a whole number of at least 1"):
        _train(_cfg(repeated_aug=value))


def test_variable_resolution_repeats_the_same_way():
    """data.image_sizes: each permutation epoch of the step stream shows its first third of images 3
    times each (repeats 0, 1, 2), every step at one size, and 2 ranks give the one-process steps."""
    from vitscale.data.sizes import size_plan
    from vitscale.data.sizesampler import SizedBatchSampler

    def plan(world):
        d = data_config(format="digits", image_sizes=(24, 32, 40), batch_sizes=(12, 8, 4))
        return size_plan(d, patch=4, batch_size=8, parts=world, seed=SEED, accum=1)

    one = SizedBatchSampler(N, plan(1), repeats=3)
    ranks = [SizedBatchSampler(N, plan(2), rank=r, world_size=2, repeats=3) for r in range(2)]
    items, step = [], 0
    while not items or items[-1][0] == 0:  # to the first item of permutation epoch 1
        ref = one.micro_batch(step)
        assert sorted(ranks[0].micro_batch(step) + ranks[1].micro_batch(step)) == sorted(ref)
        assert len({size for _, _, size, _ in ref}) == 1
        items += ref
        step += 1
    epoch0 = [(i, r) for e, i, _, r in items if e == 0]
    assert len(epoch0) == N
    assert Counter(i for i, _ in epoch0) == Counter({i: 3 for i in epoch_permutation(N, SEED, 0)[: N // 3].tolist()})
    assert sorted(epoch0) == sorted((i, r) for i in {i for i, _ in epoch0} for r in range(3))
    loader = build_loaders(_cfg(repeated_aug=3, image_sizes=(16, 24)), img_size=(16, 16), num_channels=3, seed=SEED,
                           micro_batch_size=4, eval_batch_size=4, patch=8).train  # fmt: skip
    b = next(iter(loader))
    assert b["image"].shape[-1] in (16, 24) and len(b["index"]) > 0
    i = int(b["index"][0])
    reps = [loader.dataset[(0, i, 24, r)] for r in range(3)]
    assert all(x["image"].shape[-1] == 24 for x in reps)
    assert len({x["crop"] for x in reps}) == 3  # each repeat its own crop, at the step's size
