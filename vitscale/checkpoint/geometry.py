"""A checkpoint's index checked as geometry, not arithmetic: the chunks of every tensor lie inside its
shape, are disjoint and cover it exactly; each chunk's bytes lie inside its file, apart from every
other chunk's; no shape overflows.

Why geometry: chunks whose element counts merely add up to the tensor's can list one chunk many times
and leave rows that no chunk covers; a reader that allocates the tensor with ``torch.empty`` and fills
it chunk by chunk then hands out whatever the allocator's memory held (heap pointers, a previous
tensor) as weights. The safetensors format asks the same of its own files: the tensors' byte ranges
tile the data exactly (https://github.com/huggingface/safetensors, README "Format"), which
:func:`vitscale.checkpoint.safetensors_io` checks; this module does it for the chunks of a tensor.

The cover check is exact and bounded: the chunks' boundaries cut each dimension into segments, the
segments form a grid of cells (a checkpoint of vitscale's layouts — FSDP rows times TP columns — has
one cell per chunk), each chunk covers a box of cells, and every cell must be covered exactly once
(counted with NumPy). A layout cut into more than :data:`MAX_CELLS` cells is refused rather than
checked slowly: no layout vitscale writes comes near it.
"""

from __future__ import annotations

import math

import numpy as np

MAX_DIMS = 32
"""Most dimensions a stored tensor may have (vitscale's tensors have at most 5)."""
MAX_CELLS = 1 << 24
"""Most grid cells the cover check of one tensor may count (16 M; one per chunk in practice)."""
_LIMIT = 1 << 63  # int64: PyTorch's element counts, strides and byte sizes


def shape_problem(shape: list[int], itemsize: int) -> str | None:
    """Why ``shape`` cannot be a tensor (too many dimensions, an element count or byte size past
    int64 — also when a zero makes it empty: strides still multiply the other sides), else None."""
    if len(shape) > MAX_DIMS:
        return f"{len(shape)} dimensions, more than {MAX_DIMS}"
    span = math.prod(max(int(d), 1) for d in shape)
    if span * max(itemsize, 1) >= _LIMIT:
        return f"shape {list(shape)[:8]} overflows (more than 2^63 bytes)"
    return None


def cover_problem(shape: list[int], chunks: list[tuple[list[int], list[int]]]) -> str | None:
    """Why the chunks ``(offsets, sizes)`` do not tile ``shape`` exactly — one outside the tensor,
    two overlapping, part of the tensor covered by none — else None."""
    for offsets, sizes in chunks:
        if any(o + s > d for o, s, d in zip(offsets, sizes, shape)):
            return "a chunk reaches outside the tensor"
    if math.prod(shape) == 0:
        return None  # nothing to cover (zero-size chunks cover nothing either)
    # Boundaries per dimension: the grid's lines; every chunk is a box of whole cells.
    bounds = [np.unique(np.array([0, d] + [o[i] for o, _ in chunks] + [o[i] + s[i] for o, s in chunks], dtype=np.int64))
              for i, d in enumerate(shape)]  # fmt: skip
    cells = math.prod(len(b) - 1 for b in bounds)
    boxes = []
    covered = 0
    for offsets, sizes in chunks:
        lo = [int(np.searchsorted(b, o)) for b, o in zip(bounds, offsets)]
        hi = [int(np.searchsorted(b, o + s)) for b, o, s in zip(bounds, offsets, sizes)]
        n = math.prod(h - low for low, h in zip(lo, hi))
        if n:
            boxes.append((lo, hi))
            covered += n
    if covered < cells:
        return "part of the tensor is in no chunk (its chunks leave a gap)"
    if covered > cells:
        return "two of its chunks overlap (the same elements stored twice)"
    if cells > MAX_CELLS:
        return f"its chunks cut it into {cells} pieces, more than the {MAX_CELLS} this check counts"
    count = np.zeros([len(b) - 1 for b in bounds], dtype=np.int32)
    for lo, hi in boxes:
        count[tuple(slice(a, b) for a, b in zip(lo, hi))] += 1
    if count.min() != 1 or count.max() != 1:  # as many cells as the boxes hold: a gap means an overlap
        return "two of its chunks overlap (the same elements stored twice)"
    return None


def spans_problem(spans: list[tuple[int, int]]) -> str | None:
    """Why the byte ranges ``(start, length)`` of the chunks in one file overlap, else None (empty
    ranges overlap nothing)."""
    end = -1
    for start, length in sorted(s for s in spans if s[1] > 0):
        if start < end:
            return f"two chunks share bytes (one at byte {start} starts inside another)"
        end = start + length
    return None


__all__ = ["MAX_CELLS", "MAX_DIMS", "cover_problem", "shape_problem", "spans_problem"]
