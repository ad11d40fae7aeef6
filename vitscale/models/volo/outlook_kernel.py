"""Outlook attention's aggregation, two ways, and the switch between them (``VOLOConfig.outlook_impl``).

Both take the values ``v`` ``(B, H, W, C)`` and the attention logits ``(B, h, w, nH * K^4)`` (rows per
head ``(nH, K2 output slots, K2 gathered slots)``, ``K2 = K * K``) and return ``(B, H, W, C)``:
``fold(softmax(scale * logits) @ unfold(v))`` (Yuan et al. 2021, arXiv:2106.13112, Algorithm 1).

- :func:`outlook_reference` (``eager``): ``F.unfold`` -> batched matmul -> ``F.fold``, materialising
  the unfolded ``(B, nH, h*w, K2, Dh)`` values and results.
- :func:`outlook_attention` (``triton``): the custom op ``vitscale::outlook_attention`` (forward and
  backward Triton kernels, ``vitscale/models/volo/outlook_triton.py``) that never materialises them.
  As a ``torch.library.custom_op`` with a registered autograd formula and fake (meta) function,
  ``torch.compile`` traces it as one opaque node: no graph break. It has no attention dropout.

The head count is read from the logits' width, so under tensor parallelism (heads sharded, local
tensors) each rank runs it on its own heads.
"""

import importlib.util  # no `from __future__ import annotations`: custom_op reads the annotations as types
import os

import torch
import torch.nn.functional as F
from torch import nn

HAS_TRITON = importlib.util.find_spec("triton") is not None
# Triton's interpreter (TRITON_INTERPRET=1, read when the kernels are defined) runs them on CPU tensors.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def outlook_reference(v: torch.Tensor, logits: torch.Tensor, kernel: int, padding: int, stride: int, scale: float,
                      attn_drop: nn.Module | None = None) -> torch.Tensor:  # fmt: skip
    """Outlook attention by unfold -> softmax-weighted sum per window -> fold (the eager path)."""
    B, H, W, C = v.shape
    _, h, w, _ = logits.shape
    K2 = kernel * kernel
    Dh = C // (logits.shape[-1] // (K2 * K2))
    vu = F.unfold(v.permute(0, 3, 1, 2), kernel, padding=padding, stride=stride)  # (B, C*K2, h*w), C-major
    vu = vu.view(B, -1, Dh, K2, h * w).permute(0, 1, 4, 3, 2)  # (B, nH, h*w, K2, Dh)
    a = logits.reshape(B, h * w, -1, K2, K2).transpose(1, 2)  # (B, nH, h*w, K2 out, K2 gathered)
    a = (a * scale).softmax(dim=-1)
    if attn_drop is not None:
        a = attn_drop(a)
    y = (a @ vu).permute(0, 1, 4, 3, 2).reshape(B, C * K2, h * w)  # (B, C*K2, h*w)
    y = F.fold(y, (H, W), kernel, padding=padding, stride=stride)  # (B, C, H, W)
    return y.permute(0, 2, 3, 1)  # (B, H, W, C)


def kernel_can_run(v: torch.Tensor) -> bool:
    """Whether the Triton op can run on ``v``: Triton importable, a CUDA tensor (a CPU tensor under
    Triton's interpreter) of fp32 / bf16 / fp16."""
    on_device = v.is_cuda or (INTERPRET and v.device.type == "cpu")
    return HAS_TRITON and on_device and v.dtype in _KERNEL_DTYPES


def use_kernel(impl: str, v: torch.Tensor, dropout_active: bool) -> bool:
    """Resolve ``impl`` (one of :data:`~vitscale.models.volo.configs.OUTLOOK_IMPLS`: ``auto`` = the kernel
    where :func:`kernel_can_run` and no attention dropout is active) for the values ``v``."""
    if impl == "eager":
        return False
    if impl == "triton":
        if not kernel_can_run(v):
            raise RuntimeError(
                f"outlook_impl='triton' needs Triton and a CUDA tensor of fp32/bf16/fp16 (got a {v.device.type} "
                f"{v.dtype} tensor, Triton {'installed' if HAS_TRITON else 'not installed'}); use 'auto' or 'eager'"
            )
        if dropout_active:
            raise RuntimeError("outlook_impl='triton' has no attention dropout: set attention_dropout=0 or use 'auto'")
        return True
    return kernel_can_run(v) and not dropout_active


def check_geometry(v: torch.Tensor, logits: torch.Tensor, kernel: int, padding: int, stride: int) -> None:
    """The window grid of ``logits`` must be the one unfold gives for ``v``; heads must divide ``C``."""
    B, H, W, C = v.shape
    per_head = kernel**4
    if logits.ndim != 4 or logits.shape[0] != B or logits.shape[-1] % per_head:
        raise ValueError(f"outlook logits {tuple(logits.shape)} do not fit values {tuple(v.shape)} (K={kernel})")
    nh = logits.shape[-1] // per_head
    grid = tuple((n + 2 * padding - kernel) // stride + 1 for n in (H, W))
    if C % nh or tuple(logits.shape[1:3]) != grid:
        raise ValueError(
            f"outlook logits {tuple(logits.shape)} do not fit values {tuple(v.shape)}: expected a window grid "
            f"{grid} and {C} channels divisible by {nh} heads"
        )


@torch.library.custom_op("vitscale::outlook_attention", mutates_args=())
def _outlook_op(v: torch.Tensor, logits: torch.Tensor, kernel: int, padding: int, stride: int,
                scale: float) -> torch.Tensor:  # fmt: skip
    from . import outlook_triton

    return outlook_triton.forward(v.contiguous(), logits.contiguous(), kernel, padding, stride, scale)


@_outlook_op.register_fake
def _outlook_fake(v, logits, kernel, padding, stride, scale):
    return v.new_empty(v.shape)


@torch.library.custom_op("vitscale::outlook_attention_backward", mutates_args=())
def _outlook_backward_op(grad: torch.Tensor, v: torch.Tensor, logits: torch.Tensor, kernel: int, padding: int,
                         stride: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    from . import outlook_triton

    return outlook_triton.backward(grad.contiguous(), v.contiguous(), logits.contiguous(), kernel, padding, stride,
                                   scale)  # fmt: skip


@_outlook_backward_op.register_fake
def _outlook_backward_fake(grad, v, logits, kernel, padding, stride, scale):
    return v.new_empty(v.shape), logits.new_empty(logits.shape)


def _setup_context(ctx, inputs, output) -> None:
    v, logits, kernel, padding, stride, scale = inputs
    ctx.save_for_backward(v, logits)
    ctx.geometry = (kernel, padding, stride, scale)


def _backward(ctx, grad):
    v, logits = ctx.saved_tensors
    dv, dlogits = _outlook_backward_op(grad, v, logits, *ctx.geometry)
    return dv, dlogits, None, None, None, None


_outlook_op.register_autograd(_backward, setup_context=_setup_context)


def outlook_attention(v: torch.Tensor, logits: torch.Tensor, kernel: int, padding: int, stride: int,
                      scale: float) -> torch.Tensor:  # fmt: skip
    """The fused op: same result as :func:`outlook_reference` (without dropout), differentiable in
    ``v`` and ``logits``; needs :func:`kernel_can_run`."""
    check_geometry(v, logits, kernel, padding, stride)
    return _outlook_op(v, logits, int(kernel), int(padding), int(stride), float(scale))


__all__ = ["check_geometry", "kernel_can_run", "outlook_attention", "outlook_reference", "use_kernel"]
