"""The fused outlook attention's Triton kernels, run by Triton's interpreter on CPU tensors, against the
eager unfold / fold reference: forward, and the gradients of values and logits.

Not collected by the default run (the interpreter must be chosen before Triton defines the kernels):
``tests/unit/test_outlook_kernel.py`` runs this file in a subprocess with ``TRITON_INTERPRET=1``.
By hand: ``TRITON_INTERPRET=1 python -m pytest -q tests/unit/interpreted_outlook_kernel.py``.
"""

from __future__ import annotations

import copy
import os

if os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError("run with TRITON_INTERPRET=1 (tests/unit/test_outlook_kernel.py does)")

import pytest
import torch
from helpers import rel_max

from vitscale.models import create_model
from vitscale.models.volo import VARIANTS
from vitscale.models.volo.outlook_kernel import (
    kernel_can_run,
    outlook_attention,
    outlook_reference,
    use_kernel,
)


def _inputs(B, H, W, heads, dh, K, P, S, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, w = ((n + 2 * P - K) // S + 1 for n in (H, W))
    v = torch.randn(B, H, W, heads * dh, generator=g).to(dtype)
    logits = (torch.randn(B, h, w, heads * K**4, generator=g) * 3).to(dtype)  # peaked softmaxes, as trained
    grad = torch.randn(B, H, W, heads * dh, generator=g).to(dtype)
    return v, logits, grad


def _run(fn, v, logits, grad, *geometry):
    """(output, d values, d logits) of ``fn`` for the output gradient ``grad``."""
    v, logits = v.clone().requires_grad_(), logits.clone().requires_grad_()
    out = fn(v, logits, *geometry)
    dv, dlogits = torch.autograd.grad(out, (v, logits), grad)
    return out, dv, dlogits


GEOMETRIES = {
    # B, H, W, heads, Dh, K, padding, stride
    "volo_even": (1, 6, 6, 2, 4, 3, 1, 2),  # the released models' window: K 3, padding 1, stride 2
    "volo_odd": (2, 7, 5, 2, 4, 3, 1, 2),  # odd sides: the last windows hang over the border
    "stride1_dh5": (1, 5, 7, 3, 5, 3, 1, 1),  # one window per pixel; a head width that is no power of two
    "k5_pad2": (1, 5, 4, 1, 8, 5, 2, 2),  # a 5x5 window
    "no_padding": (1, 4, 5, 2, 4, 3, 0, 1),  # fewer windows than pixels: border pixels get fewer windows
    "stride_eq_k": (1, 9, 8, 1, 4, 3, 1, 3),  # windows that do not overlap; the last row / column gets none
}


@pytest.mark.parametrize("geometry", GEOMETRIES.values(), ids=GEOMETRIES.keys())
def test_kernel_matches_eager_fp32(geometry):
    B, H, W, heads, dh, K, P, S = geometry
    v, logits, grad = _inputs(B, H, W, heads, dh, K, P, S)
    got = _run(outlook_attention, v, logits, grad, K, P, S, dh**-0.5)
    ref = _run(outlook_reference, v, logits, grad, K, P, S, dh**-0.5)
    for name, a, b in zip(("out", "d values", "d logits"), got, ref):
        torch.testing.assert_close(a, b, msg=name)


def _released_settings() -> dict[tuple, list[str]]:
    """The distinct outlook settings (head width, K, padding, stride) of volo_d1 ... volo_d5."""
    out: dict[tuple, list[str]] = {}
    for name in (f"volo_d{i}" for i in range(1, 6)):
        c = VARIANTS[name]
        key = (c.outlook_dim // c.outlook_heads, c.outlook_kernel, c.outlook_padding, c.outlook_stride)
        out.setdefault(key, []).append(name)
    return out


RELEASED = _released_settings()


@pytest.mark.parametrize("setting", RELEASED.keys(), ids=["+".join(v) for v in RELEASED.values()])
def test_kernel_matches_eager_at_released_head_settings(setting):
    """The released models' head width and window (one setting for all five: 32-wide heads, K 3, padding 1,
    stride 2), at 2 heads: their 6, 8 or 12 heads are programs of the same code at other channel offsets (one
    program per head: the grid's last axis), which 2 heads already exercise."""
    dh, K, P, S = setting
    v, logits, grad = _inputs(1, 3, 3, 2, dh, K, P, S)
    got = _run(outlook_attention, v, logits, grad, K, P, S, dh**-0.5)
    ref = _run(outlook_reference, v, logits, grad, K, P, S, dh**-0.5)
    for name, a, b in zip(("out", "d values", "d logits"), got, ref):
        torch.testing.assert_close(a, b, msg=name)


def test_heads_split_over_tensor_parallel_ranks_give_the_full_result():
    # TP shards the v / attn projections by whole heads: each rank runs the op on its local channels
    # and logits (local head count = local logits width / K^4)
    heads, dh, K, P, S, tp = 4, 8, 3, 1, 2, 2
    v, logits, grad = _inputs(1, 5, 4, heads, dh, K, P, S)
    full = _run(outlook_attention, v, logits, grad, K, P, S, dh**-0.5)
    C, A = v.shape[-1] // tp, logits.shape[-1] // tp
    parts = [
        _run(outlook_attention, v[..., r * C:(r + 1) * C], logits[..., r * A:(r + 1) * A], grad[..., r * C:(r + 1) * C],
             K, P, S, dh**-0.5)
        for r in range(tp)
    ]  # fmt: skip
    for k, name in enumerate(("out", "d values", "d logits")):
        torch.testing.assert_close(torch.cat([p[k] for p in parts], dim=-1), full[k], msg=name)


def test_bf16_within_bf16_rounding():
    B, H, W, heads, dh, K, P, S = GEOMETRIES["volo_odd"]
    v, logits, grad = _inputs(B, H, W, heads, dh, K, P, S, dtype=torch.bfloat16)
    exact = _run(outlook_reference, v.double(), logits.double(), grad.double(), K, P, S, dh**-0.5)
    kernel = _run(outlook_attention, v, logits, grad, K, P, S, dh**-0.5)
    eager = _run(outlook_reference, v, logits, grad, K, P, S, dh**-0.5)  # eager in bf16
    for k, name in enumerate(("out", "d values", "d logits")):
        assert kernel[k].dtype == torch.bfloat16
        err_kernel, err_eager = rel_max(kernel[k], exact[k].float()), rel_max(eager[k], exact[k].float())
        # fp32 accumulation inside the kernel: no worse than eager's bf16 arithmetic
        assert err_kernel < 1e-2 and err_kernel <= err_eager + 2e-3, (name, err_kernel, err_eager)


def _loss_and_grads(model, x):
    cls, tok = model(x, dense=True)
    loss = cls.pow(2).mean() + tok.pow(2).mean()
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_volo_with_the_kernel_trains_like_eager():
    torch.manual_seed(0)
    eager = create_model("volo_debug", outlook_impl="eager").train()
    fused = create_model("volo_debug", outlook_impl="triton").train()
    fused.load_state_dict(eager.state_dict())
    x = torch.randn(1, 3, 32, 32)
    loss_e, grads_e = _loss_and_grads(eager, x)
    loss_f, grads_f = _loss_and_grads(fused, x)
    torch.testing.assert_close(loss_f, loss_e, rtol=1e-5, atol=1e-6)
    for n, g in grads_e.items():
        torch.testing.assert_close(grads_f[n], g, rtol=1e-4, atol=1e-6, msg=n)


def test_auto_picks_the_kernel_where_it_runs_and_eager_under_attention_dropout():
    x = torch.zeros(1, 2, 2, 4)
    assert kernel_can_run(x) and use_kernel("auto", x, dropout_active=False)
    assert not use_kernel("auto", x, dropout_active=True)
    assert not use_kernel("auto", x.double(), dropout_active=False)  # fp64: the reference
    assert not use_kernel("eager", x, dropout_active=False)
    with pytest.raises(RuntimeError, match="no attention dropout"):
        use_kernel("triton", x, dropout_active=True)


def test_compiled_outlooker_is_one_graph_holding_the_kernel():
    torch.manual_seed(0)
    blk = create_model("volo_debug", outlook_impl="triton").outlookers[0].train()
    compiled_blk = copy.deepcopy(blk)
    graphs = []

    def aot_eager_counting(gm, example):  # Dynamo + AOT autograd as inductor runs them, no codegen
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example)

    torch._dynamo.reset()
    compiled = torch.compile(compiled_blk, backend=aot_eager_counting, fullgraph=True)  # a break raises
    x = torch.randn(1, 5, 5, 32)  # odd sides: the last windows hang over the border
    out_e, out_c = blk(x), compiled(x)
    out_e.square().mean().backward()
    out_c.square().mean().backward()
    assert len(graphs) == 1
    targets = {n.target for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert torch.ops.vitscale.outlook_attention.default in targets
    torch.testing.assert_close(out_c, out_e)
    for (n, p), q in zip(blk.named_parameters(), compiled_blk.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=n)
