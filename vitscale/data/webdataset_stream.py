"""``data.format=webdataset`` with ``data.webdataset_mode=stream``: tar shards streamed through the
``webdataset`` package, for datasets too large to index (LAION-400M: tens of thousands of shards).

Nothing is read at start-up. Each epoch, every (rank, DataLoader worker) pair reads its own shard list
sequentially and draws micro-batches from it:

- shards: without ``data.resampled`` the shard list is permuted with a key (seed, epoch), split by rank
  (``perm[rank::world]``), then by worker (``[worker::num_workers]``): every sample once per epoch when
  the shards outnumber ranks x workers. With ``data.resampled`` (open_clip's ``--dataset-resampled``)
  each worker draws shards with replacement from a generator keyed by (seed, epoch, rank, worker), an
  endless stream cut at the epoch length.
- samples: a shuffle buffer (``data.webdataset_shuffle_buffer`` raw samples, before decoding) draws from
  a generator keyed by (seed, epoch, rank, worker); augmentation is keyed by the sample's position in
  that worker's stream. So the batches are a deterministic function of (seed, epoch, world size,
  num_workers).
- decoding: the caption format's path (``decode_resized_crop`` + ``SampleTransform`` + the model
  family's tokenizer, given to ``build_loaders``). A bad sample (undecodable / missing image, missing / empty caption) is dropped — the next
  sample takes its place — and reported with the next good sample, so ``batch["skipped"]`` counts each
  bad sample once (key ``<shard>:<key>``), as in index mode.
- epoch length: ``data.samples_per_epoch`` (None: number of shards x samples of the first shard) ->
  ``samples_per_epoch // (micro_batch x world)`` batches per rank, dealt round-robin to the workers as
  the DataLoader consumes them. Without resampling an epoch may end early if a worker runs out of shards.
- batches: the dict of the index-mode loader (``image``, ``label`` (-1 without ``.cls``), ``text``,
  ``index`` = ``shard_number << 32 | sample_number_in_shard``, ``crop``, ``flip``, ``skipped``).
- resuming: ``state_dict()`` = ``{epoch, batch_index, worker_batches, next_worker}`` (batches consumed
  from each worker, and the worker the next batch comes from). ``load_state_dict`` regenerates the same
  streams and each worker skips the batches it already delivered; worker ids are rotated so the
  round-robin order continues where it stopped. Exact with the same world size and ``num_workers``
  (otherwise the epoch restarts, with a warning). Cost: the skipped part of the epoch is read and its
  images decoded again (to know which samples are bad), split over the workers — roughly the time the
  run spent loading that part of the epoch, without the training.
- workers are started per epoch (``persistent_workers`` is ignored: an epoch is one long stream).
- validation sets stay in index mode (small, and evaluated in dataset order).
"""

from __future__ import annotations

import logging
import random

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from . import keyed
from .captions import IMAGE_EXTS
from .dataset import collate
from .decode import BadImageError
from .loader import BadFileReporter, ResumableLoader, _worker_init
from .transforms import Augmented, SampleTransform

log = logging.getLogger("vitscale.data")

STREAM_SHARDS = 101  # stream tags (see vitscale.data.keyed), apart from the index-mode tags
STREAM_SHUFFLE = 102
CAPTION_EXTS = ("txt", "text", "caption")


def read_shard(url: str):
    """Samples of one shard, through ``webdataset``'s tar reader and key grouping: dicts with
    ``__key__``, ``__url__`` and one entry (bytes) per extension."""
    from webdataset.tariterators import group_by_keys, tar_file_expander, url_opener

    yield from group_by_keys(tar_file_expander(url_opener([{"url": url}]), eof_value=None))


def count_samples(url: str) -> int:
    return sum(1 for _ in read_shard(url))


def worker_shards(shards: list[str], seed: int, epoch: int, rank: int, world: int, worker: int,
                  num_workers: int, resampled: bool):  # fmt: skip
    """Shard numbers read by (rank, worker) in ``epoch``: a list, or an endless iterator if resampled."""
    if resampled:
        rng = keyed.py_rng(seed, epoch, rank, worker, STREAM_SHARDS)
        return (rng.randrange(len(shards)) for _ in iter(int, 1))
    perm = keyed.epoch_permutation(len(shards), seed, epoch * 1_000_003 + STREAM_SHARDS).tolist()
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


class StreamDataset(IterableDataset):
    """One (rank, worker)'s micro-batches of an epoch (collated, plus ``worker``: the logical worker id)."""

    def __init__(self, shards: list[str], transform: SampleTransform, *, micro_batch_size: int, rank: int,
                 world_size: int, num_workers: int, batches_per_rank: int, resampled: bool, shuffle_buffer: int,
                 drop_last: bool, fast_decode: bool, tokenize=None):  # fmt: skip
        self.shards, self.transform = shards, transform
        self.micro, self.rank, self.world = micro_batch_size, rank, world_size
        self.num_workers = max(num_workers, 1)
        self.batches_per_rank, self.resampled = batches_per_rank, resampled
        self.shuffle_buffer, self.drop_last = shuffle_buffer, drop_last
        self.fast_decode, self.tokenize = fast_decode, tokenize
        # position, set by the loader before each epoch's iterator is created
        self.epoch, self.skip, self.rotate = 0, [0] * self.num_workers, 0

    def quota(self, worker: int) -> int:
        """Batches of this rank that logical worker ``worker`` delivers in an epoch."""
        return len(range(worker, self.batches_per_rank, self.num_workers))

    def raw_samples(self, worker: int):
        """(index, url, sample dict) of the worker's shards in order, before shuffling."""
        seed = self.transform.seed
        for s in worker_shards(self.shards, seed, self.epoch, self.rank, self.world, worker,
                               self.num_workers, self.resampled):  # fmt: skip
            for n, sample in enumerate(read_shard(self.shards[s])):
                yield (s << 32) | n, self.shards[s], sample

    def decode(self, sample: dict, slot: int) -> tuple[Augmented, str]:
        """One raw sample -> (augmented uint8 image, caption); ``BadImageError`` if bad."""
        tf, epoch = self.transform, self.epoch
        cap = next((sample[e] for e in CAPTION_EXTS if e in sample), None)
        if isinstance(cap, bytes):
            cap = cap.decode("utf-8", errors="replace")
        if cap is None or not cap.strip():
            raise BadImageError("missing or empty caption")
        data = next((sample[e] for e in IMAGE_EXTS if e in sample), None)
        if data is None:
            raise BadImageError("missing image")
        return tf.decode(data, epoch, slot, fast=self.fast_decode), cap

    def batches(self, worker: int):
        """All micro-batches of logical worker ``worker`` in this epoch (the first ``skip`` decoded but
        not collated)."""
        tok = self.tokenize
        seed, quota, skip = self.transform.seed, self.quota(worker), self.skip[worker]
        rng = keyed.py_rng(seed, self.epoch, self.rank, worker, STREAM_SHUFFLE)
        stream = shuffled(self.raw_samples(worker), self.shuffle_buffer, rng)
        slot0 = (self.rank * self.num_workers + worker) << 40
        done, samples, bad = 0, [], []
        for pos, (index, url, sample) in enumerate(stream):
            if done >= quota:
                return
            try:
                aug, cap = self.decode(sample, slot0 + pos)
            except BadImageError as e:
                bad.append((f"{url}:{sample.get('__key__')}", str(e)))
                continue
            label = sample.get("cls")
            try:
                label = int(label.decode().strip()) if label is not None else -1
            except ValueError:
                label = -1
            samples.append({"image": aug.image, "label": label, "index": index, "crop": aug.crop,
                            "flip": aug.flip, "erase": aug.erase, "bad": bad, "text": cap})  # fmt: skip
            bad = []
            if len(samples) == self.micro:
                if done >= skip:
                    yield self._collate(samples, tok, worker)
                done, samples = done + 1, []
        if samples and not self.drop_last and done < quota and done >= skip:
            if bad:
                samples[-1]["bad"] = samples[-1]["bad"] + bad
            yield self._collate(samples, tok, worker)

    @staticmethod
    def _collate(samples: list[dict], tok, worker: int) -> dict:
        texts = [s.pop("text") for s in samples]
        batch = collate(samples)
        if tok is not None:
            batch["text"] = tok(texts)  # (B, L)
        batch["worker"] = worker
        return batch

    def __iter__(self):
        info = get_worker_info()
        physical = info.id if info is not None else 0
        yield from self.batches((physical + self.rotate) % self.num_workers)


class StreamLoader(ResumableLoader):
    """The resumable loader of stream mode (same batches and interface as :class:`ResumableLoader`)."""

    def __init__(self, dataset: StreamDataset, *, mean, std, num_workers: int = 0, pin_memory: bool = False,
                 persistent_workers: bool = False, prefetch_factor: int = 2,
                 device: torch.device | str | None = None, reporter: BadFileReporter | None = None):  # fmt: skip
        self.dataset = dataset
        self.epoch, self.batch_index = 0, 0
        self.worker_batches, self.next_worker = [0] * dataset.num_workers, 0
        self.device = torch.device(device) if device is not None else None
        self.reporter = reporter or BadFileReporter()
        self._set_stats(dataset.transform.num_channels, mean, std)
        kwargs = {}
        if num_workers > 0:
            kwargs = dict(prefetch_factor=prefetch_factor, worker_init_fn=_worker_init)
        self._dl = DataLoader(dataset, batch_size=None, num_workers=num_workers,
                              pin_memory=pin_memory and torch.cuda.is_available(), **kwargs)  # fmt: skip

    def __len__(self) -> int:
        return self.dataset.batches_per_rank

    def set_epoch(self, epoch: int) -> None:
        if int(epoch) != self.epoch:
            self.epoch, self.batch_index = int(epoch), 0
            self.worker_batches, self.next_worker = [0] * self.dataset.num_workers, 0

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update(worker_batches=list(self.worker_batches), next_worker=self.next_worker,
                     stream_layout=[self.dataset.world, self.dataset.num_workers])  # fmt: skip
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        wb = state.get("worker_batches")
        layout = [self.dataset.world, self.dataset.num_workers]
        if wb is None or list(state.get("stream_layout", [])) != layout:
            if self.batch_index:
                log.warning("stream position saved with another (world size, num_workers) than %s: "
                            "restarting epoch %d from its first batch", layout, self.epoch)  # fmt: skip
            self.batch_index, self.worker_batches, self.next_worker = 0, [0] * layout[1], 0
            return
        self.worker_batches, self.next_worker = [int(x) for x in wb], int(state.get("next_worker", 0))

    def __iter__(self):
        ds = self.dataset
        ds.epoch, ds.skip, ds.rotate = self.epoch, list(self.worker_batches), self.next_worker
        if self.batch_index < len(self):
            it = iter(self._dl)
            while True:
                batch = self._next(it)
                if batch is None:
                    break
                w = int(batch.pop("worker"))
                self.batch_index += 1
                self.worker_batches[w] += 1
                self.next_worker = (w + 1) % ds.num_workers
                yield self.postprocess(batch)
        self.epoch, self.batch_index = self.epoch + 1, 0
        self.worker_batches, self.next_worker = [0] * ds.num_workers, 0


class StreamSource:
    """The train "source" of stream mode: builds its own loader (see ``build_loaders``)."""

    def __init__(self, cfg, shards: list[str], tokenize=None):
        self.cfg, self.shards, self.tokenize = cfg, shards, tokenize
        self.labels: list[int] = []  # unknown without reading the shards

    def __len__(self) -> int:
        if self.cfg.samples_per_epoch:
            return int(self.cfg.samples_per_epoch)
        n = len(self.shards) * count_samples(self.shards[0])
        log.info("data.samples_per_epoch unset: %d shards x %d samples in the first = %d",
                 len(self.shards), n // len(self.shards), n)  # fmt: skip
        return n

    def build_loader(self, transform: SampleTransform, *, micro_batch_size: int, rank: int, world_size: int,
                     drop_last: bool, num_workers: int, **common) -> StreamLoader:  # fmt: skip
        cfg = self.cfg
        n, per_step = len(self), micro_batch_size * world_size
        batches = n // per_step if drop_last else -(-n // per_step)
        if batches < 1:
            raise ValueError(f"data.samples_per_epoch={n} is less than one global micro-batch ({per_step})")
        if not cfg.resampled and len(self.shards) < world_size * max(num_workers, 1):
            log.warning("%d shards for %d ranks x %d workers: some workers read nothing (use data.resampled)",
                        len(self.shards), world_size, max(num_workers, 1))  # fmt: skip
        ds = StreamDataset(
            self.shards, transform, micro_batch_size=micro_batch_size, rank=rank, world_size=world_size,
            num_workers=num_workers, batches_per_rank=batches, resampled=cfg.resampled,
            shuffle_buffer=cfg.webdataset_shuffle_buffer if transform.train else 0, drop_last=drop_last,
            fast_decode=cfg.fast_decode, tokenize=self.tokenize,
        )  # fmt: skip
        common.pop("persistent_workers", None)
        return StreamLoader(ds, num_workers=num_workers, **common)


__all__ = ["StreamDataset", "StreamLoader", "StreamSource", "read_shard", "shuffled", "worker_shards"]
