"""The fast path, switched on by default on a GPU: bf16 autocast, SDPA on the flash / cuDNN backend,
torch.compile per block, fused AdamW, no host synchronisation inside the step.

These helpers are shared by ``vitscale bench`` and usable by the trainer; each degrades to a no-op
where the running torch or device lacks the feature (torch 2.6 is the oldest supported).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

PRECISIONS = ("auto", "fp32", "bf16")
SDPA_CHOICES = ("auto", "flash", "cudnn", "efficient", "math", "default")


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto`` -> ``bf16`` on CUDA, ``fp32`` elsewhere (bf16 matmuls are slow on most CPUs)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return precision


def autocast(device: torch.device, precision: str):
    """bf16 autocast (fp32 master weights, as in mixed-precision training) or nothing for fp32."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


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


BLOCK_CONTAINERS = ("blocks", "layers", "resblocks", "network", "outlookers", "class_blocks")
# VOLO's outlooker and class-attention stages are block stacks too (the trainer compiles them:
# vitscale.models.volo.parallelize.all_blocks); left out, they ran eager under `vitscale bench`.


def transformer_blocks(model: nn.Module) -> list[tuple[nn.ModuleList, int]]:
    """(container, index) of every repeated block: the children of each ModuleList named like a
    block stack (``blocks``, ``layers``, ``resblocks``) anywhere in the model."""
    found = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and name.rsplit(".", 1)[-1] in BLOCK_CONTAINERS:
            found.extend((mod, i) for i in range(len(mod)))
    return found


def compile_blocks(model: nn.Module, **compile_kwargs) -> int:
    """``torch.compile`` each transformer block in place (per-block compile, as torchtitan does:
    one graph reused by every block, short compile times, fullgraph-free fallbacks stay local).

    Returns the number of blocks compiled; a model without a block stack is compiled whole.
    """
    blocks = transformer_blocks(model)
    if not blocks:
        model.compile(**compile_kwargs)
        return 1
    for container, i in blocks:
        container[i].compile(**compile_kwargs)
    return len(blocks)


def make_adamw(
    params, device: torch.device, lr: float = 1e-4, weight_decay: float = 0.05
) -> torch.optim.AdamW:
    """AdamW with the fastest implementation for the device: fused on CUDA, foreach on CPU."""
    if device.type == "cuda":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=True)


__all__ = [
    "PRECISIONS",
    "SDPA_CHOICES",
    "autocast",
    "compile_blocks",
    "make_adamw",
    "resolve_precision",
    "sdpa_backend",
    "transformer_blocks",
]
