"""fp8 training (``precision.fp8``, vitscale.distributed.float8) on CPU with torchao's emulation.

Which layers convert (every family at debug size; L/16, H/14, g/14 and 22B on the meta device),
what the float8 layers compute (checked against float8 rounding written out here with torch's own
float8 dtypes: equal to the last bit, forward and backward), that a compiled block still traces as
one graph, and the one-line errors. What needs an fp8 GPU (the speed, cuBLAS / CUTLASS kernels)
is measured by ``benchmarks/run_gpu.sh fp8``.
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from torch import nn

from vitscale.config import ConfigError
from vitscale.distributed.float8 import apply_float8, float8_decision, precompute_float8_scales
from vitscale.models import create_model
from vitscale.models.volo.parallelize import all_blocks


def _torchao_reason() -> str | None:
    try:
        from vitscale.distributed.float8 import require_torchao

        require_torchao()
    except ConfigError as err:
        return str(err)
    return None


pytestmark = pytest.mark.skipif(_torchao_reason() is not None, reason=f"{_torchao_reason()}")


def _float8_names(model: nn.Module) -> set[str]:
    from torchao.float8.float8_linear import Float8Linear

    return {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}


def _linear_names(model: nn.Module, under: str = "") -> set[str]:
    return {n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith(under)}


def test_only_block_linears_convert_in_every_family():
    vit = create_model("vit_debug", pool="map", device="meta")
    report = apply_float8(vit, vit.blocks, "tensorwise", device="cpu", fp8_filter="all")
    want = {f"blocks.{i}.{n}" for i in range(2) for n in ("attn.qkv_per_head", "attn.proj", "mlp.fc1", "mlp.fc2")}
    assert _float8_names(vit) == set(report.converted) == want and not report.kept
    assert {"head", "attn_pool.q", "attn_pool.kv_per_head", "attn_pool.mlp.fc1"} <= _linear_names(vit) - want
    assert type(vit.patch_embed.proj) is nn.Conv2d and type(vit.head) is nn.Linear
    assert report.emulate and "emulated on CPU" in report.summary()

    clip = create_model("clip_debug", device="meta")
    report = apply_float8(clip, [*clip.visual.blocks, *clip.text.blocks], "tensorwise", device="cpu", fp8_filter="all")
    towers = _linear_names(clip, "visual.blocks") | _linear_names(clip, "text.blocks")
    assert _float8_names(clip) == set(report.converted) == towers and len(towers) == 16
    assert _linear_names(clip) - towers  # the projections / heads outside the blocks stay as they were

    volo = create_model("volo_debug", device="meta")
    report = apply_float8(volo, all_blocks(volo)[0], "tensorwise", device="cpu", fp8_filter="all")
    # an outlooker's attention weights: 32 -> K^4 * heads = 81 * 2 = 162 outputs, not a multiple of 16
    assert report.kept == {f"outlookers.{i}.attn.attn": "features not multiples of 16" for i in range(2)}
    stacks = ("outlookers", "blocks", "class_blocks")
    in_blocks = set().union(*(_linear_names(volo, s + ".") for s in stacks))
    assert _float8_names(volo) == set(report.converted) == in_blocks - set(report.kept)
    assert not any(n.startswith(("head", "aux_head")) for n in report.converted)


def test_size_filter_on_full_sizes():
    """The ``auto`` filter keeps the shapes torchao's H100 tables show slower in fp8: for L/16
    (1024 wide, MLP 4096) tensorwise converts QKV and fc1 only and rowwise nothing; H/14 (1280)
    converts every block linear under tensorwise; 22B's fused projections all convert."""

    def run(name, recipe, fp8_filter="auto"):
        m = create_model(name, device="meta")
        r = apply_float8(m, m.blocks, recipe, device="cpu", fp8_filter=fp8_filter)
        assert _float8_names(m) == set(r.converted)
        return {n.split(".", 2)[2] for n in r.converted}, r

    kinds, r = run("vit_l16", "tensorwise")
    assert kinds == {"attn.qkv_per_head", "mlp.fc1"} and len(r.converted) == 48 and len(r.kept) == 48
    assert set(r.kept.values()) == {"too small for tensorwise to pay (needs out > 1024 or in > 4096)"}
    assert run("vit_l16", "tensorwise", "all")[1].converted.__len__() == 96
    kinds, r = run("vit_l16", "rowwise")
    assert kinds == set() and len(r.kept) == 96
    assert run("vit_h14", "tensorwise")[0] == {"attn.qkv_per_head", "attn.proj", "mlp.fc1", "mlp.fc2"}
    assert run("vit_g14", "rowwise")[0] == {"attn.qkv_per_head", "mlp.fc1"}  # 1408 -> 4224 and 1408 -> 6144
    assert run("vit_22b", "tensorwise")[0] == {"in_proj_per_head", "out_proj_per_head"}
    assert float8_decision(nn.Linear(1280, 1290, device="meta"), "tensorwise", "all") == "features not multiples of 16"
    none = create_model("vit_debug", device="meta")
    assert apply_float8(none, none.blocks, "none").converted == [] and not _float8_names(none)


def test_torchao_filter_picks_torchaos_own_shapes_on_h14():
    """``fp8_filter=torchao`` asks torchao's ``_auto_filter_for_recipe``: on H/14 (1280 wide, MLP 5120)
    tensorwise keeps all 128 block linears, rowwise only the 32 fc1 (QKV is out 3840 <= 4096 with in
    1280 <= 2048; proj and fc2 have out 1280 <= 2048) — the same layers as ``auto``, whose thresholds
    restate torchao's; rowwise_with_gw_hp, for which torchao has no rule, is refused in one line."""
    for recipe, kinds, n in (("tensorwise", {"attn.qkv_per_head", "attn.proj", "mlp.fc1", "mlp.fc2"}, 128),
                             ("rowwise", {"mlp.fc1"}, 32)):  # fmt: skip
        picked = {}
        for filt in ("torchao", "auto"):
            m = create_model("vit_h14", device="meta")
            r = apply_float8(m, m.blocks, recipe, device="cpu", fp8_filter=filt)
            assert _float8_names(m) == set(r.converted)
            picked[filt] = r
        r = picked["torchao"]
        assert {c.split(".", 2)[2] for c in r.converted} == kinds and len(r.converted) == n, recipe
        assert r.converted == picked["auto"].converted and len(r.kept) == 128 - n
        assert set(r.kept.values()) <= {f"torchao's shape filter for {recipe} keeps it in bf16"}
    m = create_model("vit_debug", device="meta")
    with pytest.raises(ConfigError, match="torchao's shape filter has no rule for rowwise_with_gw_hp"):
        apply_float8(m, m.blocks, "rowwise_with_gw_hp", device="cpu", fp8_filter="torchao")


def _q(t: torch.Tensor, dtype=torch.float8_e4m3fn, dim=None, pow2=False) -> torch.Tensor:
    """Float8 rounding with a dynamic scale (per tensor, or per row along ``dim``), back to fp32."""
    top = torch.finfo(dtype).max
    amax = t.abs().max() if dim is None else t.abs().amax(dim=dim, keepdim=True)
    scale = top / amax.clamp(min=1e-12)
    if pow2:  # the rowwise recipe rounds its scales down to powers of two
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return (t * scale).clamp(-top, top).to(dtype).float() / scale


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_linear_computes_float8_rounded_matmuls(recipe):
    torch.manual_seed(0)
    lin = nn.Linear(64, 96)
    w, b = lin.weight.detach().clone(), lin.bias.detach().clone()
    holder = nn.Sequential(lin)
    report = apply_float8(holder, [holder], recipe, device="cpu", fp8_filter="all")
    assert report.converted == ["0"]
    x = (torch.randn(48, 64) * 3).requires_grad_(True)
    y = holder(x)
    g = torch.randn_like(y)
    y.backward(g)
    if recipe == "tensorwise":  # e4m3 inputs and weights, e5m2 output gradients, one scale per tensor
        want_y = _q(x.detach()) @ _q(w).T + b
        want_gx = _q(g, torch.float8_e5m2) @ _q(w)
        want_gw = _q(g, torch.float8_e5m2).T @ _q(x.detach())
    else:  # e4m3 everywhere, one power-of-two scale per row of each GEMM operand
        want_y = _q(x.detach(), dim=-1, pow2=True) @ _q(w, dim=-1, pow2=True).T + b
        want_gx = _q(g, dim=-1, pow2=True) @ _q(w, dim=0, pow2=True)
        want_gw = _q(g, dim=0, pow2=True).T @ _q(x.detach(), dim=0, pow2=True)
    torch.testing.assert_close(y, want_y, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad, want_gx, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(holder[0].weight.grad, want_gw, rtol=1e-6, atol=1e-6)
    assert (y - (x.detach() @ w.T + b)).abs().max() > 1e-3  # and that differs from the fp32 matmul


def test_fp8_vit_step_follows_fp32_and_compiles_whole():
    """A ViT built on meta, converted, materialised and initialised (the trainer's order) trains
    like its fp32 twin to within float8 rounding; its blocks still trace as one graph each."""
    torch.manual_seed(0)
    ref = create_model("vit_debug").train()
    fp8 = create_model("vit_debug", device="meta")
    apply_float8(fp8, fp8.blocks, "tensorwise", device="cpu", fp8_filter="all")
    fp8.to_empty(device="cpu")
    fp8.load_state_dict(ref.state_dict())  # the same parameter names: checkpoints are interchangeable
    fp8.train()
    inputs = ref.example_inputs(4, "cpu")
    losses = []
    for model in (ref, fp8):
        loss = model(*inputs).float().pow(2).mean()
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=0.05, atol=0)
    assert losses[1] != losses[0]
    for (name, p), q in zip(ref.named_parameters(), fp8.parameters()):
        cos = torch.nn.functional.cosine_similarity(p.grad.flatten(), q.grad.flatten(), dim=0)
        assert cos > 0.99, (name, float(cos))

    compiled = copy.deepcopy(fp8)
    torch._dynamo.reset()
    graphs = []

    def aot_eager_counting(gm, example):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example)

    for block in compiled.blocks:
        block.compile(fullgraph=True, backend=aot_eager_counting)
    out_eager, out_compiled = fp8(*inputs), compiled(*inputs)
    assert 1 <= len(graphs) <= len(compiled.blocks)
    torch.testing.assert_close(out_compiled, out_eager, rtol=1e-5, atol=1e-6)
    precompute_float8_scales(fp8, apply_float8(nn.Sequential(), [], "none"))  # no FSDP: nothing to do


def test_errors_are_one_line(monkeypatch):
    m = create_model("vit_debug", device="meta")
    with pytest.raises(ConfigError, match="precision.fp8 must be one of none, tensorwise, rowwise"):
        apply_float8(m, m.blocks, "e4m3")
    with pytest.raises(ConfigError, match="precision.fp8_filter must be one of auto, all"):
        apply_float8(m, m.blocks, "tensorwise", fp8_filter="some")
    with pytest.raises(ConfigError, match="not on mps"):
        apply_float8(m, m.blocks, "tensorwise", device="mps")
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # as if torchao were not installed
    with pytest.raises(ConfigError) as err:
        apply_float8(m, m.blocks, "tensorwise", device="cpu")
    assert "\n" not in str(err.value) and "pip install 'vitscale[fp8]'" in str(err.value)


def test_the_parallelize_tail_converts_for_training_only(tmp_path):
    """``precision.fp8`` goes through the one parallelize tail (every family, by its plan's blocks);
    the run reports it; evaluation assembles the plain model."""
    from vitscale.config import load_config
    from vitscale.distributed.config import PrecisionConfig
    from vitscale.distributed.parallel_dims import ParallelDims
    from vitscale.run import assemble, build_model

    fp8 = PrecisionConfig(fp8="tensorwise", fp8_filter="all")
    for name, n in (("vit_debug", 8), ("clip_debug", 16), ("volo_debug", 26)):
        model = build_model(name, ParallelDims(device=torch.device("cpu")), precision=fp8)
        assert len(_float8_names(model)) == n, name
    cfg = load_config("digits_vit", ["precision.fp8=tensorwise", "precision.fp8_filter=all", "model.num_layers=2",
                                     f"train.output_dir={tmp_path / 'run'}"])  # a training run claims its folder
    run = assemble(cfg, "train")
    assert set(run.float8.converted) == _float8_names(run.model) and len(run.float8.converted) == 8
    assert run.float8.summary() == "fp8 tensorwise: 8 linear layers in float8, 0 in bf16, emulated on CPU (numerics only, no speed-up)"
    evaluated = assemble(cfg, "eval")
    assert not _float8_names(evaluated.model) and evaluated.float8.converted == []
