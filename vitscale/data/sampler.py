"""Batch samplers that shard a keyed epoch permutation over ranks.

Training: the epoch order is a permutation keyed by (seed, epoch). Global micro-batch ``b`` is
``perm[b * G:(b + 1) * G]`` with ``G = micro_batch_size * world_size``, and rank ``r`` takes the
STRIDED slice ``chunk[r::world_size]``. So the union over ranks of one step's micro-batches is the
1-process batch of that step, and an optimizer step of ``B`` images covers ``perm[s*B:(s+1)*B]``
whatever the number of ranks and accumulation steps. Items are ``(epoch, index)`` so workers key
their augmentation without sharing state (works with persistent workers), and one iteration may run
on through the following epochs (``set_position(..., through_epochs=True)``) with every batch keyed
exactly as in an iteration of its own epoch.

A task's mixture of views (``mixture``: the weights of :attr:`vitscale.data.views.Views.mixture`,
DINOv3's crop-size pairs) cuts one choice per optimizer step (``accum`` micro-batches): items are
``(epoch, index, None, repeat, choice)``, the choice drawn by :func:`vitscale.data.views.mixture_index`
from ``(seed, epoch, step)``, so it is the same on every rank and after a resume.

Repeated augmentation (``repeats`` = ``data.repeated_aug`` > 1; DeiT, facebookresearch/deit
``samplers.py`` ``RASampler``, on by default with 3 repeats in its ``main.py``): the epoch's sample
stream is the keyed permutation with each entry repeated ``repeats`` times in a row — stream position
``p`` is image ``perm[p // repeats]``, repeat ``p % repeats`` — and micro-batches cut that stream
exactly as above. So consecutive repeats of an image fall on consecutive ranks of the strided slice
(different ranks whenever ``world_size >= repeats``, as RASampler deals them), each with its own
augmentation: items are ``(epoch, index, None, repeat)`` and the sample's keys take the repeat
(:meth:`vitscale.data.transforms.SampleTransform.repeated`). The epoch's length is kept: it is the
same ``n // (micro_batch_size * world_size)`` micro-batches per rank as without repeats
(``ceil`` without ``drop_last``, a last global batch that does not split evenly over the ranks
wrapping round to the stream's start), so an epoch of ``S`` stream positions over all ranks
(``S = len x micro_batch_size x world_size`` with ``drop_last``, else ``n``) shows the first
``ceil(S / repeats)`` images of its permutation, ``repeats`` times each (the last one fewer times when
``S`` ends inside its repeats); the next epoch's permutation picks another subset. RASampler keeps
the length the same way and differs only in rounding: ``floor(n // 256 * 256 / world_size)``
samples per rank (the dataset size rounded down to a multiple of 256, shared by the ranks).
"""

from __future__ import annotations

import math

import torch

from .keyed import epoch_permutation
from .views import mixture_index


class ShardedBatchSampler:
    """Yields this rank's micro-batches of ``(epoch, index)`` (with ``repeats`` > 1:
    ``(epoch, index, None, repeat)``) from ``start`` onward in ``epoch``."""

    def __init__(self, n: int, micro_batch_size: int, *, seed: int, rank: int = 0, world_size: int = 1,
                 shuffle: bool = True, drop_last: bool = True, repeats: int = 1, mixture: tuple[float, ...] = (),
                 accum: int = 1):  # fmt: skip
        if micro_batch_size <= 0:
            raise ValueError(f"micro_batch_size must be positive, got {micro_batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world_size {world_size}")
        if repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {repeats}")
        self.n, self.micro, self.seed = n, micro_batch_size, seed
        self.repeats = int(repeats)
        self.rank, self.world = rank, world_size
        self.shuffle, self.drop_last = shuffle, drop_last
        self.mixture, self.accum = tuple(mixture), max(int(accum), 1)
        self.global_batch = micro_batch_size * world_size
        if drop_last and n < self.global_batch:
            raise ValueError(
                f"dataset of {n} samples is smaller than one global micro-batch of {self.global_batch} "
                f"({micro_batch_size} x {world_size} ranks)"
            )
        self.epoch = 0
        self.start = 0
        self.through = False

    def __len__(self) -> int:
        if self.drop_last:
            return self.n // self.global_batch
        return math.ceil(self.n / self.global_batch)

    def set_position(self, epoch: int, start: int, through_epochs: bool = False) -> None:
        """Iterate from batch ``start`` of ``epoch``: to the end of that epoch, or with
        ``through_epochs`` on into the following epochs without end (one DataLoader iterator whose
        workers run ahead across epoch boundaries; see ``ResumableLoader``)."""
        self.epoch, self.start, self.through = int(epoch), int(start), bool(through_epochs)

    def indices(self, epoch: int, b: int) -> list[int]:
        """Dataset indices of this rank's micro-batch ``b`` of ``epoch``."""
        return [item[1] for item in self.items(epoch, b)]

    def items(self, epoch: int, b: int, perm=None) -> list[tuple]:
        """This rank's items of micro-batch ``b`` of ``epoch``: ``(epoch, index)``, or with repeats
        ``(epoch, index, None, repeat)`` (``None``: the transform's own size)."""
        if perm is None:
            perm = epoch_permutation(self.n, self.seed, epoch, self.shuffle)
        pos = self._chunk(perm, b)
        if self.repeats == 1 and not self.mixture:
            return [(epoch, i) for i in pos]
        if self.repeats == 1:
            items = [(epoch, i, None, 0) for i in pos]
        else:
            images = perm[torch.tensor(pos, dtype=torch.long) // self.repeats].tolist()
            items = [(epoch, i, None, p % self.repeats) for i, p in zip(images, pos)]
        if self.mixture:  # a mixture of views: the step's choice with every item (vitscale.data.views.mixture_index)
            k = mixture_index(self.mixture, self.seed, epoch, b // self.accum)
            items = [(*item, k) for item in items]
        return items

    def _chunk(self, perm, b: int) -> list[int]:
        """This rank's share of global micro-batch ``b``: dataset indices, or with repeats the
        positions in the epoch's stream (``perm[p // repeats]`` is the image)."""
        if self.repeats > 1:
            perm = torch.arange(self.n)  # stream positions: the epoch holds n of them, as without repeats
        chunk = perm[b * self.global_batch:(b + 1) * self.global_batch].tolist()
        if len(chunk) % self.world:  # last, partial global batch: wrap around so every rank gets some
            chunk += perm[: self.world - len(chunk) % self.world].tolist()
        return chunk[self.rank::self.world]

    def __iter__(self):
        epoch, start, through = self.epoch, self.start, self.through
        while True:
            perm = epoch_permutation(self.n, self.seed, epoch, self.shuffle)
            for b in range(start, len(self)):
                yield self.items(epoch, b, perm)
            if not through or len(self) == 0:
                return
            epoch, start = epoch + 1, 0


class EvalShardSampler:
    """The split in order, in batches of ``batch_size``, dealt out to the ranks whole: rank ``r`` takes
    batches ``r, r + world_size, r + 2 * world_size, …`` of the one-process sequence.

    Every image is evaluated once (no padding with repeated images, none dropped), and each batch is
    exactly a batch of the one-process evaluation, so a sharded model computes the same numbers for
    it. Every rank gets the same number of batches, ``ceil(batches / world_size)``: a sharded model's
    forward is a collective (FSDP2 all-gathers, TP reductions) that all ranks must run together, so a
    rank past the end gets a one-image *padding* batch, the item ``(0, PAD)`` (index ``PAD`` = -1:
    ``KeyedDataset`` gives sample 0 with index -1), which evaluation ignores.
    """

    PAD = -1

    def __init__(self, n: int, batch_size: int, *, rank: int = 0, world_size: int = 1):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world_size {world_size}")
        self.n, self.batch_size, self.rank, self.world = n, batch_size, rank, world_size
        self.batches = math.ceil(n / batch_size)  # of the one-process evaluation
        self.epoch, self.start = 0, 0

    def __len__(self) -> int:
        return math.ceil(self.batches / self.world) if self.n else 0

    def set_position(self, epoch: int, start: int) -> None:
        self.epoch, self.start = int(epoch), int(start)

    def indices(self, b: int) -> list[int]:
        """Dataset indices of this rank's batch ``b`` (``[PAD]`` for a padding batch)."""
        g = b * self.world + self.rank  # the one-process batch
        if g >= self.batches:
            return [self.PAD]
        return list(range(g * self.batch_size, min((g + 1) * self.batch_size, self.n)))

    def __iter__(self):
        for b in range(self.start, len(self)):
            yield [(0, i) for i in self.indices(b)]
