"""The blocks' numerics switches (vitscale.distributed.epilogue): ``precision.residual`` (a bf16
residual stream under bf16 autocast) and ``precision.mlp_epilogue`` (GELU and the bias gradients in
cuBLASLt's matmul epilogues, vitscale.models.common.fused_mlp), on the CPU: the default path is the
old arithmetic bit for bit, the bf16 stream is bf16 between blocks and follows the float32 one, the
custom operator equals the unfused math forward and backward and passes ``torch.library.opcheck``, a
block using it compiles as one graph, and every place they cannot apply is a one-line refusal. The
CUDA path (nvmath-python's epilogues) is checked against the same math by tests/gpu."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vitscale.config import ConfigError
from vitscale.distributed.config import PrecisionConfig
from vitscale.distributed.epilogue import apply_block_numerics, epilogue_decision
from vitscale.distributed.parallel_dims import ParallelDims
from vitscale.models import create_model
from vitscale.models.common import Mlp
from vitscale.models.common.fused_mlp import fused_mlp, mlp_gelu_tanh, nvmath_available
from vitscale.models.volo.parallelize import all_blocks
from vitscale.run import build_model

CPU = torch.device("cpu")


def _old_block(b, x):
    """The block's arithmetic before the switches existed, written out."""
    x = x + b.drop_path1(b.ls1(b.attn(b.norm1(x))))
    x = x + b.drop_path2(b.ls2(b.mlp(b.norm2(x))))
    return x


def _tokens(model, batch=2):
    return model._embed(model.example_inputs(batch, "cpu")[0])[0]


def test_default_stream_is_the_old_arithmetic_bit_for_bit():
    """``precision.residual=fp32`` (the default) leaves every block's arithmetic as it was: equal to
    the last bit in float32 and under bf16 autocast (where the stream stays float32)."""
    torch.manual_seed(0)
    model = create_model("vit_debug", layer_scale_init=1e-5).eval()
    assert apply_block_numerics(model.blocks, autocast=None, device=CPU) == {"residual": 0, "mlp_epilogue": 0}
    x = _tokens(model)
    for autocast in (False, True):
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            for b in model.blocks:
                y = b(x)
                assert torch.equal(y, _old_block(b, x)) and y.dtype == torch.float32
                x = y


def test_bf16_stream_between_blocks_follows_the_fp32_one():
    """Under bf16 autocast with ``residual=bf16`` every block hands on bf16 (LayerScale's float32 gamma
    included), the loss follows the float32 stream's within bf16 rounding and the master weights'
    gradients stay float32; set through the parallelize tail from the run config."""
    torch.manual_seed(0)
    ref = create_model("vit_debug", layer_scale_init=1e-2)
    bf = build_model("vit_debug", ParallelDims(device=CPU), precision=PrecisionConfig(autocast="bf16", residual="bf16"),
                     overrides={"layer_scale_init": 1e-2})  # fmt: skip
    bf.load_state_dict(ref.state_dict())
    assert all(b.residual_dtype == torch.bfloat16 for b in bf.blocks) and ref.blocks[0].residual_dtype is None
    seen = {}
    for name, model in (("fp32", ref), ("bf16", bf)):
        model.blocks[0].register_forward_hook(lambda m, i, o, name=name: seen.update({name: o.dtype}) and None)
    images = ref.example_inputs(4, "cpu")[0]
    losses = []
    for model in (ref, bf):
        with torch.autocast("cpu", torch.bfloat16):
            loss = model(images).float().pow(2).mean()
        loss.backward()
        losses.append(loss.detach())
    assert seen == {"fp32": torch.float32, "bf16": torch.bfloat16}
    torch.testing.assert_close(losses[1], losses[0], rtol=2e-2, atol=0)
    for (n, p), q in zip(ref.named_parameters(), bf.parameters()):
        assert q.grad.dtype == torch.float32
        cos = nn.functional.cosine_similarity(p.grad.flatten(), q.grad.flatten(), dim=0)
        assert cos > 0.99, (n, float(cos))


def test_fused_mlp_is_the_unfused_math_forward_and_backward():
    """On the CPU the operator computes with the unfused operations: float64 equal to ``Mlp``'s
    (gelu_tanh) forward and every gradient to rounding; ``opcheck`` passes (schema, fake tensors,
    autograd registration, AOT dispatch); tokens of any leading shape."""
    torch.manual_seed(0)
    mlp = Mlp(16, 32, activation="gelu_tanh").double()
    x = torch.randn(2, 3, 16, dtype=torch.float64, requires_grad=True)
    grads = []
    for fn in (fused_mlp, lambda m, t: m(t)):
        mlp.zero_grad()
        x.grad = None
        y = fn(mlp, x)
        (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)).sum().backward()
        grads.append([y.detach(), x.grad.clone(), *[p.grad.clone() for p in mlp.parameters()]])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    args = (torch.randn(6, 16, requires_grad=True), torch.randn(32, 16, requires_grad=True), torch.randn(32, requires_grad=True),
            torch.randn(8, 32, requires_grad=True), torch.randn(8, requires_grad=True))  # fmt: skip
    torch.library.opcheck(mlp_gelu_tanh, args, test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_block_with_the_epilogue_compiles_as_one_graph():
    """A ViT block with ``mlp_epilogue`` traces whole (``fullgraph=True``, the operator opaque in the
    graph) and computes what eager does, forward and backward (aot_eager: the tracing is the test)."""
    torch.manual_seed(0)
    model = create_model("vit_debug", activation="gelu_tanh")
    block = model.blocks[0]
    block.mlp_epilogue = True
    x = _tokens(model).detach().requires_grad_()
    eager = block(x)
    eager.sum().backward()
    g_eager = x.grad.clone()
    x.grad = None
    torch._dynamo.reset()
    graphs = []

    def counting(gm, example):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example)

    out = torch.compile(block, fullgraph=True, backend=counting)(x)
    out.sum().backward()
    assert len(graphs) == 1 and "vitscale.mlp_gelu_tanh" in graphs[0].code
    torch.testing.assert_close(out, eager, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad, g_eager, rtol=1e-6, atol=1e-6)


def test_where_they_cannot_apply_is_one_line():
    vit = create_model("vit_debug", device="meta")
    for kwargs, msg in (
        (dict(residual="bf16", autocast=None), "precision.residual=bf16 needs bf16 autocast"),
        (dict(residual="bf16", autocast=torch.float16), "this run has autocast to float16"),
        (dict(mlp_epilogue="cublaslt", autocast=torch.bfloat16), "runs cuBLASLt epilogues on CUDA; this run is on cpu"),
        (dict(mlp_epilogue="cublaslt", autocast=None, device="cuda"), "needs bf16 autocast"),
        (dict(mlp_epilogue="cublaslt", autocast=torch.bfloat16, device="cuda", fp8="tensorwise"), "does not combine with precision.fp8"),
        (dict(mlp_epilogue="cublaslt", autocast=torch.bfloat16, device="cuda", tp=2), "parallel.tp=2"),
        (dict(residual="fp16", autocast=torch.bfloat16), "precision.residual must be one of fp32, bf16"),
    ):  # fmt: skip
        kwargs.setdefault("device", CPU)
        with pytest.raises(ConfigError, match=msg) as err:
            apply_block_numerics(vit.blocks, **kwargs)
        assert "\n" not in str(err.value)
    volo = create_model("volo_debug", device="meta")
    with pytest.raises(ConfigError, match=r"this model's blocks \(.*\) have no bf16 residual stream"):
        apply_block_numerics(all_blocks(volo)[0], residual="bf16", autocast=torch.bfloat16, device=CPU)
    if not nvmath_available():
        with pytest.raises(ConfigError, match="needs nvmath-python, which is not installed: pip install nvmath-python"):
            apply_block_numerics(vit.blocks, mlp_epilogue="cublaslt", autocast=torch.bfloat16, device="cuda")
    # which MLPs may take the epilogues: the tanh GELU, or the erf one only under the explicit switch
    erf, tanh = create_model("vit_debug", device="meta"), create_model("vit_debug", activation="gelu_tanh", device="meta")
    assert "exact (erf) form" in epilogue_decision(erf.blocks[0], "cublaslt")
    assert epilogue_decision(erf.blocks[0], "cublaslt_tanh") is None and epilogue_decision(tanh.blocks[0], "cublaslt") is None
    swiglu = create_model("vit_debug", mlp_type="swiglu", device="meta")
    assert "no plain MLP" in epilogue_decision(swiglu.blocks[0], "cublaslt_tanh")
    # CLIP: the vision tower's blocks take the bf16 stream; the text tower's CausalBlock has its own forward
    clip = create_model("clip_debug", device="meta")
    done = apply_block_numerics([*clip.visual.blocks, *clip.text.blocks], residual="bf16", autocast=torch.bfloat16, device=CPU)
    assert done["residual"] == len(clip.visual.blocks) and clip.text.blocks[0].residual_dtype is None


def test_the_run_config_takes_the_switches(tmp_path):
    """``precision.residual`` / ``precision.mlp_epilogue`` load from the run config with their
    defaults (fp32, none) and refuse other values, naming the choices."""
    from vitscale.config import load_config

    cfg = load_config("digits_vit", [f"train.output_dir={tmp_path}"])
    assert (cfg.precision.residual, cfg.precision.mlp_epilogue) == ("fp32", "none")
    cfg = load_config("digits_vit", ["precision.residual=bf16", "precision.mlp_epilogue=cublaslt_tanh"])
    assert (cfg.precision.residual, cfg.precision.mlp_epilogue) == ("bf16", "cublaslt_tanh")
    with pytest.raises(ConfigError, match="fp32") as err:
        load_config("digits_vit", ["precision.residual=fp16"])
    assert "\n" not in str(err.value)
