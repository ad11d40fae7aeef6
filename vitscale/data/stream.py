"""Streaming: samples read front to back from *units* — WebDataset shards (``data.webdataset_mode=stream``)
or Parquet row groups (``data.parquet_mode=stream``) — local or remote, for datasets too large to index.

Nothing is read at start-up but what the format needs (the first shard's count, a table's footers).
Each epoch every (rank, logical worker) pair reads its own units sequentially and draws micro-batches:

- units: without ``data.resampled`` the unit list is permuted with a key (seed, epoch), split by rank
  (``perm[rank::world]``), then by logical worker (``[worker::num_workers]``): every sample once per
  epoch when the units outnumber ranks x workers. With ``data.resampled`` (open_clip's
  ``--dataset-resampled``) each worker draws units with replacement from a generator keyed by
  (seed, epoch, rank, worker), an endless stream cut at the epoch length.
- samples: a shuffle buffer (``data.shuffle_buffer`` samples, encoded) draws from a generator keyed by
  (seed, epoch, rank, worker); the augmentation is keyed by the sample's position in that worker's
  stream. So the batches of an epoch are a function of (seed, epoch, world size, num_workers).
- batches: batch ``j`` of a rank's epoch comes from logical worker ``j % num_workers`` (its
  ``j // num_workers``-th). The DataLoader takes batches from its worker processes in turn, so a
  process plays the logical worker whose turn it is: it works that out from where its iterator
  started, and one iterator runs on through the epochs (``data.prefetch_across_epochs``, the
  default): the workers load the next epoch while the last batches of this one are consumed, no
  stall and no restart at the boundary. A worker that runs out of units before its share of the
  epoch (without ``resampled``, with few or uneven units) fills its turns with empty slots, which the
  loader passes over: the epoch then has fewer batches.
- resuming: ``state_dict()`` = ``{epoch, batch_index}`` (and the layout ``[world size, num_workers]``):
  a resumed or requeued run builds the same streams and each worker skips the batches already
  handed out — the same samples in the same order as an uninterrupted run (webdataset's issue #271
  says the library cannot do this and suggests resampling instead; keyed randomness and this
  position can). With another world size or ``num_workers`` the epoch restarts, with a warning. Cost:
  the skipped part of the epoch is read and decoded again (to know which samples are bad).
- errors: a bad sample (undecodable / missing image, missing or out-of-range label, missing caption)
  is dropped — the next sample takes its place — and reported once (``<unit>:<key>``). A unit that
  fails to read is retried with backoff (``data.remote_retries``), continuing after the samples
  already read; one that still fails is skipped for this epoch, named in a warning and in
  summary.json (``skipped_shards``).
- batches carry ``index`` = ``unit_number << 32 | sample_number_in_unit``, ``key`` (the sample keys),
  ``label`` (-1 without labels) and ``text`` when the data has captions.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..errors import CheckError
from . import keyed
from .dataset import collate, for_transfer
from .decode import BadImageError
from .loader import BadFileReporter, ResumableLoader, _worker_init
from .remote import RemoteOptions, describe_error, read_retrying
from .transforms import Augmented, SampleTransform

log = logging.getLogger("vitscale.data")

STREAM_SHARDS = 101  # stream tags (see vitscale.data.keyed), apart from the index-mode tags
STREAM_SHUFFLE = 102


class UnitReader:
    """What a streaming format provides: its units, and how to read one.

    ``read(unit)`` yields raw samples: dicts with ``key`` (str), ``image`` (encoded bytes or None),
    ``label`` (int, or None when absent), optionally ``label_error`` (why the label is unusable) and
    ``caption`` (str or None)."""

    units: list

    def name(self, unit) -> str:
        raise NotImplementedError

    def read(self, unit) -> Iterator[dict]:
        raise NotImplementedError


class StreamStop(Exception):
    """A resampled stream that can never deliver (every unit unreadable, or every sample bad)."""


def worker_units(n: int, seed: int, epoch: int, rank: int, world: int, worker: int, num_workers: int,
                 resampled: bool):  # fmt: skip
    """Unit numbers read by (rank, worker) in ``epoch``: a list, or an endless iterator if resampled."""
    if resampled:
        rng = keyed.py_rng(seed, epoch, rank, worker, STREAM_SHARDS)
        return (rng.randrange(n) for _ in iter(int, 1))
    perm = keyed.epoch_permutation(n, seed, epoch * 1_000_003 + STREAM_SHARDS).tolist()
    return perm[rank::world][worker::num_workers]


def shuffled(items, bufsize: int, rng: random.Random):
    """A shuffle buffer of ``bufsize`` items drawing from ``rng`` (``bufsize <= 1``: unchanged order)."""
    if bufsize <= 1:
        yield from items
        return
    buf = []
    for x in items:
        if len(buf) < bufsize:
            buf.append(x)
            continue
        i = rng.randrange(bufsize)
        yield buf[i]
        buf[i] = x
    rng.shuffle(buf)
    yield from buf


class BadSample(Exception):
    pass


class StreamDataset(IterableDataset):
    """The micro-batches of one rank (see the module docstring); each item carries its ``epoch``."""

    def __init__(self, reader: UnitReader, transform: SampleTransform, *, micro_batch_size: int, rank: int,
                 world_size: int, num_workers: int, batches_per_rank: int, resampled: bool, shuffle_buffer: int,
                 drop_last: bool, fast_decode: bool, num_classes: int, tokenize, remote: RemoteOptions):  # fmt: skip
        self.reader, self.transform = reader, transform
        self.micro, self.rank, self.world = micro_batch_size, rank, world_size
        self.num_workers = max(num_workers, 1)
        self.batches_per_rank, self.resampled = batches_per_rank, resampled
        self.shuffle_buffer, self.drop_last, self.fast_decode = shuffle_buffer, drop_last, fast_decode
        # tokenize: texts -> token ids (N, L), the model family's tokenizer; None = no caption tokens
        self.num_classes, self.tokenize, self.remote = num_classes, tokenize, remote
        self.start, self.through = (0, 0), False  # set by the loader before each iterator is made
        self._failed: list[tuple[str, str]] = []  # units this worker could not read, not reported yet
        self._drawn = 0  # units drawn in this epoch (resampled: how long since the last good sample)

    def set_position(self, epoch: int, batch_index: int, through_epochs: bool) -> None:
        self.start, self.through = (int(epoch), int(batch_index)), bool(through_epochs)

    def quota(self, worker: int) -> int:
        """Batches of this rank that logical worker ``worker`` delivers in an epoch."""
        return len(range(worker, self.batches_per_rank, self.num_workers))

    # ------------------------------------------------------------------ reading
    def raw_samples(self, epoch: int, worker: int):
        """(index, unit name, raw sample) of the worker's units in order, before shuffling; a unit that
        cannot be read is retried, then skipped and remembered in ``_failed``."""
        units = self.reader.units
        failing = 0  # units in a row that gave no sample
        for u in worker_units(len(units), self.transform.seed, epoch, self.rank, self.world, worker,
                              self.num_workers, self.resampled):  # fmt: skip
            unit, name = units[u], self.reader.name(units[u])
            self._drawn += 1
            got = False
            try:
                for n, raw in enumerate(read_retrying(lambda unit=unit: self.reader.read(unit), name, self.remote)):
                    got = True
                    yield (u << 32) | n, name, raw
            except CheckError as e:  # the data breaks a rule (a key twice in a shard): never skipped
                raise StreamStop(f"{name}: {e}") from None
            except Exception as e:  # retried already where it could help: skip this unit
                self._failed.append((name, describe_error(e)))
            failing = 0 if got else failing + 1
            if self.resampled and failing > self.patience():  # drawn without end: never stop otherwise
                raise StreamStop(f"(data.resampled) {failing} shards in a row could not be read (the last: {name}: "
                                 f"{self._failed[-1][1] if self._failed else 'empty'})")  # fmt: skip

    def patience(self) -> int:
        """Units a resampled stream may draw in a row without a good sample before it stops."""
        return max(len(self.reader.units), 16)

    def decode(self, raw: dict, epoch: int, slot: int) -> tuple[Augmented, int]:
        """One raw sample -> (augmented uint8 image, label); ``BadSample`` with the reason if bad."""
        if self.tokenize is not None:
            cap = raw.get("caption")
            if cap is None or not cap.strip():
                raise BadSample("missing or empty caption")
        if raw.get("label_error"):
            raise BadSample(raw["label_error"])
        label = raw.get("label")
        if self.num_classes:
            if label is None:
                raise BadSample(raw.get("label_missing", "no label"))
            if not 0 <= label < self.num_classes:
                raise BadSample(f"label {label} outside [0, {self.num_classes})")
        label = -1 if label is None else int(label)
        if raw.get("image") is None:
            raise BadSample("missing image")
        try:
            return self.transform.decode(raw["image"], epoch, slot, fast=self.fast_decode), label
        except BadImageError as e:
            raise BadSample(str(e)) from None

    # ------------------------------------------------------------------ batches
    def epoch_batches(self, epoch: int, worker: int, skip: int):
        """The batches of logical worker ``worker`` in ``epoch`` (the first ``skip`` read, not collated),
        then empty slots for its turns when its units ran out."""
        seed, quota = self.transform.seed, self.quota(worker)
        rng = keyed.py_rng(seed, epoch, self.rank, worker, STREAM_SHUFFLE)
        stream = shuffled(self.raw_samples(epoch, worker), self.shuffle_buffer, rng)
        slot0 = (self.rank * self.num_workers + worker) << 40
        done, samples, bad = 0, [], []
        self._drawn, good_at, bad_run = 0, 0, 0  # units drawn, drawn by the last good sample; bad samples since
        stream = iter(stream)
        for pos in itertools.count():
            try:
                index, name, raw = next(stream)
            except StopIteration:
                break
            except StreamStop as e:  # sent as a batch: one line in the main process, from any worker
                yield {"epoch": epoch, "empty": True, "bad": bad[-100:], "bad_shards": self._take_failed(), "stop": str(e)}
                return
            if done >= quota:
                return
            try:
                aug, label = self.decode(raw, epoch, slot0 + pos)
            except BadSample as e:
                bad.append((f"{name}:{raw.get('key')}", str(e)))
                bad_run += 1
                # drawn without end, every sample bad: stop once every shard could have been drawn (the
                # shuffle buffer read ahead: it is passed too)
                if self.resampled and bad_run > max(2 * self.shuffle_buffer, 1024) and self._drawn - good_at > self.patience():
                    yield {"epoch": epoch, "empty": True, "bad": bad[-100:], "bad_shards": self._take_failed(),
                           "stop": f"(data.resampled) no good sample in {bad_run} tries over {self._drawn - good_at} shards drawn in a "
                                   f"row (the last: {name}:{raw.get('key')}: {e})"}  # fmt: skip
                    return
                continue
            good_at, bad_run = self._drawn, 0
            samples.append({"image": aug.image, "label": label, "index": index, "crop": aug.crop, "flip": aug.flip,
                            "erase": aug.erase, "bad": bad, "key": str(raw.get("key")), "text": raw.get("caption")})  # fmt: skip
            bad = []
            if len(samples) == self.micro:
                if done >= skip:
                    yield self._collate(samples, epoch)
                done, samples = done + 1, []
        if samples and not self.drop_last and done < quota:
            samples[-1]["bad"] = samples[-1]["bad"] + bad
            bad = []
            if done >= skip:
                yield self._collate(samples, epoch)
            done += 1
        while done < quota:  # out of units: keep this worker's turns, empty
            if done >= skip:
                yield {"epoch": epoch, "empty": True, "bad": bad, "bad_shards": self._take_failed()}
                bad = []
            done += 1

    def _take_failed(self) -> list[tuple[str, str]]:
        failed, self._failed = self._failed, []
        return failed

    def _collate(self, samples: list[dict], epoch: int) -> dict:
        texts = [s.pop("text") for s in samples]
        batch = collate(samples)
        if self.tokenize is not None:
            batch["text"] = self.tokenize(texts)  # (B, L)
        batch["epoch"] = epoch
        batch["bad_shards"] = self._take_failed()
        return for_transfer(batch)  # small tensors by value from a worker

    def __iter__(self):
        info = get_worker_info()
        physical = info.id if info is not None else 0
        W, B = self.num_workers, self.batches_per_rank
        e0, j0 = self.start
        epoch = e0
        while True:
            first = (epoch - e0) * B - j0  # the iterator's item number of batch 0 of this epoch
            worker = (physical - first) % W  # the logical worker whose turns this process has
            skip = len(range(worker, j0, W)) if epoch == e0 else 0
            yield from self.epoch_batches(epoch, worker, skip)
            if not self.through:
                return
            epoch += 1


def as_sent(batch: dict) -> dict:
    """The DataLoader's per-item function for a stream's whole batches: the batch as the worker
    made it (the default, ``default_convert``, would turn the numpy arrays of
    :func:`vitscale.data.dataset.for_transfer` back into tensors in the worker)."""
    return batch


class StreamLoader(ResumableLoader):
    """The resumable loader of a stream (same batches and interface as :class:`ResumableLoader`)."""

    def __init__(self, dataset: StreamDataset, *, mean, std, num_workers: int = 0, pin_memory: bool = False,
                 persistent_workers: bool = False, prefetch_factor: int = 2, across_epochs: bool = True,
                 device: torch.device | str | None = None, reporter: BadFileReporter | None = None):  # fmt: skip
        self.dataset = dataset
        self.epoch, self.batch_index = 0, 0
        self.device = torch.device(device) if device is not None else None
        self.reporter = reporter or BadFileReporter()
        self.across_epochs, self._live = across_epochs, None
        self._set_stats(dataset.transform.num_channels, mean, std)
        kwargs = {}
        if num_workers > 0:  # one iterator runs on through the epochs: its workers persist anyway
            kwargs = dict(prefetch_factor=prefetch_factor, worker_init_fn=_worker_init)
        self._dl = DataLoader(dataset, batch_size=None, num_workers=num_workers, collate_fn=as_sent,
                              pin_memory=pin_memory and torch.cuda.is_available(), **kwargs)  # fmt: skip

    def __len__(self) -> int:
        return self.dataset.batches_per_rank

    def layout(self) -> list[int]:
        return [self.dataset.world, self.dataset.num_workers]

    def state_dict(self) -> dict:
        return super().state_dict() | {"stream_layout": self.layout()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if list(state.get("stream_layout", [])) != self.layout() and self.batch_index:
            log.warning("stream position saved with another (world size, num_workers) than %s: restarting epoch %d "
                        "from its first batch", self.layout(), self.epoch)  # fmt: skip
            self.batch_index = 0

    def __iter__(self):
        ds = self.dataset
        if self.batch_index < len(self):
            if self.across_epochs:
                if self._live is None:
                    ds.set_position(self.epoch, self.batch_index, through_epochs=True)
                    self._live = iter(self._dl)
                it = self._live
            else:
                ds.set_position(self.epoch, self.batch_index, through_epochs=False)
                it = iter(self._dl)
            delivered, whole = 0, self.batch_index == 0
            while self.batch_index < len(self):
                item = self._next(it)
                if item is None:  # a per-epoch iterator ended
                    self._live = None
                    break
                if int(item.pop("epoch")) != self.epoch:
                    raise RuntimeError(f"stream out of step: a batch of another epoch in epoch {self.epoch}")
                self.batch_index += 1
                if item.pop("empty", False):
                    self.reporter.report_shards(item["bad_shards"])
                    self.reporter.report(item["bad"])
                    if item.get("stop"):
                        from ..errors import UserError

                        raise UserError(f"data.train_path: {item['stop']}: check the data")
                    continue
                delivered += 1
                yield self.postprocess(item)
            if whole and not delivered and self.batch_index >= len(self):
                from ..errors import UserError

                raise UserError(f"epoch {self.epoch} of the stream gave no batch: every shard failed or was empty "
                                f"(see the warnings above)")  # fmt: skip
        self.epoch, self.batch_index = self.epoch + 1, 0


class StreamSource:
    """The train "source" of a stream: builds its own loader (see ``vitscale.data.build_loader``)."""

    def __init__(self, reader: UnitReader, cfg, *, samples_per_epoch: int, num_classes: int, captions: bool,
                 tokenize=None, exact: bool = False):  # fmt: skip
        self.reader, self.cfg, self.exact = reader, cfg, exact  # exact: samples_per_epoch is the data's count
        self.samples_per_epoch, self.num_classes, self.captions = samples_per_epoch, num_classes, captions
        self.labels: list[int] = []  # unknown without reading the data
        self.tokenize = tokenize if captions else None  # the model family's tokenizer (see build_loader)

    def __len__(self) -> int:
        return self.samples_per_epoch

    def build_loader(self, transform: SampleTransform, *, micro_batch_size: int, rank: int, world_size: int,
                     drop_last: bool, num_workers: int, **common) -> StreamLoader:  # fmt: skip
        cfg = self.cfg
        n, per_step = len(self), micro_batch_size * world_size
        batches = n // per_step if drop_last else -(-n // per_step)
        if batches < 1:
            from ..errors import CheckError

            raise CheckError(f"an epoch of the stream has {n} samples (data.samples_per_epoch, else the data's count), "
                             f"less than one global micro-batch of {per_step}: lower train.batch_size")  # fmt: skip
        units = len(self.reader.units)
        if not cfg.resampled and units < world_size * max(num_workers, 1):
            log.warning("%d shards for %d ranks x %d workers: some workers read nothing (use data.resampled)",
                        units, world_size, max(num_workers, 1))  # fmt: skip
        ds = StreamDataset(
            self.reader, transform, micro_batch_size=micro_batch_size, rank=rank, world_size=world_size,
            num_workers=num_workers, batches_per_rank=batches, resampled=cfg.resampled,
            shuffle_buffer=cfg.shuffle_buffer if transform.train else 0, drop_last=drop_last,
            fast_decode=cfg.fast_decode, num_classes=self.num_classes, tokenize=self.tokenize,
            remote=RemoteOptions.of(cfg),
        )  # fmt: skip
        common.pop("persistent_workers", None)
        across = cfg.prefetch_across_epochs and transform.train
        return StreamLoader(ds, num_workers=num_workers, across_epochs=across, **common)


__all__ = ["StreamDataset", "StreamLoader", "StreamSource", "UnitReader", "shuffled", "worker_units"]
