"""No stall at epoch boundaries (``data.prefetch_across_epochs``): the workers load the next epoch's
first batch while the current epoch's last batch is still being loaded, and every batch and resume
position is the one a per-epoch iteration gives.

The gap is shown by event order, not by timings: the samples of epoch 0's last batch wait (in the
worker) until the whole first batch of epoch 1 has been loaded by another worker. With the prefetch
that happens at once; without it epoch 1 cannot start before epoch 0 has been handed out, so the wait
runs to its limit (a bound on the test's duration, not a measurement) and epoch 1 is still unloaded
when the last batch of epoch 0 arrives.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from vitscale.data import DataConfig, DataFormat, Split, build_loaders, data_config, formats, register_format
from vitscale.data.sampler import ShardedBatchSampler
from vitscale.data.sources import SyntheticSource

N, MICRO, SEED = 32, 8, 5  # 4 batches per epoch


class _HoldingSource(SyntheticSource):
    """Marks each sample a worker loads by a file ``<epoch>_<index>`` in ``log``; the first sample of
    ``hold`` (epoch 0's last batch) loaded waits until every file of ``until`` exists (at most
    ``limit`` seconds)."""

    def __init__(self, log: Path, hold: set[int], until: set[str], limit: float):
        super().__init__(N, 3, (8, 8), 3, SEED)
        self.log, self.hold, self.until, self.limit = log, hold, until, limit

    def sample(self, index, epoch, tf):
        if epoch == 0 and index in self.hold and not (self.log / "released").exists():
            end = time.monotonic() + self.limit
            while not all((self.log / f).exists() for f in self.until) and time.monotonic() < end:
                time.sleep(0.005)
            (self.log / "released").touch()  # the batch's other samples do not wait again
        s = super().sample(index, epoch, tf)
        (self.log / f"{epoch}_{index}").touch()
        return s


def _cfg(**kw) -> DataConfig:
    base = dict(format="synthetic", num_classes=3, num_workers=0, random_erasing=0.5, hflip=0.5, rrc_scale=(0.3, 1.0))
    if kw.get("format", "synthetic") == "synthetic":
        base["synthetic_size"] = N
    return data_config(**{**base, **kw})


def _loaders(cfg: DataConfig):
    return build_loaders(cfg, img_size=(8, 8), num_channels=3, seed=SEED, micro_batch_size=MICRO, eval_batch_size=8)


def _trainer_batches(loader):
    """As ``Trainer._batches``: a new ``for`` over the loader per epoch."""
    while True:
        yield from loader


@pytest.mark.parametrize("across, persistent", [(True, True), (True, False), (False, True)])
def test_next_epoch_is_loaded_before_the_last_batch_is_handed_out(tmp_path, monkeypatch, across, persistent):
    monkeypatch.setitem(formats.FORMATS.entries, "holding_test", None)  # the test's format is unregistered when it ends
    sampler = ShardedBatchSampler(N, MICRO, seed=SEED)
    last = len(sampler) - 1
    first_of_next = {f"1_{i}" for i in sampler.indices(1, 0)}
    limit = 60.0 if across else 2.0  # without the prefetch the wait always runs out
    src = _HoldingSource(tmp_path, set(sampler.indices(0, last)), first_of_next, limit)
    register_format(DataFormat("holding_test", lambda cfg, name, **kw: Split(src, ["a", "b", "c"]) if name == "train" else None))
    cfg = _cfg(format="holding_test", num_workers=2, prefetch_factor=2, persistent_workers=persistent,
               prefetch_across_epochs=across)  # fmt: skip
    loader = _loaders(cfg).train
    batches = _trainer_batches(loader)
    for _ in range(last):
        next(batches)
    assert loader.state_dict() == {"epoch": 0, "batch_index": last}
    next(batches)  # the last batch of epoch 0
    loaded_before = {p.name for p in tmp_path.iterdir()}
    assert loader.state_dict() == {"epoch": 0, "batch_index": last + 1}
    nxt = next(batches)  # the first batch of epoch 1
    assert sorted(nxt["index"].tolist()) == sorted(sampler.indices(1, 0))
    if across:
        assert first_of_next <= loaded_before, "epoch 1's first batch was not loaded during epoch 0's last"
    else:  # a new iterator per epoch: nothing of epoch 1 exists until epoch 0 has been handed out
        assert not any(n.startswith("1_") for n in loaded_before)


def _run(cfg: DataConfig, n_batches: int, resume_at: int | None = None):
    """``n_batches`` batches as the trainer takes them, with the loader state after each; with
    ``resume_at``, a fresh loader resumed from the state after that many batches takes the rest."""
    loader = _loaders(cfg).train
    batches, out = _trainer_batches(loader), []
    for k in range(n_batches):
        if k == resume_at:
            state = loader.state_dict()
            loader = _loaders(cfg).train
            loader.load_state_dict(state)
            loader.set_epoch(state["epoch"])  # as the trainer does: a no-op for the resumed epoch
            batches = _trainer_batches(loader)
        b = next(batches)
        out.append((b["index"], b["image"], b["flip"], loader.state_dict()))
    return out


def _assert_same(a, b):
    assert len(a) == len(b)
    for k, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) and torch.equal(x[2], y[2]), k
        assert x[3] == y[3], k


@pytest.mark.parametrize("workers", [0, 2])
def test_same_batches_and_positions_with_and_without_prefetch(workers):
    ref = _run(_cfg(prefetch_across_epochs=False), 3 * 4 + 1)  # 3 epochs and one batch
    _assert_same(_run(_cfg(num_workers=workers, prefetch_across_epochs=True), 3 * 4 + 1), ref)
    # resumed mid-epoch and exactly at an epoch boundary
    for at in (6, 8):
        _assert_same(_run(_cfg(num_workers=workers, prefetch_across_epochs=True), 3 * 4 + 1, resume_at=at), ref)


def test_moving_the_position_replaces_the_running_iterator():
    ref = _run(_cfg(prefetch_across_epochs=False), 5 * 4)
    loader = _loaders(_cfg(num_workers=2, prefetch_across_epochs=True)).train
    batches = _trainer_batches(loader)
    for _ in range(5):  # into epoch 1: the workers are already ahead
        next(batches)
    loader.set_epoch(3)
    b = next(iter(loader))
    assert torch.equal(b["index"], ref[12][0]) and torch.equal(b["image"], ref[12][1])
    loader.load_state_dict({"epoch": 1, "batch_index": 2})
    b = next(iter(loader))
    assert torch.equal(b["index"], ref[6][0]) and loader.state_dict() == ref[6][3]
