"""Finite values, checked fast: before a checkpoint or export is written, and as a checkpoint's files
are verified on load (in the same read as their checksums).

The test of a floating tensor is its **sum**: a NaN or an infinity anywhere makes the sum NaN or
infinite whatever the order of the additions, so a finite sum proves every element finite. A sum is
one streaming reduction without an output tensor, many times faster than ``torch.isfinite(t).all()``
(which writes a boolean per element first); only a sum that is *not* finite — a non-finite element,
or finite values whose sum overflows — is looked at element by element. Half-precision tensors are
summed in float32 (their sums overflow float16 easily); on the CPU the sum is NumPy's.
Measured on a ViT-B/16-sized state: ``benchmarks/checkpoint_finite.py`` (figures in docs/trust.md).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch

from .integrity import HASH_NAME, CorruptFile, hasher, open_member

_BLOCK = 16 << 20  # bytes per read: a multiple of every itemsize

_SUM_DTYPE = {torch.float32: torch.float32, torch.float64: torch.float64, torch.float16: torch.float32, torch.bfloat16: torch.float32}
_NUMPY = {torch.float32: None, torch.float64: None, torch.float16: "float32"}  # dtype -> NumPy accumulator


def _sum(t: torch.Tensor) -> torch.Tensor:
    acc = _SUM_DTYPE.get(t.dtype)
    return (t.sum(dtype=acc) if acc is not None else t.float().sum()).float()  # float8: no sum kernel


def _cpu_sum_finite(t: torch.Tensor) -> bool:
    """On the CPU a NumPy sum (one thread, SIMD): as fast as PyTorch's on an idle machine, and unlike
    PyTorch's multi-threaded reduction, not 20x slower when other processes hold the cores."""
    if t.dtype in _NUMPY:
        with np.errstate(over="ignore", invalid="ignore"):  # an overflowing sum is looked at again, quietly
            return math.isfinite(float(np.add.reduce(t.numpy(), axis=None, dtype=_NUMPY[t.dtype])))
    return bool(torch.isfinite(_sum(t)))  # bfloat16, float8: no NumPy dtype


def finite_flags(tensors: list[torch.Tensor]) -> list[bool]:
    """Whether each floating tensor of ``tensors`` (all on one device) holds only finite values; on an
    accelerator one host read for all of them (plus one per tensor whose sum is not finite)."""
    if not tensors:
        return []
    plain = [type(t) is torch.Tensor for t in tensors]  # a subclass (torchao's float8 weights) takes the exact test
    if tensors[0].device.type == "cpu":
        quick = [_cpu_sum_finite(t) if p else False for t, p in zip(tensors, plain)]
    else:
        sums = [_sum(t) for t, p in zip(tensors, plain) if p]
        flags = iter(torch.isfinite(torch.stack(sums)).tolist() if sums else [])
        quick = [next(flags) if p else False for p in plain]
    return [True if fine else bool(torch.isfinite(t).all()) for t, fine in zip(tensors, quick)]


def scan_file(path: Path, size: int, checksum: str, spans: list[tuple[int, int, torch.dtype, str]]) -> None:
    """Check a checkpoint file in one read: its size and checksum, and that the floating chunks at
    ``spans`` — ``(start, length, dtype, tensor name)``, disjoint, inside the file — hold only finite
    values. Raises :class:`CorruptFile` naming the first problem (a checksum mismatch first)."""
    actual = os.lstat(path).st_size
    if actual != size:
        raise CorruptFile(path, f"{actual} bytes, the checkpoint recorded {size} (truncated or replaced)")
    h = hasher()
    buf = torch.empty(_BLOCK, dtype=torch.uint8)  # torch's allocation is 64-byte aligned: sums run ~3x faster than on a bytearray
    view = memoryview(buf.numpy())
    nonfinite: str | None = None
    with open_member(path) as f:

        def pump(n: int, dtype: torch.dtype | None = None, name: str = "") -> None:
            nonlocal nonfinite
            while n > 0:
                k = min(n, _BLOCK)
                got = 0
                while got < k:
                    r = f.readinto(view[got:k])
                    if not r:
                        raise CorruptFile(path, "ends early (truncated)")
                    got += r
                h.update(view[:k])
                if dtype is not None and nonfinite is None and not finite_flags([buf[:k].view(dtype)])[0]:
                    nonfinite = name
                n -= k

        pos = 0
        for start, length, dtype, name in sorted(spans, key=lambda s: s[0]):
            pump(start - pos)
            pump(length, dtype, name)
            pos = start + length
        pump(size - pos)
    got = h.hexdigest()
    if got != checksum:
        raise CorruptFile(path, f"checksum mismatch ({HASH_NAME} {got}, recorded {checksum}): the file changed after it was written")
    if nonfinite is not None:
        raise CorruptFile(path, f"non-finite values (NaN or infinity) in {nonfinite}: a checkpoint never holds them")


__all__ = ["finite_flags", "scan_file"]
