"""How long a checkpoint stalls the step loop: ``checkpoint.async_mode`` disabled (the loop waits for
the whole write) against async and async_pinned (the loop waits for the copy to CPU memory; DCP's
background thread writes it), on a ViT-B/16-sized training state: the model's weights and AdamW's two
moments (fp32), saved through :class:`vitscale.checkpoint.Checkpointer` exactly as the trainer saves
them (``ModelState`` / ``OptimizerState``, the finite check, checksums, the sealed index). Not a test.

Per round and mode (interleaved, so a busy spell on a shared machine hits every mode alike): the
stall (``save()`` returning), the time until the checkpoint is complete on disk, and — asynchronous
modes — the time of a fixed CPU "step" (matrix products, the training thread's work) while the write
runs in the background, against the same step with no write (the background thread competes for the
cores and the GIL). Medians; the load average before and after is recorded.

    python benchmarks/checkpoint_async.py --rounds 5 --json benchmarks/results/checkpoint_async_cpu_202611.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from vitscale.checkpoint import Checkpointer
from vitscale.checkpoint.state import ModelState, OptimizerState
from vitscale.models import create_model

MODES = ("disabled", "async", "async_pinned")


def train_state(name: str, device: str = "cpu"):
    torch.manual_seed(0)
    model = create_model(name).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()  # AdamW's moments exist, as after the first training step
    opt.zero_grad(set_to_none=True)
    return model, opt


def step_work(a: torch.Tensor) -> float:
    """A fixed amount of training-thread work (what the loop does while a write goes on)."""
    t0 = time.perf_counter()
    for _ in range(8):
        a = torch.tanh(a @ a) * 0.5
    if a.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vit_b16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the training state lives (a GPU: staged into pinned host memory by async_pinned)")
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--dry-run", action="store_true", help="check the arguments and the model, run nothing")
    args = ap.parse_args()
    if args.dry_run:
        from vitscale.models import get_model_config

        get_model_config(args.model)
        print(f"dry run: {vars(args)}")
        return
    model, opt = train_state(args.model, args.device)
    state = {"model": ModelState(model), "optim": OptimizerState(model, opt)}
    params = sum(p.numel() for p in model.parameters())
    nbytes = sum(t.numel() * t.element_size() for t in list(model.state_dict().values())
                 + [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)])  # fmt: skip
    root = Path(args.dir or tempfile.mkdtemp(prefix="ckpt_async_"))
    checkpointers = {m: Checkpointer(root / m, keep=1, async_mode=m) for m in MODES}
    work = torch.randn(384, 384, device=args.device) * 0.05
    idle_steps = [step_work(work) for _ in range(5)]
    stall = {m: [] for m in MODES}
    complete = {m: [] for m in MODES}
    during = {m: [] for m in MODES}
    idle = {m: [] for m in MODES}
    load = [os.getloadavg()]
    step = 0
    print(f"{args.model}: {params:,} parameters, {nbytes / 2**20:.0f} MiB of state; load {os.getloadavg()}", flush=True)
    for r in range(args.rounds + 1):  # the first round warms up (allocations, the page cache, pinned buffers): dropped
        for m in MODES:
            step += 1
            ck = checkpointers[m]
            idle[m].append(statistics.median(step_work(work) for _ in range(3)))
            t0 = time.perf_counter()
            ck.save(step, state, {"step": step, "data": {}})
            t1 = time.perf_counter()
            steps = []
            while ck.pending is not None and not ck.pending.future.done():
                steps.append(step_work(work))  # the loop goes on while the background write runs
            ck.wait()
            t2 = time.perf_counter()
            stall[m].append(t1 - t0)
            complete[m].append(t2 - t0)
            during[m].append(statistics.median(steps) if steps else None)
            print(f"round {r}{' (warm-up, dropped)' if r == 0 else ''} {m:>12}: stall {t1 - t0:.3f} s, complete {t2 - t0:.3f} s, "
                  f"{len(steps)} steps during the write, load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    load.append(os.getloadavg())
    for d in (stall, complete, during, idle):
        for m in MODES:
            d[m] = d[m][1:]
    med = {m: round(statistics.median(stall[m]), 3) for m in MODES}
    res = {
        "model": args.model, "parameters": params, "state_bytes": nbytes,
        "state": "model weights + AdamW exp_avg, exp_avg_sq (fp32), as the trainer saves them",
        "rounds": args.rounds, "warmup_rounds_dropped": 1,
        "stall_median_s": med,
        "complete_median_s": {m: round(statistics.median(complete[m]), 3) for m in MODES},
        "step_during_background_write_median_s": {m: (round(statistics.median(x for x in during[m] if x is not None), 4)
                                                       if any(x is not None for x in during[m]) else None) for m in MODES},  # fmt: skip
        "step_idle_median_s": {m: round(statistics.median(idle[m]), 4) for m in MODES},
        "stall_speedup_vs_disabled": {m: round(med["disabled"] / med[m], 1) for m in MODES if med[m] > 0},
        "all_s": {"stall": {m: [round(x, 3) for x in v] for m, v in stall.items()},
                  "complete": {m: [round(x, 3) for x in v] for m, v in complete.items()}},  # fmt: skip
        "loadavg_before_after": [list(x) for x in load],
        "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "command": "python benchmarks/checkpoint_async.py " + " ".join(
            f"--{k} {v}" for k, v in vars(args).items() if v not in (None, False) and k not in ("dir", "dry_run")),
        "idle_step_s_before": round(statistics.median(idle_steps), 4),
    }  # fmt: skip
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
