"""The training fast path, on by default on a GPU: autocast, SDPA on the flash / cuDNN backend,
torch.compile per block, fused optimizers, no host synchronisation inside the step.

The trainer, ``vitscale eval``, ``label-tokens`` and ``vitscale bench`` (which measures this path)
take these helpers from here; each degrades to a no-op where the running torch or device lacks the
feature (torch 2.6 is the oldest supported).
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Iterator

import torch
from torch import nn

from ..config.schema import SdpaChoice
from ..distributed.compile import apply_compile
from ..distributed.fsdp import (  # the run's numerics, below the layers that use them
    autocast,
    autocast_factory,
)
from ..models.registry import family_of, parallel_plan

SDPA_CHOICES = typing.get_args(SdpaChoice)  # the choices of train.sdpa, declared once in the config


def _backend_order(choice: str):
    from torch.nn.attention import SDPBackend

    orders = {
        # auto: flash first, cuDNN next, memory-efficient, math as the last resort (odd shapes, masks).
        "auto": ["FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"],
        "flash": ["FLASH_ATTENTION"],
        "cudnn": ["CUDNN_ATTENTION"],
        "efficient": ["EFFICIENT_ATTENTION"],
        "math": ["MATH"],
    }
    return [getattr(SDPBackend, n) for n in orders[choice] if hasattr(SDPBackend, n)]


@contextlib.contextmanager
def sdpa_backend(choice: str = "auto") -> Iterator[None]:
    """Restrict / order ``F.scaled_dot_product_attention`` backends for the enclosed code.

    ``auto`` prefers flash, then cuDNN, then memory-efficient, then math (in that priority where the
    running torch supports ``set_priority``); ``default`` leaves PyTorch's own choice. On CPU the
    flash entry is PyTorch's fused CPU flash kernel.
    """
    if choice not in SDPA_CHOICES:
        raise ValueError(f"sdpa must be one of {SDPA_CHOICES}, got {choice!r}")
    if choice == "default":
        yield
        return
    try:
        from torch.nn.attention import sdpa_kernel
    except ImportError:  # pragma: no cover - torch < 2.3
        yield
        return
    backends = _backend_order(choice)
    try:
        ctx = sdpa_kernel(backends, set_priority=True)
    except TypeError:  # torch without set_priority: the allowed set still holds
        ctx = sdpa_kernel(backends)
    with ctx:
        yield


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """Every repeated block of a zoo model, in order: its family's parallel plan's blocks (the units
    the trainer compiles, checkpoints and shards)."""
    return [block for stack in parallel_plan(family_of(model)).blocks(model) for block in stack]


def compile_blocks(model: nn.Module, **compile_kwargs) -> int:
    """``torch.compile`` each block of a zoo model in place (per-block compile, as torchtitan does:
    one graph reused by every block, short compile times, fullgraph-free fallbacks stay local).
    Returns the number of blocks compiled."""
    blocks = transformer_blocks(model)
    apply_compile(blocks, **compile_kwargs)
    return len(blocks)


def _fused_devices() -> set[str]:
    """Device types with fused AdamW / Adam / SGD kernels in the running torch (CUDA since 2.0,
    the CPU since 2.4)."""
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        return set(_get_fused_kernels_supported_devices())
    except ImportError:  # pragma: no cover - a torch without the helper
        return {"cuda"}


def optimizer_impl(mode: str, device_types: set[str]) -> dict[str, bool]:
    """The implementation keyword of a torch optimizer for ``optim.fused``: ``auto`` = fused kernels
    where the running torch has them for every device of the parameters (CUDA, and the CPU since
    torch 2.4: AdamW / Adam / SGD), foreach elsewhere. Fused kernels take ``found_inf``, so a
    non-finite step is skipped on the device (:mod:`vitscale.train.nonfinite`); on the CPU they are
    also faster than foreach (benchmarks/README.md, "The trainer's own work")."""
    if mode == "none":
        return {"foreach": False}
    if mode == "foreach":
        return {"foreach": True}
    if mode == "fused":
        return {"fused": True}
    return {"fused": True} if device_types and device_types <= _fused_devices() - {"mps"} else {"foreach": True}


def make_adamw(params, device: torch.device, lr: float = 1e-4, weight_decay: float = 0.05) -> torch.optim.AdamW:
    """One AdamW over ``params`` with the fastest implementation for the device (the bench gives every
    implementation it compares this optimizer)."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **optimizer_impl("auto", {device.type}))


__all__ = [
    "SDPA_CHOICES",
    "autocast",
    "autocast_factory",
    "compile_blocks",
    "make_adamw",
    "optimizer_impl",
    "sdpa_backend",
    "transformer_blocks",
]
