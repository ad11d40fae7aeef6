"""The training batch sampler of variable-resolution runs: a size and a batch per optimizer step.

The samples are one keyed stream, the epoch permutations (keyed by (seed, epoch), as
:class:`vitscale.data.sampler.ShardedBatchSampler`) one after another. Optimizer step ``s`` takes the
next ``batches[k]`` positions of that stream, ``k`` its size (:meth:`SizePlan.index`, a pure function
of (seed, s)); its ``grad_accum`` micro-batches split them in order, and rank ``r`` of ``world`` takes
the strided slice ``[r::world]`` of each. So the union over ranks of a step's micro-batches is the
one-process batch of that step whatever the layout, and a resume at any step finds the same images at
the same size. An "epoch" of this loader is :meth:`SizePlan.steps_per_epoch` steps (about one pass);
items are ``(permutation epoch, index, size)``, the augmentation keyed by the permutation's epoch.

With ``repeats`` > 1 (``data.repeated_aug``, DeiT's RASampler; :mod:`vitscale.data.sampler`) position
``i`` of a permutation epoch is image ``perm[i // repeats]``, repeat ``i % repeats``, as in
:class:`~vitscale.data.sampler.ShardedBatchSampler`: a permutation epoch keeps its ``n`` positions
and shows its first ``ceil(n / repeats)`` images, each ``repeats`` times on consecutive ranks; items
are ``(permutation epoch, index, size, repeat)``.
"""

from __future__ import annotations

from .keyed import epoch_permutation
from .sizes import SizePlan


class SizedBatchSampler:
    """Yields this rank's micro-batches of ``(epoch, index, size)`` (with ``repeats`` > 1:
    ``(epoch, index, size, repeat)``) from ``start`` onward in ``epoch``."""

    def __init__(self, n: int, plan: SizePlan, *, rank: int = 0, world_size: int = 1, repeats: int = 1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world_size {world_size}")
        if repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {repeats}")
        self.n, self.plan, self.rank, self.world = n, plan, rank, world_size
        self.repeats = int(repeats)
        self.epoch, self.start, self.through = 0, 0, False
        self._offsets: list[int] = [0]  # stream position of each step's first image
        self._cached_total = plan.total_steps
        self._perms: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return self.plan.steps_per_epoch(self.n) * self.plan.accum

    def set_position(self, epoch: int, start: int, through_epochs: bool = False) -> None:
        self.epoch, self.start, self.through = int(epoch), int(start), bool(through_epochs)

    def _offset(self, step: int) -> int:
        if self._cached_total != self.plan.total_steps:  # progressive stages moved with the run length
            self._offsets, self._cached_total = [0], self.plan.total_steps
        while len(self._offsets) <= step:
            s = len(self._offsets) - 1
            self._offsets.append(self._offsets[-1] + self.plan.batches[self.plan.index(s)])
        return self._offsets[step]

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            if len(self._perms) > 2:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = epoch_permutation(self.n, self.plan.seed, epoch).tolist()
        return self._perms[epoch]

    def micro_batch(self, m: int) -> list[tuple[int, int, int]]:
        """This rank's items of global micro-batch ``m`` (counted over the run)."""
        plan = self.plan
        step, j = divmod(m, plan.accum)
        k = plan.index(step)
        size = plan.batches[k] // plan.accum
        first = self._offset(step) + j * size
        items = []
        for p in range(first + self.rank, first + size, self.world):
            e, i = divmod(p, self.n)
            if self.repeats == 1:
                items.append((e, self._perm(e)[i], plan.sizes[k]))
            else:
                items.append((e, self._perm(e)[i // self.repeats], plan.sizes[k], i % self.repeats))
        return items

    def __iter__(self):
        per_epoch = len(self)
        epoch, start = self.epoch, self.start
        while True:
            for b in range(start, per_epoch):
                yield self.micro_batch(epoch * per_epoch + b)
            if not self.through:
                return
            epoch, start = epoch + 1, 0


__all__ = ["SizedBatchSampler"]
