"""Patch embedding: strided Conv2d (ours today) vs reshape + matmul, forward + backward.

Both compute the same thing with the same weight (the Conv2d weight viewed as ``(D, C*p*p)``); the
script checks that, then times the two in alternating rounds and writes JSON.

    python benchmarks/patch_embed.py --model vit_s16 --device cpu --batch-size 8 \
        --json benchmarks/results/patch_embed_cpu_202611.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from vitscale.bench.harness import resolve_autocast
from vitscale.bench.report import git_commit, write_json
from vitscale.bench.timing import time_alternating
from vitscale.models.registry import get_model_config
from vitscale.train.fastpath import autocast


def patch_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, p: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, D) as one matmul over flattened (C, p, p) patches."""
    B, C, H, W = x.shape
    x = x.view(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)  # (B, h, w, C, p, p)
    x = x.reshape(B, (H // p) * (W // p), C * p * p)  # (B, N, C*p*p)
    return F.linear(x, weight.view(weight.shape[0], -1), bias)  # (B, N, D)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_s16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--compile", action="store_true", help="torch.compile both variants")
    ap.add_argument("--json", default=None)
    ap.add_argument("--dry-run", action="store_true", help="check the arguments and the model, run nothing")
    args = ap.parse_args()
    if args.dry_run:
        get_model_config(args.model)
        print(f"dry run: {vars(args)}")
        return

    device = torch.device(args.device)
    dtype = resolve_autocast(args.precision, device)
    precision = "fp32" if dtype is None else "bf16"
    cfg = get_model_config(args.model)
    p, C, D = cfg.patch_dim, cfg.num_channels, cfg.hidden_size
    conv = torch.nn.Conv2d(C, D, p, stride=p, device=device)
    x = torch.randn(args.batch_size, C, cfg.img_h, cfg.img_w, device=device)

    def conv_fwd(x):
        return conv(x).flatten(2).transpose(1, 2)  # (B, N, D)

    def mm_fwd(x):
        return patch_matmul(x, conv.weight, conv.bias, p)

    fwd = {"conv": conv_fwd, "matmul": mm_fwd}
    if args.compile:
        fwd = {k: torch.compile(f) for k, f in fwd.items()}
    with torch.no_grad(), autocast(device, dtype):
        a, b = fwd["conv"](x), fwd["matmul"](x)
    max_diff = (a.float() - b.float()).abs().max().item()
    tol = 1e-3 if precision == "fp32" else 5e-2
    assert max_diff < tol * max(1.0, a.abs().max().item()), f"variants disagree: {max_diff}"

    def train(f):
        def step():
            with autocast(device, dtype):
                y = f(x)
            y.float().square().mean().backward()  # grad flows to the weight (input needs none)
            conv.weight.grad = conv.bias.grad = None

        return step

    res = time_alternating({k: train(f) for k, f in fwd.items()}, device, args.steps, args.rounds)
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu, {torch.get_num_threads()} threads"
    )
    out = {
        "benchmark": "patch_embed", "model": args.model, "device": name, "precision": precision,
        "batch_size": args.batch_size, "compile": args.compile, "max_abs_diff": max_diff,
        "conv_ms": res["conv"]["ms"], "matmul_ms": res["matmul"]["ms"],
        "speedup_matmul": res["conv"]["ms"] / res["matmul"]["ms"],
        "speedup_matmul_median_round": res["conv"]["median_round_ms"] / res["matmul"]["median_round_ms"],
        "speedup_matmul_cpu_time": (res["conv"]["cpu_ms"] / res["matmul"]["cpu_ms"]) if "cpu_ms" in res["conv"] else None,
        "rounds": res, "torch": torch.__version__, "commit": git_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"}, indent=1))
    if args.json:
        print(f"wrote {write_json(out, args.json)}")


if __name__ == "__main__":
    main()
