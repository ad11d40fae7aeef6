"""The resumable loader: DataLoader workers + batch post-processing in the main process.

Post-processing (per batch, on ``device`` when one is given): uint8 -> float, normalise with
mean/std, random erasing with keyed noise, and bad-file reporting: every undecodable file (or bad
sample) gets ONE warning line (``skipped <path> (<reason>); replaced by another sample`` in
training, ``...; left out`` in an evaluation) per run, deduplicated here by path, and
``batch["skipped"]`` counts the files first reported in that batch (so summing it over a run
counts each bad file once). A shard (or other file of samples) that cannot be read even after the
retries is named in one warning (``skipped shard <url> ...``) and kept in the run's list.
:func:`skip_summary` gives a run's totals, over its ranks, for summary.json.
"""

from __future__ import annotations

import logging

import torch
from torch.utils.data import DataLoader

from ..signals import loader_worker_signals
from .dataset import KeyedDataset, from_transfer, worker_collate
from .keyed import torch_gen
from .naflex import erase_patches, normalise_patches

log = logging.getLogger("vitscale.data")


def _worker_init(_worker_id: int) -> None:
    torch.set_num_threads(1)
    loader_worker_signals()  # the trainer decides what a signal means; the workers keep feeding it


class BadFileReporter:
    """Deduplicates bad files by path and warns once for each; keeps the shards that failed."""

    def __init__(self):
        self.seen: set[str] = set()
        self.shards: dict[str, str] = {}  # url -> why it was skipped

    def report(self, bad: list[tuple]) -> int:
        """Warn about the files of ``bad`` (``(path, reason[, what became of it])``) not reported yet;
        returns how many there were."""
        new = 0
        for path, reason, *became in bad:
            if path not in self.seen:
                self.seen.add(path)
                new += 1
                log.warning("skipped %s (%s); %s", path, reason, became[0] if became else "replaced by another sample")
        return new

    def report_shards(self, failed: list[tuple[str, str]]) -> None:
        """Warn once about each shard of ``failed`` (``(url, reason)``) that could not be read."""
        for url, reason in failed:
            if url not in self.shards:
                self.shards[url] = reason
                log.warning("skipped shard %s: %s (its samples are left out of this epoch)", url, reason)

    def state_dict(self) -> dict:
        state: dict = {}
        if self.seen:  # bad files already reported and counted: not again after a resume
            state["skipped_paths"] = sorted(self.seen)
        if self.shards:
            state["skipped_shards"] = dict(sorted(self.shards.items()))
        return state

    def load_state_dict(self, state: dict) -> None:
        self.seen.update(state.get("skipped_paths", ()))
        self.shards.update(state.get("skipped_shards", {}))


def skip_summary(reporter: BadFileReporter, group=None) -> dict:
    """``{"skipped_files": n, "skipped_shards": [{"url", "reason"}, ...]}`` of a run (training and
    evaluation), over every rank of ``group`` (None = the world when one is initialised): a file
    met by several ranks counts once. Every rank must call it."""
    import torch.distributed as dist

    files, shards = set(reporter.seen), dict(reporter.shards)
    if dist.is_available() and dist.is_initialized():
        everyone: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, (sorted(files), shards), group=group)  # strings between this run's ranks
        for f, s in everyone:
            files.update(f)
            shards.update(s)
    return {"skipped_files": len(files),
            "skipped_shards": [{"url": u, "reason": r} for u, r in sorted(shards.items())]}  # fmt: skip


def _to(image, device: torch.device):
    """An image batch, or a NaFlex batch's dict of tensors, on ``device`` (non-blocking)."""
    if isinstance(image, dict):
        return {k: v.to(device, non_blocking=True) for k, v in image.items()}
    return image.to(device, non_blocking=True)


class ResumableLoader:
    """Iterates this rank's batches; ``state_dict()`` = ``{epoch, batch_index}`` of the next unseen batch.

    - ``set_epoch(e)``: start epoch ``e`` from its first batch (a no-op when ``e`` is the current epoch,
      so calling it after ``load_state_dict`` keeps the resumed position).
    - Iterating to the end of an epoch moves on to the next epoch (``batch_index`` 0).
    - Breaking out early and iterating again continues at the next unseen batch.
    - ``across_epochs`` (training; ``data.prefetch_across_epochs``): one DataLoader iterator runs on
      through the epochs (the sampler goes on into the next epoch), so while the last batches of an
      epoch are consumed the workers already load the next epoch's first ones — no stall at the
      boundary. Each ``for`` over the loader still ends with its epoch, and every batch is the one
      that epoch's own iteration would give. The iterator is kept between ``for`` loops and
      replaced only when the position is moved (``set_epoch`` to another epoch, ``load_state_dict``).
    """

    def __init__(self, dataset: KeyedDataset, sampler, *, mean, std, num_workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = False, prefetch_factor: int = 2,
                 device: torch.device | str | None = None, reporter: BadFileReporter | None = None,
                 across_epochs: bool = False):
        self.dataset, self.sampler = dataset, sampler
        self.epoch, self.batch_index = 0, 0
        self.device = torch.device(device) if device is not None else None
        self.reporter = reporter or BadFileReporter()
        self.across_epochs = across_epochs
        self._live = None  # across_epochs: the DataLoader iterator; its next batch is (epoch, batch_index)
        self._set_stats(dataset.transform.num_channels, mean, std)
        kwargs = {}
        if num_workers > 0:
            kwargs = dict(persistent_workers=persistent_workers, prefetch_factor=prefetch_factor,
                          worker_init_fn=_worker_init)
        self._dl = DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers, collate_fn=worker_collate,
                              pin_memory=pin_memory and torch.cuda.is_available(), **kwargs)

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        if int(epoch) != self.epoch:
            self.epoch, self.batch_index = int(epoch), 0
            self._live = None

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch_index": self.batch_index} | self.reporter.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.batch_index = int(state["epoch"]), int(state["batch_index"])
        self.reporter.load_state_dict(state)
        self._live = None

    def __iter__(self):
        if self.batch_index < len(self):
            if self.across_epochs:
                if self._live is None:
                    self.sampler.set_position(self.epoch, self.batch_index, through_epochs=True)
                    self._live = iter(self._dl)
                it = self._live
            else:
                self.sampler.set_position(self.epoch, self.batch_index)
                it = iter(self._dl)
            while self.batch_index < len(self):
                batch = self._next(it)
                if batch is None:  # the sampler ended (an empty epoch): nothing left to keep
                    self._live = None
                    break
                self.batch_index += 1
                yield self.postprocess(batch)
        self.epoch, self.batch_index = self.epoch + 1, 0

    def _next(self, it):
        # Loading in the main process: per-sample ops are tiny, and intra-op threads only contend.
        threads = torch.get_num_threads() if self._dl.num_workers == 0 else None
        if threads is not None:
            torch.set_num_threads(1)
        try:
            return from_transfer(next(it))  # a worker's small tensors came by value
        except StopIteration:
            return None
        finally:
            if threads is not None:
                torch.set_num_threads(threads)

    def _set_stats(self, c: int, mean, std) -> None:
        """Normalisation constants for ``c`` channels, on the uint8 scale (the device copy is made on
        first use)."""
        mean, std = list(mean), list(std)
        if len(mean) == 3 and c == 1:  # 1-channel model with RGB statistics: use their average
            mean, std = [sum(mean) / 3], [sum(std) / 3]
        if len(mean) != c or len(std) != c:
            raise ValueError(f"data.mean / data.std need {c} values, got {mean} / {std}")
        self._mean = torch.tensor(mean, dtype=torch.float32).view(1, c, 1, 1) * 255.0
        self._inv_std = 1.0 / (torch.tensor(std, dtype=torch.float32).view(1, c, 1, 1) * 255.0)
        self._stats_device: tuple[torch.Tensor, torch.Tensor] | None = None

    def _stats(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and 1/std on ``device``, copied there once (a blocking copy per batch would make the
        host wait for the GPU)."""
        if self._stats_device is None or self._stats_device[0].device != device:
            self._stats_device = (self._mean.to(device), self._inv_std.to(device))
        return self._stats_device

    def postprocess(self, batch: dict) -> dict:
        """uint8 -> normalised float on ``device``, random erasing, bad-file count. With a device the
        small per-sample tensors also stay on the host, as ``batch["host"]``: what is read on the
        host (token-label rows by index) is read from there, never back from the GPU. Every copy to
        the device is non-blocking: nothing here waits for the GPU's queue."""
        img = batch.pop("image", None)  # None: a batch of views (vitscale.data.views), normalised below
        erase = batch.pop("erase")
        bad = batch.pop("bad")
        self.reporter.report_shards(batch.pop("bad_shards", []))
        if self.device is not None:
            host = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
            img = _to(img, self.device) if img is not None else None
            batch = {k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                     for k, v in batch.items()}
            batch["host"] = host
        batch["skipped"] = self.reporter.report(bad)
        if img is None:  # views: each crop group (uint8 (N, C, S, S)) normalised as an image batch is
            for key, v in list(batch.items()):
                if isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.ndim == 4:
                    mean, inv_std = self._stats(v.device)
                    batch[key] = v.float().sub_(mean).mul_(inv_std)
            return batch
        naflex = isinstance(img, dict)  # a NaFlex batch: patches, patch_coord, patch_valid
        mean, inv_std = self._stats(img["patches"].device if naflex else img.device)
        if naflex:
            x = normalise_patches(img, mean, inv_std)  # patches (B, L, P*P*C) normalised, padding zeros
            patch = self.dataset.transform.patch
        else:
            x = img.float().sub_(mean).mul_(inv_std)  # (B, C, H, W) normalised, in place
        for b in torch.nonzero(erase[:, 0]).flatten().tolist():  # erase: host tensor
            _, top, left, h, w, seed = erase[b].tolist()
            noise = torch.randn((mean.shape[1], h, w), generator=torch_gen(seed))
            if naflex:
                grid = batch.get("host", batch)["grid"][b].tolist()  # host tensor: no device read
                erase_patches(x["patches"][b], grid, patch, (top, left, h, w), noise)
            else:
                x[b, :, top:top + h, left:left + w] = noise.to(x.device, non_blocking=True)
        batch["image"] = x
        return batch
