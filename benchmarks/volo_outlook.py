"""VOLO outlook attention: the eager unfold / fold path vs the fused Triton op, with and without torch.compile.

Two levels, each forward + backward in alternating rounds (``vitscale.bench.timing``):
- ``op``: the aggregation alone, values ``(B, H, W, C)`` and logits ``(B, h, w, heads * 81)`` in, as
  the outlooker's linear layers give them: ``eager`` (unfold -> matmul -> fold), ``eager_compiled``
  (the same under ``torch.compile``: what inductor makes of it) and ``triton`` (the fused op);
- ``block``: one outlooker block (LayerNorm, outlook attention, MLP, residuals) of ``--model``'s
  configuration on its fine grid: ``eager``, ``eager_compiled`` (per-block compile as before the
  kernel), ``triton`` and ``triton_compiled`` (per-block compile with the kernel: the default on CUDA).

Outputs and gradients of the Triton variants are checked against eager first (bf16: within 2e-2 of
the largest value); peak memory per variant is recorded on CUDA. The Triton variants need CUDA (or
``TRITON_INTERPRET=1`` on the CPU, for a smoke test of the script at debug size).

    python benchmarks/volo_outlook.py --model volo_d1 --device cuda --batch-size 128 \
        --json benchmarks/results/volo_outlook_d1_h100_202611.json
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from vitscale.bench.harness import resolve_autocast
from vitscale.bench.report import git_commit, write_json
from vitscale.bench.timing import time_alternating
from vitscale.models.registry import get_model_config
from vitscale.models.volo.model import Outlooker
from vitscale.models.volo.outlook_kernel import kernel_can_run, outlook_attention, outlook_reference
from vitscale.train.fastpath import autocast


def _set_impl(block: Outlooker, impl: str) -> Outlooker:
    block.attn.impl = impl
    return block


def _step(fn, inputs: list[torch.Tensor], params: list[torch.Tensor], device, precision):
    """One forward + backward of ``fn(*inputs)``; gradients are dropped afterwards."""

    def step():
        with autocast(device, torch.bfloat16 if precision == "bf16" else None):
            y = fn(*inputs)
        y.float().square().mean().backward()
        for t in (*inputs, *params):
            t.grad = None

    return step


def _grads(fn, inputs, params, device, precision) -> list[torch.Tensor]:
    with autocast(device, torch.bfloat16 if precision == "bf16" else None):
        y = fn(*inputs)
    y.float().square().mean().backward()
    out = [y.detach().float()] + [t.grad.float().clone() for t in (*inputs, *params)]
    for t in (*inputs, *params):
        t.grad = None
    return out


def _max_rel_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(((x - y).abs().max() / y.abs().max().clamp_min(1e-12)).item() for x, y in zip(a, b))


def _peak_mib(step, device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="volo_d1", help="a VOLO variant (its outlooker width, heads, fine grid)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--no-compile", action="store_true", help="leave out the torch.compile variants")
    ap.add_argument("--json", default=None)
    ap.add_argument("--dry-run", action="store_true", help="check the arguments and the model, run nothing")
    args = ap.parse_args()
    cfg = get_model_config(args.model)
    if not hasattr(cfg, "outlook_kernel"):
        raise SystemExit(f"{args.model} is not a VOLO variant")
    if args.dry_run:
        print(f"dry run: {vars(args)}")
        return

    device = torch.device(args.device)
    precision = "fp32" if resolve_autocast(args.precision, device) is None else "bf16"
    torch.manual_seed(0)
    K, P, S = cfg.outlook_kernel, cfg.outlook_padding, cfg.outlook_stride
    H, W = cfg.fine_grid
    h, w = ((n + 2 * P - K) // S + 1 for n in (H, W))
    heads, dh = cfg.outlook_heads, cfg.outlook_dim // cfg.outlook_heads
    scale = dh**-0.5
    run_triton = kernel_can_run(torch.empty(0, device=device))
    compiled = not args.no_compile

    # ---- op level: the aggregation alone (inputs in the autocast dtype, as the linears give them)
    dt = torch.bfloat16 if precision == "bf16" else torch.float32
    v = torch.randn(args.batch_size, H, W, cfg.outlook_dim, device=device, dtype=dt, requires_grad=True)
    logits = torch.randn(args.batch_size, h, w, heads * K**4, device=device, dtype=dt, requires_grad=True)

    def op_eager(v, logits):
        return outlook_reference(v, logits, K, P, S, scale)

    def op_triton(v, logits):
        return outlook_attention(v, logits, K, P, S, scale)

    ops = {"eager": op_eager}
    if compiled:
        ops["eager_compiled"] = torch.compile(op_eager)
    if run_triton:
        ops["triton"] = op_triton

    # ---- block level: one outlooker block of the model
    block = Outlooker(cfg, device=device)
    for m in block.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.trunc_normal_(m.weight, std=0.02)
    x = torch.randn(args.batch_size, H, W, cfg.outlook_dim, device=device, requires_grad=True)  # (B, H, W, D)
    block_variants = {"eager": _set_impl(block, "eager")}
    if compiled:
        block_variants["eager_compiled"] = torch.compile(_set_impl(copy.deepcopy(block), "eager"))
    if run_triton:
        block_variants["triton"] = _set_impl(copy.deepcopy(block), "triton")
        if compiled:
            block_variants["triton_compiled"] = torch.compile(_set_impl(copy.deepcopy(block), "triton"))

    def params(m):
        return list(m.parameters())

    result: dict = {}
    for level, fns, inputs in (("op", ops, [v, logits]), ("block", block_variants, [x])):
        steps = {k: _step(f, inputs, params(f) if level == "block" else [], device, precision) for k, f in fns.items()}
        ref = _grads(fns["eager"], inputs, params(fns["eager"]) if level == "block" else [], device, precision)
        diffs = {
            k: _max_rel_diff(_grads(f, inputs, params(f) if level == "block" else [], device, precision), ref)
            for k, f in fns.items() if k != "eager"
        }  # fmt: skip
        tol = 1e-4 if precision == "fp32" else 2e-2
        bad = {k: d for k, d in diffs.items() if d > tol}
        assert not bad, f"{level}: variants disagree with eager (max relative difference {bad}, tolerance {tol})"
        for step in steps.values():  # compile / autotune before anything is measured
            step()
        peaks = {k: _peak_mib(s, device) for k, s in steps.items()}
        res = time_alternating(steps, device, args.steps, args.rounds)
        result[level] = {
            k: {"ms": r["ms"], "median_round_ms": r["median_round_ms"], "peak_mib": peaks[k],
                "max_rel_diff_vs_eager": diffs.get(k, 0.0), "rounds_ms": r["rounds_ms"]}
            for k, r in res.items()
        }  # fmt: skip
        base = res["eager_compiled" if "eager_compiled" in res else "eager"]["ms"]
        for k, r in res.items():
            result[level][k]["speedup_vs_" + ("eager_compiled" if "eager_compiled" in res else "eager")] = base / r["ms"]

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    out = {
        "benchmark": "volo_outlook", "model": args.model, "device": name, "precision": precision,
        "batch_size": args.batch_size, "fine_grid": [H, W], "window_grid": [h, w], "heads": heads, "head_dim": dh,
        "kernel": K, "padding": P, "stride": S, "triton": run_triton, "compile": compiled, **result,
        "torch": torch.__version__, "commit": git_commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip
    if not run_triton:
        print("note: the Triton variants need a CUDA device (or TRITON_INTERPRET=1 on the CPU); timed eager only")
    summary = {lvl: {k: {kk: vv for kk, vv in r.items() if kk != "rounds_ms"} for k, r in out[lvl].items()}
               for lvl in ("op", "block")}  # fmt: skip
    print(json.dumps({**{k: v for k, v in out.items() if k not in ("op", "block")}, **summary}, indent=1))
    if args.json:
        print(f"wrote {write_json(out, args.json)}")


if __name__ == "__main__":
    main()
