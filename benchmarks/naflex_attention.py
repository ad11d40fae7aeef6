"""Masked attention of a NaFlex batch: SDPA with a boolean key mask vs FlexAttention with a block mask.

One attention call, forward + backward, on a padded batch as the NaFlex ViT runs it (``attn_impl``
sdpa / flex; ``vitscale/models/common/attention_mask.py``): ``B`` sequences of ``seq`` tokens whose
valid lengths are drawn in ``[min_valid * seq, seq]``, heads and head width of a model variant. Also
timed: SDPA without a mask (the cost if padding were not masked, for scale), FlexAttention's eager
(unfused) form, and building the block mask once per batch (ours from per-block key counts, and
PyTorch's ``create_block_mask``, which evaluates the mask on every query-key pair). The script checks that every variant
gives the SDPA outputs on the valid tokens, then times them in alternating rounds and writes JSON.

``--mode train`` times forward + backward, ``--mode infer`` the forward under ``no_grad``. PyTorch's
FlexAttention has no backward on CPU (torch 2.14: "FlexAttention does not support backward on CPU"),
so on CPU ``train`` times the two SDPA forms only.

    python benchmarks/naflex_attention.py --model naflex_b16_gap --device cpu --mode infer \
        --batch-size 8 --seq 256 --json benchmarks/results/naflex_attention_cpu_infer_202611.json

On a GPU (``benchmarks/run_gpu.sh naflex``): ``--device cuda --dtype bfloat16 --mode train``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

from vitscale.bench.report import git_commit, write_json
from vitscale.bench.timing import time_alternating
from vitscale.models.common.attention_mask import key_padding_mask
from vitscale.models.registry import get_model_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="naflex_b16_gap", help="variant whose heads / head width are used")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mode", default="infer", choices=("infer", "train"))
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256, help="padded sequence length (tokens)")
    ap.add_argument("--min-valid", type=float, default=0.5, help="shortest valid length, as a fraction of --seq")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--no-eager-flex", action="store_true", help="leave out the unfused eager FlexAttention")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--dry-run", action="store_true", help="check the arguments and the model, run nothing")
    args = ap.parse_args()
    if args.dry_run:
        get_model_config(args.model)
        print(f"dry run: {vars(args)}")
        return

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    device = torch.device(args.device)
    cfg = get_model_config(args.model)
    H, Dh = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    B, T = args.batch_size, args.seq
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(int(args.min_valid * T), T + 1, (B,), generator=g)
    valid = (torch.arange(T)[None] < lengths[:, None]).to(device)  # (B, T)
    train = args.mode == "train"
    dtype = getattr(torch, args.dtype)
    q, k, v = (torch.randn(B, H, T, Dh, generator=g).to(device, dtype).requires_grad_(train) for _ in range(3))
    bool_mask = key_padding_mask(valid, 0, "sdpa")
    t0 = time.perf_counter()
    block_mask = key_padding_mask(valid, 0, "flex")
    first_mask_s = time.perf_counter() - t0
    compiled = torch.compile(flex_attention)

    fwd = {
        "sdpa_nomask": lambda: F.scaled_dot_product_attention(q, k, v),
        "sdpa_mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask),
    }
    flex_trains = device.type != "cpu"
    if flex_trains or not train:
        fwd["flex_compiled"] = lambda: compiled(q, k, v, block_mask=block_mask)
        if not args.no_eager_flex:
            fwd["flex_eager"] = lambda: flex_attention(q, k, v, block_mask=block_mask)

    rows = valid[:, None, :, None]  # the valid queries' outputs are what a model reads

    def step_of(f):
        def step():
            if not train:
                with torch.no_grad():
                    return f()
            out = f()
            (out * rows).sum().backward()
            q.grad = k.grad = v.grad = None
            return out.detach()

        return step

    fns = {n: step_of(f) for n, f in fwd.items()}
    t0 = time.perf_counter()
    outs, compile_s = {}, None
    for name, fn in fns.items():
        c0 = time.perf_counter()
        outs[name] = fn()
        if name == "flex_compiled":
            compile_s = time.perf_counter() - c0  # the first call compiles
    diffs = {n: ((o - outs["sdpa_mask"]) * rows).abs().max().item() for n, o in outs.items() if n != "sdpa_nomask"}
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert all(d < tol for d in diffs.values()), f"variants disagree with SDPA on the valid tokens: {diffs}"
    fns["block_mask_create"] = lambda: key_padding_mask(valid, 0, "flex")  # per-block key counts (ours)
    fns["block_mask_create_generic"] = lambda: create_block_mask(  # evaluating the mask on every pair
        lambda b, h, qi, ki: valid[b, ki], B, None, T, T, device=device
    )
    load_before = os.getloadavg()
    res = time_alternating(fns, device, args.steps, args.rounds)
    load_after = os.getloadavg()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    ms = {n: r["ms"] for n, r in res.items()}

    def ratio(a: str, b: str, key: str) -> float | None:
        if a not in res or b not in res or key not in res[a]:
            return None
        return res[a][key] / res[b][key]

    med = {n: r["median_round_ms"] for n, r in res.items()}
    out = {
        "benchmark": "naflex_attention", "mode": args.mode, "model": args.model, "device": name, "precision": args.dtype,
        "batch_size": B, "seq": T, "heads": H, "head_dim": Dh, "valid_lengths": lengths.tolist(),
        "padding_share": 1 - lengths.sum().item() / (B * T), "max_abs_diff_vs_sdpa_mask": diffs,
        "flex_compile_s": compile_s, "first_block_mask_s": first_mask_s, "ms_per_call": ms,
        "median_round_ms": med,
        "speedup_flex_compiled_vs_sdpa_mask": ratio("sdpa_mask", "flex_compiled", "ms"),
        "speedup_flex_compiled_vs_sdpa_mask_median_round": ratio("sdpa_mask", "flex_compiled", "median_round_ms"),
        "speedup_flex_compiled_vs_sdpa_mask_cpu_time": ratio("sdpa_mask", "flex_compiled", "cpu_ms"),
        "mask_overhead_sdpa": ratio("sdpa_mask", "sdpa_nomask", "ms"),
        "flex_skipped": None if "flex_compiled" in fwd else "FlexAttention has no backward on CPU",
        "loadavg_before": load_before, "loadavg_after": load_after, "rounds": res,
        "torch": torch.__version__, "commit": git_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "setup_s": time.perf_counter() - t0,
    }  # fmt: skip
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"}, indent=1))
    if args.json:
        print(f"wrote {write_json(out, args.json)}")


if __name__ == "__main__":
    main()
