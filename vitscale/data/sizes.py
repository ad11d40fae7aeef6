"""Variable resolution: which image size (or NaFlex sequence length) and batch each step trains at.

``data.image_sizes`` (multi-resolution image batches) or ``data.seq_lens`` (NaFlex patch batches)
list the sizes; ``data.batch_sizes`` or ``data.tokens_per_batch`` give each its global batch. The
size of optimizer step ``s`` (0-based) is a pure function of ``(train.seed, s)``: a keyed draw
(``size_schedule: random``) or the stage that ``s`` falls in (``progressive``, stages as fractions of
the run). So every rank, every parallel layout and every resume picks the same size for a step, as
timm's NaFlex loader (``timm/data/naflex_loader.py``: a sequence length per batch, batch size from a
token budget) and open_clip's ``--naflex-seq-lens`` / ``--naflex-max-tokens-per-batch`` do per epoch.

:func:`size_plan` builds the :class:`SizePlan` of a config; :func:`check_sizes` refuses in one line
what cannot run (a size not divisible by the patch, smaller than one patch, a budget below one
sequence), before anything is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..errors import CheckError
from .keyed import STREAM_SIZE, py_rng


@dataclass
class SizePlan:
    """The sizes of a run and the batch of each; ``index(step)`` is the size of a step."""

    mode: Literal["multi", "naflex"]
    """``multi``: square image batches of ``sizes`` pixels; ``naflex``: patch batches of ``sizes`` tokens."""
    sizes: tuple[int, ...]
    """Image sides (``multi``) or sequence lengths (``naflex``)."""
    batches: tuple[int, ...]
    """Images per optimizer step over all ranks, per size (multiples of ranks x accumulation)."""
    schedule: str
    """``random`` or ``progressive``."""
    stages: tuple[float, ...]
    """``progressive``: the fraction of the run at which each size starts."""
    seed: int
    accum: int
    """Micro-batches per optimizer step (``train.grad_accum``): they share their step's size."""
    patch: int
    total_steps: int = 0
    """Steps of the run (``progressive`` needs it; set by the run assembly once the loader's length is known)."""

    def index(self, step: int) -> int:
        """Which size optimizer step ``step`` (0-based, counted over the whole run) trains at."""
        if len(self.sizes) == 1:
            return 0
        if self.schedule == "progressive":
            frac = step / max(self.total_steps, 1)
            return max(k for k, start in enumerate(self.stages) if start <= frac)
        return py_rng(self.seed, step, STREAM_SIZE).randrange(len(self.sizes))

    def shares(self) -> list[float]:
        """The expected share of steps at each size."""
        if self.schedule == "progressive":
            ends = [*self.stages[1:], 1.0]
            return [e - s for s, e in zip(self.stages, ends)]
        return [1.0 / len(self.sizes)] * len(self.sizes)

    def steps_per_epoch(self, n: int) -> int:
        """Optimizer steps that take about ``n`` images (one pass over the data) at the expected batch."""
        mean = sum(w * b for w, b in zip(self.shares(), self.batches))
        return max(1, round(n / mean))

    def tokens(self, k: int) -> int:
        """Patch tokens of one image at size ``k`` (a sequence length for NaFlex)."""
        s = self.sizes[k]
        return s if self.mode == "naflex" else (s // self.patch) ** 2

    def describe(self) -> str:
        unit = "tokens" if self.mode == "naflex" else "px"
        what = ", ".join(f"{s} {unit} x {b}" for s, b in zip(self.sizes, self.batches))
        how = "a keyed draw per step" if self.schedule == "random" else "progressive stages " + ", ".join(
            f"{s:g}" for s in self.stages)
        return f"{'NaFlex sequence lengths' if self.mode == 'naflex' else 'image sizes'} {what} images per step ({how})"


def _key(mode: str) -> str:
    return "data.seq_lens" if mode == "naflex" else "data.image_sizes"


def check_sizes(d, *, patch: int, batch_size: int, parts: int, min_tokens: int = 1) -> None:
    """:class:`CheckError` in one line for variable-resolution settings of ``d`` (the ``data`` group)
    that cannot run with a model of patch ``patch``: ``parts`` = data-parallel ranks x grad_accum,
    every batch a multiple of it. ``min_tokens``: the fewest patches an image of the data keeps its
    aspect ratio in (the most elongated image's long side over its short side)."""
    if d.image_sizes and d.seq_lens:
        raise CheckError("data.image_sizes and data.seq_lens are two ways of training at several sizes: set one "
                         "(image_sizes: square image batches; seq_lens: NaFlex patch batches)")  # fmt: skip
    if d.img_size is not None and d.img_size < patch:
        raise CheckError(f"data.img_size={d.img_size} is smaller than one patch ({patch} px): use at least {patch}")
    for key, side in (("data.eval_image_size", d.eval_image_size), *((f"data.image_sizes[{i}]", s) for i, s in enumerate(d.image_sizes))):
        if side is None:
            continue
        if side < patch:
            raise CheckError(f"{key}={side} is smaller than one patch ({patch} px): an image needs at least one patch, use {patch} or more")
        if side % patch:
            raise CheckError(f"{key}={side} is not divisible by the model's patch size {patch}: use a multiple, e.g. "
                             f"{max(patch, side // patch * patch)}")  # fmt: skip
    mode = "naflex" if d.seq_lens else "multi"
    sizes = d.seq_lens or d.image_sizes
    check_seq_lens(d, min_tokens)
    if d.eval_image_size is not None and not d.image_sizes:
        raise CheckError("data.eval_image_size is the evaluation size of multi-resolution training: set data.image_sizes "
                         "too, or data.img_size for one size")  # fmt: skip
    if d.eval_seq_len is not None and not d.seq_lens:
        raise CheckError("data.eval_seq_len is the evaluation sequence length of NaFlex training: set data.seq_lens too")
    if not sizes:
        for key in ("batch_sizes", "tokens_per_batch", "size_stages"):
            if getattr(d, key):
                raise CheckError(f"data.{key} sets the batches of several sizes: set data.image_sizes or data.seq_lens too")
        return
    if d.batch_sizes and d.tokens_per_batch:
        raise CheckError("data.batch_sizes and data.tokens_per_batch both set each size's batch: set one")
    if d.batch_sizes and len(d.batch_sizes) != len(sizes):
        raise CheckError(f"data.batch_sizes has {len(d.batch_sizes)} entries for {len(sizes)} sizes of {_key(mode)}: give one per size")
    if d.size_stages:
        st = list(d.size_stages)
        if len(st) != len(sizes) or st[0] != 0 or any(b <= a for a, b in zip(st, st[1:])) or st[-1] >= 1:
            raise CheckError(f"data.size_stages={st} must give, for each of the {len(sizes)} sizes, the fraction of the run it "
                             f"starts at: 0 first, increasing, below 1 (e.g. {[round(i / len(sizes), 2) for i in range(len(sizes))]})")  # fmt: skip
    plan = size_plan(d, patch=patch, batch_size=batch_size, parts=parts, seed=0, accum=1)
    for k, b in enumerate(plan.batches):
        if b < parts or b % parts:
            need = plan.tokens(k) * parts
            if d.tokens_per_batch:
                raise CheckError(
                    f"data.tokens_per_batch={d.tokens_per_batch} is below one sequence per rank: size {plan.sizes[k]} takes "
                    f"{plan.tokens(k)} tokens an image, x {parts} ranks x accumulation steps = at least {need}")  # fmt: skip
            raise CheckError(f"data.batch_sizes[{k}]={b} must be a positive multiple of data-parallel ranks x "
                             f"train.grad_accum = {parts}")  # fmt: skip


MAX_SEQ_LEN = 262_144
"""Most patches a NaFlex sequence may have: an 8192 px square (the largest image side a run may ask
for, ``vitscale.config.ranges.MAX_IMAGE_SIDE``) at patch 16; a larger value is a typo that would fail
allocating its batch."""


def check_seq_lens(d, min_tokens: int) -> None:
    """:class:`CheckError` when a NaFlex sequence length of ``d`` is below ``min_tokens``, the fewest
    patches the data's most elongated image keeps its aspect ratio in (:func:`min_patches_for`)."""
    for key, n in (("data.eval_seq_len", d.eval_seq_len), *((f"data.seq_lens[{i}]", s) for i, s in enumerate(d.seq_lens))):
        if n is not None and n > MAX_SEQ_LEN:
            raise CheckError(f"{key}={n} is not a usable sequence length: use 1 to {MAX_SEQ_LEN} patches (an 8192 px "
                             "square at patch 16; e.g. 256)")  # fmt: skip
        if n is not None and n < min_tokens:
            raise CheckError(f"{key}={n} is below the smallest image's minimum of {min_tokens} patches (its aspect "
                             f"ratio on a grid one patch wide): use at least {min_tokens}")  # fmt: skip


def size_plan(d, *, patch: int, batch_size: int, parts: int, seed: int, accum: int) -> SizePlan | None:
    """The :class:`SizePlan` of the ``data`` group ``d`` (None: one size per run). ``batch_size``:
    ``train.batch_size``; ``parts``: data-parallel ranks x ``accum`` (each batch a multiple of it)."""
    if not (d.image_sizes or d.seq_lens):
        return None
    mode = "naflex" if d.seq_lens else "multi"
    sizes = tuple(int(s) for s in (d.seq_lens or d.image_sizes))
    tokens = [s if mode == "naflex" else (s // patch) ** 2 for s in sizes]
    budget = d.tokens_per_batch or (batch_size * max(tokens) if mode == "naflex" and not d.batch_sizes else 0)
    if d.batch_sizes:
        batches = tuple(int(b) for b in d.batch_sizes)
    elif budget:
        batches = tuple(budget // t // parts * parts for t in tokens)
    else:
        batches = (int(batch_size),) * len(sizes)
    stages = tuple(float(s) for s in d.size_stages) or tuple(k / len(sizes) for k in range(len(sizes)))
    return SizePlan(mode, sizes, batches, d.size_schedule, stages, int(seed), int(accum), int(patch))


def eval_size(d) -> int | None:
    """The evaluation image side (multi-resolution) or sequence length (NaFlex) of ``d``; None = one size."""
    if d.seq_lens:
        return int(d.eval_seq_len or max(d.seq_lens))
    if d.image_sizes:
        return int(d.eval_image_size or max(d.image_sizes))
    return None


def min_patches_for(aspects) -> int:
    """The fewest patches that keep every aspect ratio of ``aspects`` ((h, w) pairs): the long side over
    the short side, rounded up, on a grid one patch wide."""
    return max((math.ceil(max(h, w) / min(h, w)) for h, w in aspects), default=1)


def check_batches(loaders, *, batch_size: int, dp_size: int, tokens_per_batch: int | None = None) -> None:
    """An epoch of the training loader (``loaders.train``) holds at least one batch of ``batch_size``
    over ``dp_size`` data-parallel ranks (else there is nothing to train on); with several sizes
    (``loaders.sizes``, a :class:`SizePlan`) every size's batch, as the one size's is
    (``data.tokens_per_batch`` / ``data.batch_sizes`` far beyond the data were accepted, then one step
    gathered epochs of images and none ran)."""
    try:
        images = len(loaders.train.dataset)
    except (AttributeError, TypeError):  # a stream has no length
        images = None
    sizes = loaders.sizes
    if sizes is not None and images is not None:
        for k, b in enumerate(sizes.batches):
            if b > images:
                key = (f"data.tokens_per_batch={tokens_per_batch} makes the batch of size {sizes.sizes[k]} "
                       f"{b} images" if tokens_per_batch else f"data.batch_sizes[{k}]={b}")
                raise CheckError(f"{key}, more than the {images} training images (an epoch has no full batch): "
                                 "lower it, or add data")  # fmt: skip
    if len(loaders.train) > 0:
        return
    have = f"the {images} training images" if images is not None else "the training data"
    raise CheckError(
        f"train.batch_size={batch_size} is more than {have} can fill"
        f"{f' over {dp_size} data-parallel ranks' if dp_size > 1 else ''} (an epoch has no full batch): lower "
        f"train.batch_size, or add data"
    )


__all__ = ["SizePlan", "check_batches", "check_seq_lens", "check_sizes", "eval_size", "min_patches_for", "size_plan"]
