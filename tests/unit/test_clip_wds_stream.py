"""data.webdataset_mode=stream: rank/worker split, determinism, exact resume, bad samples, CLI run."""

from __future__ import annotations

import io
import json

import pytest
import torch

from vitscale.config.data import data_config
from vitscale.data.build import build_loaders
from vitscale.data.captions import write_digits_captions
from vitscale.models.registry import get_family


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("wds")
    write_digits_captions(str(out), size=16, shard_size=100)  # train: 15 shards (14 x 100 + 97)
    return out


def _loader(shards, *, rank=0, world=1, workers=0, micro=32, drop_last=True, path=None, **kw):
    cfg = data_config(format="webdataset", train_path=str(path or shards / "train"), webdataset_mode="stream",
                     num_workers=workers, shuffle_buffer=64, **kw)  # fmt: skip
    return build_loaders(cfg, img_size=(16, 16), num_channels=1, seed=3, micro_batch_size=micro, eval_batch_size=64,
                         rank=rank, world_size=world, drop_last=drop_last,
                         tokenize=get_family("clip").create_tokenizer(77)).train  # as the run assembly hands it over


def _epoch(loader):
    return [(b["index"].tolist(), b["image"], b["text"]) for b in loader]


def test_every_sample_once_across_ranks_and_workers(shards):
    seen = []
    for rank in range(2):
        # samples_per_epoch above the data: the per-worker quotas never cut, so each worker reads all its shards
        loader = _loader(shards, rank=rank, world=2, workers=2, drop_last=False, samples_per_epoch=10_000)
        batches = _epoch(loader)
        assert all(t.shape[1] == 77 and t.shape[0] == len(i) for i, _, t in batches)
        seen += [i for idx, _, _ in batches for i in idx]
    expected = sorted((s << 32) | n for s in range(15) for n in range(100 if s < 14 else 97))
    assert sorted(seen) == expected  # every one of the 1,497 samples exactly once


def test_deterministic_per_seed_and_epoch(shards):
    kw = dict(workers=2, resampled=True, samples_per_epoch=320)
    a, b = _loader(shards, **kw), _loader(shards, **kw)
    ea, eb = _epoch(a), _epoch(b)
    assert len(ea) == len(a) == 10
    for (ia, xa, ta), (ib, xb, tb) in zip(ea, eb):
        assert ia == ib and torch.equal(xa, xb) and torch.equal(ta, tb)
    assert [i for i, _, _ in _epoch(a)] != [i for i, _, _ in ea]  # epoch 1 is another stream


@pytest.mark.parametrize("resampled", [True, False])
def test_resume_mid_epoch_continues_exactly(shards, resampled):
    kw = dict(workers=2, resampled=resampled, samples_per_epoch=384)
    full = _epoch(_loader(shards, **kw))
    assert len(full) == 12
    first = _loader(shards, **kw)
    it = iter(first)
    head = [next(it) for _ in range(5)]  # odd: the next batch comes from worker 1
    assert [b["index"].tolist() for b in head] == [i for i, _, _ in full[:5]]
    state = first.state_dict()
    assert state["batch_index"] == 5 and state["stream_layout"] == [1, 2]
    resumed = _loader(shards, **kw)
    resumed.load_state_dict(state)
    rest = _epoch(resumed)
    assert len(rest) == 7
    for (ia, xa, ta), (ib, xb, tb) in zip(full[5:], rest):
        assert ia == ib and torch.equal(xa, xb) and torch.equal(ta, tb)
    assert resumed.epoch == 1 and resumed.state_dict()["batch_index"] == 0


def test_bad_samples_skipped_and_counted(tmp_path):
    import webdataset as wds
    from PIL import Image

    def png(v):
        buf = io.BytesIO()
        Image.new("L", (16, 16), v).save(buf, format="PNG")
        return buf.getvalue()

    (tmp_path / "s").mkdir()
    with wds.ShardWriter(str(tmp_path / "s" / "bad-%06d.tar"), maxcount=1000, verbose=0) as sink:
        for n in range(20):
            sample = {"__key__": f"k{n:03d}", "png": png(n * 10), "txt": f"a photo of {n}", "cls": str(n % 10)}
            if n == 5:
                sample["png"] = b"not an image at all"
            if n == 11:
                sample["txt"] = "   "
            if n == 14:
                del sample["txt"]
            sink.write(sample)
    loader = _loader(None, path=tmp_path / "s", micro=4, drop_last=False, samples_per_epoch=20, num_classes=10)
    batches = list(loader)
    idx = [i for b in batches for i in b["index"].tolist()]
    assert sorted(idx) == [n for n in range(20) if n not in (5, 11, 14)]
    assert sum(b["skipped"] for b in batches) == 3
    assert len(loader.state_dict()["skipped_paths"]) == 3
    assert sum(b["skipped"] for b in loader) == 0  # the same bad samples are not counted again


def test_cli_train_stream_mode(shards, tmp_path):
    from vitscale.cli import main

    out = tmp_path / "run"
    rc = main(["train", "digits_clip", "data.format=webdataset", f"data.train_path={shards}/train",
               f"data.val_path={shards}/val", "data.webdataset_mode=stream", "data.resampled=true",
               "data.samples_per_epoch=512", "data.num_workers=0", f"train.output_dir={out}", "train.max_steps=2",
               "train.epochs=0", "train.batch_size=32", "eval.every=0", "checkpoint.every=0",
               "log.progress=none", "log.report=false"])  # fmt: skip
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["zeroshot_top1"] <= 100.0  # percent
    assert summary["skipped_files"] == 0
