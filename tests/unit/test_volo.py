"""VOLO: outlook attention semantics, the uniform model API, sizes vs timm, timm parity both ways."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import rel_max

from vitscale.models import create_model
from vitscale.models.volo import VARIANTS, OutlookAttention, TokenMix


def _randomize(model: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
        for n, b in model.named_buffers():
            if n.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
            elif n.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)


def _naive_outlook(m: OutlookAttention, x: torch.Tensor) -> torch.Tensor:
    """Outlook attention by explicit loops over window centres (the paper's Eq. 1-3)."""
    B, H, W, C = x.shape
    K, P, s, Dh = m.kernel, m.padding, m.stride, m.head_dim
    nH = C // Dh
    v = m.v(x)  # (B, H, W, C)
    out = torch.zeros_like(v)
    xp = x.permute(0, 3, 1, 2)
    centres = F.avg_pool2d(xp, s, s, ceil_mode=True) if s > 1 else xp  # (B, C, h, w)
    for i in range(centres.shape[2]):
        for j in range(centres.shape[3]):
            a = m.attn(centres[:, :, i, j]).view(B, nH, K * K, K * K) * m.scale
            a = a.softmax(-1)  # row = output position in the window, column = gathered position
            pos = [(i * s - P + di, j * s - P + dj) for di in range(K) for dj in range(K)]
            vals = torch.stack(
                [v[:, r, c] if 0 <= r < H and 0 <= c < W else v.new_zeros(B, C) for r, c in pos], 1
            ).view(B, K * K, nH, Dh)  # (B, K2, nH, Dh)
            y = torch.einsum("bhom,bmhd->bohd", a, vals).reshape(B, K * K, C)
            for o, (r, c) in enumerate(pos):
                if 0 <= r < H and 0 <= c < W:
                    out[:, r, c] += y[:, o]
    return m.proj(out)


@pytest.mark.parametrize("stride", [1, 2])
def test_outlook_attention_matches_explicit_windows(stride):
    torch.manual_seed(0)
    m = OutlookAttention(16, 2, kernel=3, padding=1, stride=stride, qkv_bias=True)
    x = torch.randn(2, 6, 6, 16)
    torch.testing.assert_close(m(x), _naive_outlook(m, x), rtol=1e-5, atol=1e-5)


def test_forward_backward_reaches_every_parameter():
    torch.manual_seed(0)
    model = create_model("volo_debug", drop_path_rate=0.1)
    x = torch.randn(3, 3, 32, 32)
    logits = model(x)
    assert logits.shape == (3, 10) and torch.isfinite(logits).all()
    cls, tok = model(x, dense=True)
    assert cls.shape == (3, 10) and tok.shape == (3, 4, 4, 10)
    (cls.sum() + tok.sum()).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing


def test_eval_logits_are_class_plus_weighted_aux_max():
    torch.manual_seed(0)
    model = create_model("volo_debug").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        cls, tok = model(x, dense=True)
        out = model(x)
    torch.testing.assert_close(out, cls + 0.5 * tok.flatten(1, 2).amax(1))


def test_grad_checkpointing_same_output_and_grads():
    torch.manual_seed(0)
    model = create_model("volo_debug")
    x = torch.randn(2, 3, 32, 32)
    model(x).sum().backward()
    ref_out = model(x).detach()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    out = model(x)
    out.sum().backward()
    torch.testing.assert_close(out.detach(), ref_out)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], rtol=1e-5, atol=1e-6)


def test_meta_build_to_empty_init_weights():
    model = create_model("volo_debug", device="meta")
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    model.init_weights()
    bn = model.patch_embed.conv[1]
    assert torch.equal(bn.running_var, torch.ones_like(bn.running_var))
    assert torch.isfinite(model(torch.randn(2, 3, 32, 32))).all()


def test_token_mix_swaps_box_tokens_only():
    torch.manual_seed(0)
    model = create_model("volo_debug", num_class_layers=0, aux_head=True).eval()
    x = torch.randn(2, 3, 32, 32)
    perm = torch.tensor([1, 0])
    with torch.no_grad():
        mixed = model.forward_stages(x, TokenMix((0, 0, 4, 4), perm))  # whole grid: sample swap
        plain = model.forward_stages(x)
        empty = model.forward_stages(x, TokenMix((1, 1, 1, 3), perm))  # empty box: no-op
    torch.testing.assert_close(mixed, plain[perm])
    torch.testing.assert_close(empty, plain)


def test_reset_classifier_and_no_weight_decay():
    model = create_model("volo_debug")
    model.reset_classifier(5)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 5)
    assert model.aux_head.out_features == 5
    assert model.no_weight_decay() == {"pos_embed", "cls_token"}
    model.reset_classifier(0)
    assert model.aux_head is None and model(torch.randn(1, 3, 32, 32)).shape == (1, 64)


def test_low_res_checkpoint_loads_into_high_res_model():
    torch.manual_seed(0)
    low = create_model("volo_debug").eval()  # 32 px: 4x4 token grid
    high = create_model("volo_debug", img_h=64, img_w=64).eval()  # 8x8 token grid
    high.load_state_dict(low.state_dict())
    assert high.pos_embed.shape == (1, 8, 8, 64)
    x = torch.randn(1, 3, 64, 64)
    assert torch.isfinite(high(x)).all()
    # set_image_size on the low-res model gives the same weights and outputs
    low.set_image_size(64)
    torch.testing.assert_close(low.pos_embed, high.pos_embed)
    torch.testing.assert_close(low(x), high(x))


@pytest.mark.parametrize("name", [f"volo_d{i}" for i in range(1, 6)])
def test_parameter_counts_match_timm(name):
    timm = pytest.importorskip("timm")
    ours = sum(p.numel() for p in create_model(name, device="meta").parameters())
    with torch.device("meta"):
        ref = sum(p.numel() for p in timm.create_model(f"{name}_224", pretrained=False).parameters())
    assert abs(ours / ref - 1) < 0.005, (ours, ref)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(qkv_bias=True),
        dict(pool="avg"),
        dict(layers=(1, 1, 2), outlook_mlp_ratio=4.0, mlp_ratio=4.0, stem_hidden=8),
        dict(num_classes=0),
    ],
)
def test_timm_parity_both_ways(overrides):
    pytest.importorskip("timm")
    from timm.models.volo import VOLO as TimmVOLO

    from vitscale.interop import create_timm_model, from_timm, to_timm
    from vitscale.models.volo.state_dict_adapter import timm_kwargs

    torch.manual_seed(0)
    cfg = create_model("volo_debug", device="meta", **overrides).cfg
    tm = TimmVOLO(**timm_kwargs(cfg))
    _randomize(tm, 1)
    tm.eval()
    ours = from_timm(tm).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert rel_max(ours(x), tm(x)) < 1e-5
        if cfg.num_classes:  # the aux head's per-token outputs too
            feats = tm.forward_features(x)
            cls, tok = ours(x, dense=True)
            assert rel_max(tok.flatten(1, 2), tm.aux_head(feats[:, 1:])) < 1e-5
            assert rel_max(cls, tm.head(feats[:, 0] if cfg.pool == "token" else feats.mean(1))) < 1e-5
    # vitscale -> timm
    ours2 = create_model("volo_debug", **overrides)
    _randomize(ours2, 2)
    ours2.eval()
    tm2 = create_timm_model(ours2).eval()
    with torch.no_grad():
        assert rel_max(tm2(x), ours2(x)) < 1e-5
    assert set(to_timm(ours2)) == set(tm2.state_dict())


def test_variant_table_is_registered():
    from vitscale.models import get_family, list_models

    assert set(list_models(family="volo")) == set(VARIANTS)
    assert get_family("volo_d3").name == "volo"


def test_stem_runs_channels_last_and_the_parallelize_tail_compiles_it():
    """The convolutional stem computes in channels_last (its output, wanted (B, H, W, D), a contiguous
    view) the NCHW arithmetic within 1e-5, forward and backward (timm parity: test_timm_parity_both_ways);
    under ``train.compile`` the parallelize tail compiles it beside the blocks (``PLAN.compile_units``)."""
    import copy

    from vitscale.distributed.parallel_dims import ParallelDims
    from vitscale.models.volo.parallelize import PLAN
    from vitscale.run import build_model

    torch.manual_seed(0)
    model = create_model("volo_debug").train()
    stem = model.patch_embed
    nchw = copy.deepcopy(stem)
    x = torch.randn(2, 3, 32, 32)
    out = stem(x)
    side = 32 // model.cfg.patch_dim
    assert out.is_contiguous() and out.shape == (2, side, side, model.cfg.outlook_dim)
    ref = nchw.proj(nchw.conv(x.contiguous())).permute(0, 2, 3, 1)  # the plain NCHW path
    assert rel_max(out, ref) < 1e-5
    w = torch.randn_like(out)
    g = torch.autograd.grad((out * w).sum(), list(stem.parameters()))
    g_ref = torch.autograd.grad((ref * w).sum(), list(nchw.parameters()))
    assert max(rel_max(a, b) for a, b in zip(g, g_ref)) < 1e-5
    assert PLAN.compile_units(model) == [model.patch_embed]
    built = build_model("volo_debug", ParallelDims(device=torch.device("cpu")), compile=True, init=None)
    assert built.patch_embed._compiled_call_impl is not None  # nn.Module.compile, in place
    assert all(b._compiled_call_impl is not None for b in built.outlookers)
    assert create_model("volo_debug", device="meta").patch_embed._compiled_call_impl is None
    before = build_model("volo_debug", ParallelDims(device=torch.device("cpu")), compile=True, init=None,
                         overrides={"stem_fast": False})  # fmt: skip
    assert before.patch_embed._compiled_call_impl is None and not before.patch_embed.channels_last
    with torch.no_grad():
        before.load_state_dict(model.state_dict())
        assert not before.patch_embed.train()(x).is_contiguous()  # NCHW: the output a permuted view


def test_compiled_stem_traces_whole_and_matches_eager():
    """The stem under torch.compile (``fullgraph=True``: one graph, the BatchNorms' running-statistics
    updates inside it) computes the eager stem's output, BatchNorm statistics and gradients within
    1e-5 in training mode. aot_eager runs Dynamo's capture and AOT autograd without generating kernels
    (inductor's own kernels for it run in gpu_check.sh's volo_d1/compile curve, against eager)."""
    import copy

    from vitscale.distributed.compile import apply_compile

    torch.manual_seed(0)
    eager = create_model("volo_debug").train().patch_embed
    compiled = copy.deepcopy(eager)
    torch._dynamo.reset()
    graphs = []

    def counting(gm, example):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example)

    apply_compile([compiled], fullgraph=True, backend=counting)
    x = torch.randn(2, 3, 32, 32)
    outs = [m(x) for m in (eager, compiled)]
    assert len(graphs) == 1 and rel_max(outs[1], outs[0]) < 1e-5
    w = torch.randn_like(outs[0])
    grads = [torch.autograd.grad((o * w).sum(), list(m.parameters())) for o, m in zip(outs, (eager, compiled))]
    assert max(rel_max(a, b) for a, b in zip(*grads)) < 1e-5
    bn = [m.conv[1].running_mean for m in (eager, compiled)]
    assert rel_max(bn[1], bn[0]) < 1e-5 and bn[0].abs().sum() > 0
