"""The GELU MLP ``fc2(gelu_tanh(fc1(x)))`` with GELU and the bias gradients inside the matmuls' epilogues.

Three cuBLASLt epilogues do the element-wise work that otherwise runs as separate memory-bound kernels
(GELU forward, GELU backward, two bias-gradient reductions), as Transformer Engine's ``LayerNormMLP``
uses them (NVIDIA/TransformerEngine, ``transformer_engine/pytorch/module/layernorm_mlp.py``):

- forward, fc1: ``GELU_AUX_BIAS`` — the matmul adds fc1's bias, applies GELU (tanh form) and also writes
  the pre-activation (the "aux" output, kept for the backward);
- backward, fc2's data-gradient matmul ``dy @ W2``: ``DGELU_BGRAD`` — multiplies by GELU's derivative at
  the saved pre-activation and reduces fc1's bias gradient in the same kernel;
- backward, fc2's weight-gradient matmul ``dy^T @ h``: ``BGRADB`` — reduces fc2's bias gradient.

fc2's forward (``addmm`` with its bias) and fc1's two backward matmuls are PyTorch's own. cuBLASLt is
reached through nvmath-python (``nvmath.linalg.advanced.Matmul``, docs.nvidia.com/cuda/nvmath-python,
"Epilogs"; no hand-written CUDA), and the two steps are ``torch.library.custom_op`` operators
(``vitscale::mlp_gelu_tanh`` and its backward) with fake and autograd registrations, so a
``torch.compile``d block keeps one graph with the operator opaque inside it. On any device without
nvmath (the CPU), the operators compute the same function with the unfused PyTorch operations (the
reference math the CUDA path is tested against).

cuBLASLt's GELU is the tanh approximation: applied to a model whose activation is the exact (erf)
GELU it computes another function (``precision.mlp_epilogue=cublaslt_tanh`` says so explicitly;
``vitscale.distributed.epilogue`` decides where it may apply). ``hidden`` must be a multiple of 8
(the pre-activation's leading dimension is padded to 8 elements by cuBLASLt otherwise).
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

_PLANS: dict[tuple, object] = {}  # planned nvmath Matmul objects by (epilog, shapes, strides, dtype, device)


def nvmath_available() -> bool:
    """Whether nvmath-python is importable (the CUDA epilogues need it)."""
    return importlib.util.find_spec("nvmath") is not None


# ------------------------------------------------------------------------------ reference math
def _forward_reference(x, w1, b1, w2, b2):
    pre = F.linear(x, w1, b1)
    h = F.gelu(pre, approximate="tanh")
    return F.linear(h, w2, b2), h, pre


def _backward_reference(dy, x, w1, w2, h, pre):
    dpre = torch.ops.aten.gelu_backward(dy @ w2, pre, approximate="tanh")
    return dpre @ w1, dpre.t() @ x, dpre.sum(0), dy.t() @ h, dy.sum(0)


# ------------------------------------------------------------------------------ cuBLASLt (nvmath)
def _matmul(a, b, epilog_name: str, epilog_inputs: dict | None = None):
    """``a @ b`` with the cuBLASLt epilogue ``epilog_name``: ``(result, {aux name: tensor})``. One
    planned ``Matmul`` per shape / layout / epilogue, its operands rebound at each call (planning —
    cuBLASLt's heuristics and nvmath's checks — costs far more than the product of a small layer)."""
    import nvmath

    epilog = getattr(nvmath.linalg.advanced.MatmulEpilog, epilog_name)
    stream = torch.cuda.current_stream(a.device)
    ins = epilog_inputs or {}
    key = (epilog_name, a.shape, a.stride(), b.shape, b.stride(), a.dtype, a.device,
           tuple((k, v.shape, v.stride()) for k, v in sorted(ins.items())))  # fmt: skip
    mm = _PLANS.get(key)
    if mm is None:
        mm = nvmath.linalg.advanced.Matmul(a, b, stream=stream)
        mm.plan(epilog=epilog, epilog_inputs=ins or None, stream=stream)
        _PLANS[key] = mm
    else:
        mm.reset_operands(a=a, b=b, epilog_inputs=ins or None, stream=stream)
    out = mm.execute(stream=stream)
    return out if isinstance(out, tuple) else (out, {})


def _forward_cublaslt(x, w1, b1, w2, b2):
    # column-major view of the product: D (hidden, T) = W1 @ x^T, fc1's bias along D's rows
    d, aux = _matmul(w1, x.t(), "GELU_AUX_BIAS", {"bias": b1})
    h = d.t().contiguous()  # COL-ordered D: its transpose is the row-major (T, hidden) activation
    pre = aux["gelu_aux"].t().contiguous()  # (T, hidden); a no-op copy when hidden % 8 == 0
    return F.linear(h, w2, b2), h, pre


def _backward_cublaslt(dy, x, w1, w2, h, pre):
    # fc2 dgrad with GELU's derivative and fc1's bias gradient: D (hidden, T) = W2^T @ dy^T
    d, aux = _matmul(w2.t(), dy.t(), "DGELU_BGRAD", {"gelu_aux": pre.t()})
    dpre = d.t().contiguous()
    db1 = aux["dgelu_bgrad"].reshape(-1)
    # fc2 wgrad with its bias gradient: D (hidden, out) = h^T @ dy = dW2^T; the sum of dy over tokens
    dw2t, aux2 = _matmul(h.t(), dy, "BGRADB")
    db2 = aux2["bgradb"].reshape(-1)
    return dpre @ w1, dpre.t() @ x, db1, dw2t.t().contiguous(), db2


# ------------------------------------------------------------------------------ the operators
@torch.library.custom_op("vitscale::mlp_gelu_tanh", mutates_args=())
def mlp_gelu_tanh(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                  b2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Tokens ``x (T, dim)`` -> ``(y (T, out), h (T, hidden), pre (T, hidden))``: the MLP's output, its
    activation and pre-activation (the last two kept for the backward; only ``y`` is differentiable)."""
    if x.is_cuda and nvmath_available():
        return _forward_cublaslt(x, w1, b1, w2, b2)
    return _forward_reference(x, w1, b1, w2, b2)


@mlp_gelu_tanh.register_fake
def _(x, w1, b1, w2, b2):
    T, hidden = x.shape[0], w1.shape[0]
    return x.new_empty(T, w2.shape[0]), x.new_empty(T, hidden), x.new_empty(T, hidden)


@torch.library.custom_op("vitscale::mlp_gelu_tanh_backward", mutates_args=())
def mlp_gelu_tanh_backward(dy: torch.Tensor, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, h: torch.Tensor,
                           pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The gradients ``(dx, dw1, db1, dw2, db2)`` of :func:`mlp_gelu_tanh` from ``dy``."""
    if dy.is_cuda and nvmath_available():
        return _backward_cublaslt(dy, x, w1, w2, h, pre)
    return _backward_reference(dy, x, w1, w2, h, pre)


@mlp_gelu_tanh_backward.register_fake
def _(dy, x, w1, w2, h, pre):
    return (torch.empty_like(x), torch.empty_like(w1), w1.new_empty(w1.shape[0]), torch.empty_like(w2),
            w2.new_empty(w2.shape[0]))  # fmt: skip


def _setup_context(ctx, inputs, output):
    x, w1, _, w2, _ = inputs
    _, h, pre = output
    ctx.save_for_backward(x, w1, w2, h, pre)


def _backward(ctx, dy, dh, dpre):
    # h and pre are saved activations, never used downstream: their gradients are None
    x, w1, w2, h, pre = ctx.saved_tensors
    return mlp_gelu_tanh_backward(dy.contiguous(), x, w1, w2, h, pre)


mlp_gelu_tanh.register_autograd(_backward, setup_context=_setup_context)


def fused_mlp(mlp, x: torch.Tensor) -> torch.Tensor:
    """``mlp(x)`` for a :class:`vitscale.models.common.Mlp` (biases, no dropout) through
    :func:`mlp_gelu_tanh`: tokens of any leading shape, the operands cast to the autocast dtype when
    autocast is on (the operator is below autocast; the casts' backward returns the master weights'
    gradients in their own dtype)."""
    w1, b1, w2, b2 = mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, mlp.fc2.bias
    if torch.is_autocast_enabled(x.device.type):
        dt = torch.get_autocast_dtype(x.device.type)
        x, w1, b1, w2, b2 = (t.to(dt) for t in (x, w1, b1, w2, b2))
    lead = x.shape[:-1]
    y, _, _ = mlp_gelu_tanh(x.reshape(-1, x.shape[-1]), w1, b1, w2, b2)
    return y.reshape(*lead, y.shape[-1])


__all__ = ["fused_mlp", "mlp_gelu_tanh", "mlp_gelu_tanh_backward", "nvmath_available"]
