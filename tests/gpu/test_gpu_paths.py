"""The paths of vitscale that only a CUDA GPU runs, each against its eager or fp32 reference, forward
and backward: the Triton outlook kernels (alone and inside a per-block compiled VOLO), FlexAttention
with NaFlex key-padding masks (alone and inside a NaFlex ViT), flash SDPA under per-block compile,
CUDA graphs of the compiled blocks (``train.compile_mode=reduce-overhead``), torchao float8, the pinned
staging buffers of ``checkpoint.async_mode=async_pinned`` and the bench's peak-memory report.

Marked ``gpu`` and skipped without CUDA (CI has none): ``benchmarks/gpu_check.sh`` runs them on a
lent GPU. Errors are relative L2 norms, ``‖out − ref‖ / ‖ref‖`` (``helpers.rel_l2``); each tolerance is
written beside its comparison, from the arithmetic it checks: float32 far under 1e-3 (TF32 off),
bf16 operands between 1e-3 and 1e-2, float8 (e4m3 forward, e5m2 gradients) a few 1e-2.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import rel_l2

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = torch.device("cuda")


def grad_errors(test: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> tuple[float, str, float]:
    """(relative L2 error of all gradients as one vector, the worst tensor's name and error), over the
    tensors whose reference gradient is not zero (those must be zero in ``test`` as well)."""
    assert test.keys() == ref.keys()
    zero = [n for n in ref if not ref[n].any()]
    assert all(not test[n].any() for n in zero), [n for n in zero if test[n].any()]
    names = [n for n in ref if n not in zero]
    whole = rel_l2(torch.cat([test[n].flatten().double() for n in names]), torch.cat([ref[n].flatten().double() for n in names]))
    worst = max(names, key=lambda n: rel_l2(test[n], ref[n]))
    return whole, worst, rel_l2(test[worst], ref[worst])


@pytest.fixture(autouse=True)
def _exact_fp32():
    """float32 references in float32, not TF32 (restored after the test)."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _grads(fn, *inputs, grad=None):
    """(output, input gradients) of ``fn`` for the output gradient ``grad`` (random when None)."""
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*inputs)
    if grad is None:
        grad = torch.randn_like(out)
    return out, torch.autograd.grad(out, inputs, grad), grad


# ------------------------------------------------------------------------------ outlook kernels
OUTLOOK = {
    # B, H, W, heads, Dh, K, padding, stride
    "volo_d1_stage1": (4, 28, 28, 6, 32, 3, 1, 2),  # VOLO-D1's outlookers at 224 px
    "volo_d5_stage1": (2, 28, 28, 12, 32, 3, 1, 2),  # D5's heads
    "odd_sides": (3, 15, 11, 2, 16, 3, 1, 2),  # the last windows hang over the border
    "stride1_k5": (2, 9, 10, 3, 8, 5, 2, 1),  # one window per pixel, a 5x5 window
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("geometry", OUTLOOK.values(), ids=OUTLOOK.keys())
def test_outlook_kernels_match_the_float64_reference(geometry, dtype):
    from vitscale.models.volo.outlook_kernel import kernel_can_run, outlook_attention, outlook_reference

    B, H, W, heads, dh, K, P, S = geometry
    h, w = ((n + 2 * P - K) // S + 1 for n in (H, W))
    v = torch.randn(B, H, W, heads * dh, device=CUDA).to(dtype)
    logits = (torch.randn(B, h, w, heads * K**4, device=CUDA) * 3).to(dtype)  # peaked softmaxes, as trained
    grad = torch.randn(B, H, W, heads * dh, device=CUDA).to(dtype)
    assert kernel_can_run(v)
    scale = dh**-0.5
    out, (dv, dl), _ = _grads(lambda a, b: outlook_attention(a, b, K, P, S, scale), v, logits, grad=grad)
    ref, (rdv, rdl), _ = _grads(lambda a, b: outlook_reference(a, b, K, P, S, scale), v.double(), logits.double(),
                                grad=grad.double())  # fmt: skip
    assert out.dtype == dtype and dv.dtype == dtype and dl.dtype == dtype
    tol = 2e-5 if dtype == torch.float32 else 1e-2  # fp32 arithmetic; bf16 inputs and outputs (8-bit mantissa)
    for name, a, b in (("out", out, ref), ("d values", dv, rdv), ("d logits", dl, rdl)):
        assert rel_l2(a, b) < tol, f"{name}: {rel_l2(a, b):.2e} (tolerance {tol:g})"


def test_volo_compiled_with_the_kernels_matches_eager_unfold():
    """VOLO-D1 (two outlookers, two transformer blocks) with the Triton op inside per-block compile
    against the same weights through the eager unfold / fold path, fp32: logits and every gradient."""
    from vitscale.models import create_model
    from vitscale.train.fastpath import compile_blocks

    torch.manual_seed(0)
    ref = create_model("volo_d1", device=CUDA, outlook_impl="eager", num_classes=100, layers=(2, 1, 1, 1))
    fast = create_model("volo_d1", device=CUDA, outlook_impl="triton", num_classes=100, layers=(2, 1, 1, 1))
    fast.load_state_dict(ref.state_dict())  # the same weights, the kernel path
    assert compile_blocks(fast) > 0
    x = torch.randn(4, 3, 224, 224, device=CUDA)
    losses = []
    for model in (ref, fast):
        model.zero_grad(set_to_none=True)
        out = model(x)
        out = out[0] if isinstance(out, tuple) else out
        loss = out.float().logsumexp(-1).mean()
        loss.backward()
        losses.append((out.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (o_ref, g_ref), (o_fast, g_fast) = losses
    assert rel_l2(o_fast, o_ref) < 1e-4  # fp32 throughout; compile reorders sums
    whole, worst, err = grad_errors(g_fast, g_ref)
    assert whole < 1e-4 and err < 1e-2, (whole, worst, err)  # one tensor's small gradient may drift more


# ------------------------------------------------------------------------------ FlexAttention + NaFlex masks
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_flex_attention_with_a_naflex_mask_matches_masked_sdpa(dtype):
    """Key-padding masks of a NaFlex batch (1 class token + 576 patches, 0-50% padding per image): the
    FlexAttention ``BlockMask`` against a float64 SDPA with the boolean mask, on the real tokens."""
    from vitscale.models.common.attention import sdpa
    from vitscale.models.common.attention_mask import key_padding_mask

    B, heads, N, D = 6, 12, 576, 64
    lengths = torch.tensor([576, 500, 433, 300, 290, 130], device=CUDA)
    valid = torch.arange(N, device=CUDA)[None] < lengths[:, None]  # (B, N)
    q, k, v = (torch.randn(B, heads, N + 1, D, device=CUDA).to(dtype) for _ in range(3))
    real = torch.cat([valid.new_ones(B, 1), valid], 1)[:, None, :, None]  # (B, 1, T, 1) rows compared
    grad = torch.randn(B, heads, N + 1, D, device=CUDA).to(dtype) * real  # padding rows' outputs unread
    mask = key_padding_mask(valid, 1, "flex")
    assert not isinstance(mask, torch.Tensor)  # a BlockMask: the flex path
    out, grads, _ = _grads(lambda a, b, c: sdpa(a, b, c, attn_mask=mask), q, k, v, grad=grad)
    bool_mask = key_padding_mask(valid.cpu(), 1, "sdpa").to(CUDA)
    ref, rgrads, _ = _grads(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=bool_mask),
                            q.double(), k.double(), v.double(), grad=grad.double())  # fmt: skip
    tol = 2e-3 if dtype == torch.float32 else 2e-2  # Triton's fp32 dots may run as TF32; bf16 operands
    assert rel_l2(out * real, ref * real) < tol
    for name, a, b in zip("qkv", grads, rgrads):
        assert rel_l2(a, b) < tol, f"d{name}: {rel_l2(a, b):.2e}"


def test_naflex_vit_flex_matches_sdpa_in_training():
    """A NaFlex ViT-B/16 (4 blocks) on a padded batch of mixed-size images: ``attn_impl=flex`` against
    ``attn_impl=sdpa`` (the memory-efficient kernel with a boolean mask), same weights, bf16 autocast:
    logits and gradients."""
    from vitscale.models import create_model
    from vitscale.models.naflex.patches import to_patch_batch

    torch.manual_seed(0)
    ref = create_model("naflex_b16_gap", device=CUDA, num_layers=4, num_classes=100, attn_impl="sdpa")
    flex = create_model("naflex_b16_gap", device=CUDA, num_layers=4, num_classes=100, attn_impl="flex")
    flex.load_state_dict(ref.state_dict())
    sizes = [(224, 224), (160, 320), (320, 96), (128, 128)]
    batch = to_patch_batch([torch.randn(3, h, w, device=CUDA) for h, w in sizes], 16, seq_len=256)
    assert not batch["patch_valid"].all()  # padding present: the mask is in play
    results = []
    for model in (ref, flex):
        with torch.autocast("cuda", torch.bfloat16):
            out = model(batch)
        out.float().logsumexp(-1).mean().backward()
        results.append((out.float(), {n: p.grad.float() for n, p in model.named_parameters()}))
    (o_ref, g_ref), (o_flex, g_flex) = results
    assert rel_l2(o_flex, o_ref) < 2e-2  # bf16 activations, two attention kernels
    whole, worst, err = grad_errors(g_flex, g_ref)
    assert whole < 3e-2 and err < 1e-1, (whole, worst, err)  # bf16 backward through 4 blocks


# ------------------------------------------------------------------------------ flash SDPA, per-block compile
def test_flash_sdpa_under_per_block_compile():
    """ViT-B/16's blocks compiled one by one, with SDPA allowed the flash kernel only (no fallback:
    an input that left the flash path would raise), bf16 autocast, against the float32 math path."""
    from vitscale.models import create_model
    from vitscale.train.fastpath import autocast, compile_blocks, sdpa_backend

    torch.manual_seed(0)
    ref = create_model("vit_b16", device=CUDA, num_layers=4, num_classes=100)
    fast = copy.deepcopy(ref)
    compile_blocks(fast)
    x = torch.randn(8, 3, 224, 224, device=CUDA)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        with sdpa_backend("flash"), autocast(CUDA, torch.bfloat16):
            fast(x).float().sum().backward()  # compiles the blocks; forward and backward kernels recorded
    kernels = " ".join(e.name.lower() for e in prof.events())
    assert "flash" in kernels, "no flash-attention kernel ran under per-block compile"
    fast.zero_grad(set_to_none=True)
    with sdpa_backend("math"):
        o_ref = ref(x)
        o_ref.float().logsumexp(-1).mean().backward()
    with sdpa_backend("flash"), autocast(CUDA, torch.bfloat16):
        o_fast = fast(x)
    o_fast.float().logsumexp(-1).mean().backward()
    assert rel_l2(o_fast, o_ref) < 2e-2  # bf16 operands against fp32
    g_ref = {n: p.grad for n, p in ref.named_parameters()}
    whole, worst, err = grad_errors({n: p.grad for n, p in fast.named_parameters()}, g_ref)
    assert whole < 3e-2 and err < 1e-1, (whole, worst, err)  # bf16 backward through 4 blocks


# ------------------------------------------------------------------------------ CUDA graphs
def test_cuda_graph_blocks_train_as_eager():
    """``train.compile_mode=reduce-overhead``: each block recorded as a CUDA graph and replayed; six
    AdamW steps of a small ViT, fp32, against eager — the losses step by step, and no block skipped
    the graph (inductor counts a skip with its reason)."""
    from torch._dynamo.utils import counters

    from vitscale.distributed.compile import mark_step
    from vitscale.models import create_model
    from vitscale.train.fastpath import compile_blocks

    torch.manual_seed(0)
    ref = create_model("vit_debug", device=CUDA, hidden_size=256, num_attention_heads=4, ffn_hidden_size=1024,
                       num_layers=4, img_h=64, img_w=64, patch_dim=8, num_classes=10)  # fmt: skip
    graphs = copy.deepcopy(ref)
    compile_blocks(graphs, mode="reduce-overhead")
    counters.clear()
    x = torch.randn(16, 3, 64, 64, device=CUDA)
    y = torch.randint(0, 10, (16,), device=CUDA)
    curves = []
    for model, cudagraphs in ((ref, False), (graphs, True)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(6):
            if cudagraphs:
                mark_step()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        curves.append(torch.tensor(losses))
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    assert rel_l2(curves[1], curves[0]) < 1e-4, (curves[0], curves[1])  # fp32; the graph replays the same kernels


# ------------------------------------------------------------------------------ float8
def test_float8_blocks_match_bf16():
    """torchao float8 (tensorwise) on ViT-B/16's block linears, per-block compiled, real float8 matmuls
    (not emulated) against the same model in bf16: output and gradients."""
    pytest.importorskip("torchao")
    from vitscale.distributed.float8 import apply_float8
    from vitscale.models import create_model
    from vitscale.train.fastpath import autocast, compile_blocks, transformer_blocks

    torch.manual_seed(0)
    ref = create_model("vit_b16", device=CUDA, num_layers=4, num_classes=100)
    fp8 = copy.deepcopy(ref)
    report = apply_float8(fp8, transformer_blocks(fp8), "tensorwise", device=CUDA, fp8_filter="all")
    assert report.converted and not report.emulate, report.summary()
    compile_blocks(fp8)
    compile_blocks(ref)
    x = torch.randn(32, 3, 224, 224, device=CUDA)
    outs = []
    for model in (ref, fp8):
        with autocast(CUDA, torch.bfloat16):
            out = model(x)
        out.float().logsumexp(-1).mean().backward()
        outs.append((out.float(), {n: p.grad.float() for n, p in model.named_parameters()}))
    (o_ref, g_ref), (o_fp8, g_fp8) = outs
    assert rel_l2(o_fp8, o_ref) < 0.2  # e4m3 operands (3 mantissa bits) in 16 linears: 9% seen emulated on a CPU
    whole, worst, err = grad_errors(g_fp8, g_ref)
    assert whole < 0.2 and err < 0.4, (whole, worst, err)  # e5m2 gradients (2 mantissa bits): 7% / 13% seen emulated


# ------------------------------------------------------------------------------ async_pinned checkpoints
def test_async_pinned_staging_reuses_pinned_buffers():
    """``checkpoint.async_mode=async_pinned`` stages the state into pinned CPU buffers, allocated once
    and reused by every save (no pinned memory growing with the saves), each copy exact."""
    from vitscale.checkpoint.async_save import StagingBuffers

    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 10)).to(CUDA)
    buffers = StagingBuffers(keep=True)
    first = buffers.stage({k: v for k, v in model.state_dict().items()})
    ptrs = {k: t.data_ptr() for k, t in first.items()}
    assert all(t.is_pinned() and t.device.type == "cpu" for t in first.values())
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        staged = buffers.stage({k: v for k, v in model.state_dict().items()})
        assert {k: t.data_ptr() for k, t in staged.items()} == ptrs  # the same buffers
        for k, t in model.state_dict().items():
            assert torch.equal(staged[k], t.cpu()), k  # bit-exact copies


# ------------------------------------------------------------------------------ peak memory
def test_bench_peak_memory_is_the_models_own():
    """``vitscale bench``'s peak memory on CUDA: at least the weights, gradients and AdamW moments the
    step holds, and below the card's memory."""
    from vitscale.bench.harness import BenchSettings, run_bench

    result = run_bench(BenchSettings(model="vit_s16", device="cuda", batch_size=32, steps=4, warmup=1, rounds=2,
                                     compile=False), log=lambda _: None)  # fmt: skip
    peak = result["vitscale"]["peak_mem_gb"] * 1e9
    from vitscale.models import create_model

    params = sum(p.numel() for p in create_model("vit_s16", device="meta").parameters())
    state = params * 4 * 4  # fp32 weights, gradients and two AdamW moments
    assert state < peak < torch.cuda.get_device_properties(0).total_memory, (peak, state)
