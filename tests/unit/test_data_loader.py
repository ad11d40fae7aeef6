"""Keyed determinism (workers, ranks), resumable position and batch contract of the data loaders."""

import pytest
import torch
from helpers import assert_same_batch, take

from vitscale.data import build_loaders, data_config


def _cfg(**kw):
    base = dict(format="synthetic", synthetic_size=96, num_classes=7, num_workers=0, val_split=0.25,
                auto_augment="rand-m9-mstd0.5-inc1", random_erasing=0.5, hflip=0.5, rrc_scale=(0.3, 1.0))
    base.update(kw)
    return data_config(**base)


def _loaders(cfg, micro=8, rank=0, world=1, seed=3):
    return build_loaders(cfg, img_size=(16, 16), num_channels=3, seed=seed, micro_batch_size=micro,
                         eval_batch_size=10, rank=rank, world_size=world)


def test_batch_contract():
    L = _loaders(_cfg())
    b = next(iter(L.train))
    assert b["image"].dtype == torch.float32 and b["image"].shape == (8, 3, 16, 16)
    assert b["label"].dtype == torch.long and b["label"].shape == (8,)
    assert b["index"].dtype == torch.long and b["index"].shape == (8,)
    assert b["crop"].shape == (8, 4) and b["flip"].dtype == torch.bool
    assert b["skipped"] == 0
    assert L.num_classes == 7 and len(L.class_names) == 7
    assert len(L.train) == 96 // 8
    assert ((b["label"] >= 0) & (b["label"] < 7)).all()
    crop = b["crop"]
    assert (crop >= 0).all() and (crop[:, 0] + crop[:, 2] <= 1 + 1e-6).all() and (crop[:, 1] + crop[:, 3] <= 1 + 1e-6).all()
    v = list(L.val)
    assert sum(x["image"].shape[0] for x in v) == 24  # 96 * 0.25


def test_epoch_is_a_permutation_and_epochs_differ():
    L = _loaders(_cfg(auto_augment="", random_erasing=0.0))
    e0 = torch.cat([b["index"] for b in L.train])
    assert L.train.state_dict() == {"epoch": 1, "batch_index": 0}
    e1 = torch.cat([b["index"] for b in L.train])
    assert sorted(e0.tolist()) == list(range(96)) == sorted(e1.tolist())
    assert not torch.equal(e0, e1)


def test_same_batches_with_0_or_2_workers():
    a = take(_loaders(_cfg(num_workers=0)).train, 4)
    b = take(_loaders(_cfg(num_workers=2, persistent_workers=True)).train, 4)
    for x, y in zip(a, b):
        assert_same_batch(x, y)
        assert torch.allclose(x["image"], y["image"])
        for k in ("label", "index", "crop", "flip"):  # sent by value from a worker, tensors again
            assert isinstance(y[k], torch.Tensor) and y[k].dtype == x[k].dtype, k


@pytest.mark.parametrize("side", [16, 96])
def test_worker_sends_small_tensors_by_value(side):
    """What crosses from a worker: the per-sample fields as numpy arrays (pickled with the batch,
    no shared-memory file and socket per tensor); an image batch over 64 KiB as a tensor."""
    import numpy as np

    from vitscale.data.dataset import BY_VALUE_MAX_BYTES, from_transfer

    L = build_loaders(_cfg(num_workers=1), img_size=(side, side), num_channels=3, seed=3, micro_batch_size=8,
                      eval_batch_size=10).train  # fmt: skip
    L.sampler.set_position(0, 0)
    raw = next(iter(L._dl))  # the batch as the worker sent it
    for k in ("label", "index", "crop", "flip", "erase"):
        assert isinstance(raw[k], np.ndarray), k
    big = 8 * 3 * side * side > BY_VALUE_MAX_BYTES
    assert isinstance(raw["image"], torch.Tensor if big else np.ndarray)
    back = from_transfer(raw)
    assert back["flip"].dtype == torch.bool and back["label"].dtype == torch.long and back["crop"].dtype == torch.float32
    assert back["image"].dtype == torch.uint8 and back["image"].shape == (8, 3, side, side)
    ref = take(build_loaders(_cfg(), img_size=(side, side), num_channels=3, seed=3, micro_batch_size=8,
                              eval_batch_size=10).train, 1)[0]  # fmt: skip
    assert torch.equal(back["label"], ref["label"]) and torch.equal(back["index"], ref["index"])


def test_ranks_shard_the_global_batch_strided():
    one = take(_loaders(_cfg(), micro=8).train, 3)
    shards = [take(_loaders(_cfg(), micro=4, rank=r, world=2).train, 3) for r in range(2)]
    for step in range(3):
        for r in range(2):
            for k in ("image", "label", "index", "crop", "flip"):
                assert torch.equal(shards[r][step][k], one[step][k][r::2]), (step, r, k)


def test_val_ranks_take_whole_batches_of_one_process_and_pad():
    """24 val images in batches of 10 (10, 10, 4) over 2 ranks: each rank takes whole batches of the
    one-process evaluation (0 and 2, then 1), and both run two batches (a sharded model's forward is
    collective): rank 1's second is a one-image padding batch."""
    one = list(_loaders(_cfg()).val)
    assert [len(b["index"]) for b in one] == [10, 10, 4]
    two = [list(_loaders(_cfg(), rank=r, world=2).val) for r in range(2)]
    assert [len(v) for v in two] == [2, 2]  # the same number of batches on every rank
    for got, ref in ((two[0][0], one[0]), (two[1][0], one[1]), (two[0][1], one[2])):
        for k in ("image", "label", "index"):
            assert torch.equal(got[k], ref[k]), k
    pad = two[1][1]
    assert pad["index"].tolist() == [-1] and torch.equal(pad["image"][0], one[0]["image"][0])  # sample 0, marked -1
    real = torch.cat([b["index"] for v in two for b in v])
    assert sorted(real[real >= 0].tolist()) == list(range(24))  # each image once, none dropped


def test_resume_continues_at_next_unseen_batch():
    L = _loaders(_cfg())
    ref = take(L.train, 12 + 3)  # full epoch 0 then 3 batches of epoch 1
    L2 = _loaders(_cfg())
    take(L2.train, 5)
    state = L2.train.state_dict()
    assert state == {"epoch": 0, "batch_index": 5}
    L3 = _loaders(_cfg())
    L3.train.load_state_dict(state)
    L3.train.set_epoch(0)  # same epoch: keeps the resumed position
    rest = list(L3.train)
    assert len(rest) == 12 - 5
    for x, y in zip(rest, ref[5:12]):
        assert_same_batch(x, y)
    nxt = take(L3.train, 3)  # rolled over to epoch 1
    for x, y in zip(nxt, ref[12:]):
        assert_same_batch(x, y)
    L3.train.set_epoch(4)
    assert L3.train.state_dict() == {"epoch": 4, "batch_index": 0}


def test_seed_changes_order():
    a = next(iter(_loaders(_cfg(), seed=1).train))["index"]
    b = next(iter(_loaders(_cfg(), seed=2).train))["index"]
    assert not torch.equal(a, b)


def test_normalisation_and_erasing():
    cfg = _cfg(auto_augment="", random_erasing=0.0, hflip=0.0, rrc_scale=(1.0, 1.0), rrc_ratio=(1.0, 1.0),
               mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    L = _loaders(cfg)
    b = next(iter(L.train))
    src = L.train.dataset.source
    raw = torch.stack([src.image(i) for i in b["index"].tolist()]).float() / 255.0
    assert torch.allclose(b["image"], (raw - 0.5) / 0.25, atol=1e-5)
    erased = _loaders(_cfg(auto_augment="", random_erasing=1.0, hflip=0.0, rrc_scale=(1.0, 1.0), rrc_ratio=(1.0, 1.0),
                           mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)))
    e = next(iter(erased.train))
    assert torch.equal(e["index"], b["index"])
    diff = (e["image"] != b["image"]).flatten(1).any(1)
    assert diff.all()  # every image has an erased box (p=1, 16x16 always fits)


def test_drop_last_false_and_too_small():
    cfg = _cfg(synthetic_size=20, val_split=0.0)
    L = build_loaders(cfg, img_size=(16, 16), num_channels=3, seed=0, micro_batch_size=8, eval_batch_size=8, drop_last=False)
    assert L.val is None
    sizes = [b["image"].shape[0] for b in L.train]
    assert sizes == [8, 8, 4]
    with pytest.raises(ValueError, match="smaller than one global micro-batch"):
        build_loaders(cfg, img_size=(16, 16), num_channels=3, seed=0, micro_batch_size=16, eval_batch_size=8, world_size=2)


def test_break_and_continue_with_persistent_workers():
    ref = take(_loaders(_cfg(num_workers=0)).train, 7)
    L = _loaders(_cfg(num_workers=2, persistent_workers=True))
    first = take(L.train, 3)
    assert L.train.state_dict() == {"epoch": 0, "batch_index": 3}
    rest = take(L.train, 4)  # a new iteration continues at the next unseen batch
    for x, y in zip(first + rest, ref):
        assert_same_batch(x, y)


def test_plugin_format_with_extra_fields(monkeypatch):
    from vitscale.data import DataFormat, Split, formats, register_format
    from vitscale.data.sources import SyntheticSource

    monkeypatch.setitem(formats.FORMATS.entries, "captioned_test", None)  # the test's format is unregistered when it ends

    class Captioned(SyntheticSource):
        def sample(self, index, epoch, tf):
            s = super().sample(index, epoch, tf)
            s.extra = {"text": torch.full((5,), index), "caption": f"image {index}"}
            return s

    register_format(DataFormat("captioned_test", lambda cfg, name, img_size, num_channels, seed, classes: (
        Split(Captioned(16, 3, img_size, num_channels, seed), ["a", "b", "c"]) if name == "train" else None)))
    L = build_loaders(data_config(format="captioned_test", num_workers=0), img_size=(16, 16), num_channels=3, seed=0,
                      micro_batch_size=4, eval_batch_size=4, device="cpu")
    b = next(iter(L.train))
    assert b["text"].shape == (4, 5) and torch.equal(b["text"][:, 0], b["index"])
    assert b["caption"] == [f"image {i}" for i in b["index"].tolist()]
    with pytest.raises(ValueError, match="data.format: unknown data format 'nope'"):
        _loaders(data_config(format="nope"))
