"""The blocks' numerics switches on a CUDA GPU (issue 50): the GELU MLP through cuBLASLt's epilogues
(``precision.mlp_epilogue``, nvmath-python's ``GELU_AUX_BIAS`` / ``DGELU_BGRAD`` / ``BGRADB``) against
the float64 unfused math, alone and inside a per-block compiled ViT block; the bf16 residual stream
(``precision.residual=bf16``) against the float32 one. Relative L2 errors (``helpers.rel_l2``);
bf16 operands land between 1e-3 and 1e-2.

Marked ``gpu``; the epilogue tests need nvmath-python (carried to the device as wheels:
benchmarks/gpu_check.sh's header) and are skipped — which the check counts as not passed — without it.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import rel_l2

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = torch.device("cuda")


def _nvmath() -> None:
    from vitscale.models.common.fused_mlp import nvmath_available

    if not nvmath_available():
        pytest.skip("nvmath-python is not installed (pip install nvmath-python)")


@pytest.mark.parametrize("tokens", [8 * 197, 37], ids=["b16_batch8", "ragged"])
def test_cublaslt_mlp_matches_the_float64_math(tokens):
    """Forward (output, activation, pre-activation) and all five gradients of ``vitscale::mlp_gelu_tanh``
    on CUDA — the epilogues — against the unfused math in float64, at ViT-B/16's MLP width."""
    _nvmath()
    from vitscale.models.common.fused_mlp import _backward_reference, _forward_reference, mlp_gelu_tanh

    torch.manual_seed(0)
    D, F_ = 768, 3072
    x = torch.randn(tokens, D, device=CUDA, dtype=torch.bfloat16)
    w1, b1 = torch.randn(F_, D, device=CUDA).mul(D**-0.5).bfloat16(), torch.randn(F_, device=CUDA).mul(0.1).bfloat16()
    w2, b2 = torch.randn(D, F_, device=CUDA).mul(F_**-0.5).bfloat16(), torch.randn(D, device=CUDA).mul(0.1).bfloat16()
    y, h, pre = mlp_gelu_tanh(x, w1, b1, w2, b2)
    ref = _forward_reference(*(t.double() for t in (x, w1, b1, w2, b2)))
    for name, got, want in zip(("y", "h", "pre"), (y, h, pre), ref):
        assert got.dtype == torch.bfloat16 and got.is_contiguous() and torch.isfinite(got).all(), name
        assert rel_l2(got, want) < 1e-2, (name, rel_l2(got, want))
    dy = torch.randn(tokens, D, device=CUDA, dtype=torch.bfloat16)
    got = torch.ops.vitscale.mlp_gelu_tanh_backward(dy, x, w1, w2, h, pre)
    want = _backward_reference(dy.double(), x.double(), w1.double(), w2.double(), ref[1], ref[2])
    for name, g, w in zip(("dx", "dw1", "db1", "dw2", "db2"), got, want):
        assert g.shape == w.shape and torch.isfinite(g).all(), name
        assert rel_l2(g, w) < 2e-2, (name, rel_l2(g, w))


def test_vit_block_with_the_epilogues_compiles_whole_and_trains_like_the_unfused_one():
    """A ViT-B/16-wide block (``gelu_tanh``) with ``mlp_epilogue`` under per-block compile
    (``fullgraph=True``, inductor) and bf16 autocast: the same loss and gradients as the unfused block
    to bf16 rounding, through the parallelize tail's refusals (none here)."""
    _nvmath()
    from vitscale.distributed.epilogue import apply_block_numerics
    from vitscale.models import create_model

    torch.manual_seed(0)
    ref = create_model("vit_b16", activation="gelu_tanh", num_layers=2, drop_path_rate=0.0).to(CUDA).train()
    fused = copy.deepcopy(ref)
    assert apply_block_numerics(fused.blocks, mlp_epilogue="cublaslt", autocast=torch.bfloat16, device=CUDA) == {
        "residual": 0, "mlp_epilogue": 2}  # fmt: skip
    for block in fused.blocks:
        block.compile(fullgraph=True)
    images = torch.randn(8, 3, 224, 224, device=CUDA)
    losses, grads = [], []
    for model in (ref, fused):
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(images).float().pow(2).mean()
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert rel_l2(losses[1], losses[0]) < 1e-2
    for n in grads[0]:
        assert grads[1][n].dtype == torch.float32, n
        assert rel_l2(grads[1][n], grads[0][n]) < 5e-2, (n, rel_l2(grads[1][n], grads[0][n]))


def test_bf16_residual_stream_follows_the_float32_one():
    """ViT-B/16 (4 blocks) under bf16 autocast with ``residual=bf16``: the blocks hand on bf16, the
    loss and gradients follow the float32 stream's to bf16 rounding."""
    from vitscale.distributed.epilogue import apply_block_numerics
    from vitscale.models import create_model

    torch.manual_seed(0)
    ref = create_model("vit_b16", num_layers=4, drop_path_rate=0.0).to(CUDA).train()
    bf = copy.deepcopy(ref)
    apply_block_numerics(bf.blocks, residual="bf16", autocast=torch.bfloat16, device=CUDA)
    dtypes = []
    bf.blocks[-1].register_forward_hook(lambda m, i, o: dtypes.append(o.dtype) and None)
    images = torch.randn(8, 3, 224, 224, device=CUDA)
    losses, grads = [], []
    for model in (ref, bf):
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(images).float().pow(2).mean()
        loss.backward()
        losses.append(loss.detach())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert dtypes == [torch.bfloat16]
    assert rel_l2(losses[1], losses[0]) < 1e-2 and rel_l2(grads[1], grads[0]) < 5e-2
