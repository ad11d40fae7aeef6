"""The largest training batch per GPU, found by trying: double until a step runs out of memory, then
bisect between the last batch that fit and the first that did not (to a multiple of ``--multiple``).

One full training step per try, as the trainer runs it on a GPU: bf16 autocast, per-block
``torch.compile`` (``--no-compile`` for eager), fused AdamW whose state exists before the search
(a batch-1 step first), with or without activation checkpointing of every block (``--ac``). After
an out-of-memory error the gradients are dropped, the allocator's cache emptied and a smaller batch
tried. The result goes beside the estimate in ``vitscale memory --table`` (it reads the newest
``benchmarks/results/max_batch_*.json``).

    python benchmarks/max_batch.py --models vit_b16 vit_l16 --ac none full --device cuda \
        --json benchmarks/results/max_batch_h100_202611.json
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vitscale.distributed.config import ParallelConfig, PrecisionConfig  # noqa: E402
from vitscale.distributed.fsdp import resolve_precision  # noqa: E402
from vitscale.distributed.parallel_dims import ParallelDims, resolve_device  # noqa: E402
from vitscale.tasks import get_task  # noqa: E402
from vitscale.train import fastpath  # noqa: E402

OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def search(fits: Callable[[int], bool], start: int = 8, limit: int = 65536, multiple: int = 8):
    """``(largest batch that fits, {batch: fitted}, reached_limit)``: ``start``, doubled while it fits
    (up to ``limit``), then bisected on multiples of ``multiple``; 0 when not even the smallest fits."""
    tried: dict[int, bool] = {}

    def ok(b: int) -> bool:
        tried[b] = bool(fits(b))
        return tried[b]

    lo, hi, b = 0, None, start
    while b <= limit:
        if not ok(b):
            hi = b
            break
        lo, b = b, b * 2
    if hi is None:
        return lo, tried, True
    while hi - lo > multiple:
        mid = lo + max((hi - lo) // 2 // multiple, 1) * multiple
        if mid >= hi:
            break
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo, tried, False


class Trial:
    """One model with its optimizer, stepping at any batch size and saying whether it fitted."""

    def __init__(self, name: str, ac: str, device: torch.device, compile_blocks: bool):
        from vitscale.run import build_model

        self.device = device
        self.autocast = resolve_precision(PrecisionConfig(), device).autocast  # bf16 on CUDA, none on CPU
        # as the trainer builds it: activation checkpointing and per-block compile by the parallelize tail
        self.model = build_model(
            name, ParallelDims(device=device), parallel=ParallelConfig(activation_checkpointing=ac),
            compile=compile_blocks, seed=0,
        ).train()  # fmt: skip
        self.optimizer = fastpath.make_adamw(self.model.parameters(), device)
        self.img = (self.model.cfg.num_channels, self.model.cfg.img_h, self.model.cfg.img_w)
        self.num_classes = self.model.cfg.num_classes
        self.peaks: dict[int, float] = {}
        assert self(1), "a batch of 1 does not fit"  # the optimizer state exists from here on

    def __call__(self, batch: int) -> bool:
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            x = torch.randn(batch, *self.img, device=self.device)
            y = torch.randint(0, self.num_classes, (batch,), device=self.device)
            with fastpath.autocast(self.device, self.autocast):
                loss = get_task("classification").bench_loss(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize(self.device)
                self.peaks[batch] = torch.cuda.max_memory_allocated(self.device) / 2**30
            return True
        except OOM:
            return False
        finally:  # free what a failed step left behind before the next try
            x = y = loss = None  # noqa: F841
            self.optimizer.zero_grad(set_to_none=True)
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()

    def release(self) -> None:
        self.model = self.optimizer = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["vit_b16", "vit_l16", "vit_h14", "vit_g14"])
    ap.add_argument("--ac", nargs="+", default=["none", "full"], choices=("none", "full", "selective"))
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="per-block torch.compile (default: on CUDA)")  # fmt: skip
    ap.add_argument("--start", type=int, default=32, help="first batch tried (default 32)")
    ap.add_argument("--limit", type=int, default=16384, help="largest batch tried (default 16384)")
    ap.add_argument("--multiple", type=int, default=8, help="resolution of the bisection (default 8)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--dry-run", action="store_true", help="check the arguments and the models, run nothing")
    args = ap.parse_args(argv)
    from vitscale.models.registry import get_model_config

    for name in args.models:
        get_model_config(name)  # unknown names fail here
    if args.start < 1 or args.multiple < 1 or args.limit < args.start:
        ap.error("need 1 <= --start <= --limit and --multiple >= 1")
    if args.dry_run:
        print(f"dry run: {vars(args)}")
        return 0
    device = resolve_device(args.device)
    compile_on = device.type == "cuda" if args.compile is None else args.compile
    gpu_gib = torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda" else None
    results = []
    for name in args.models:
        for ac in args.ac:
            t0 = time.perf_counter()
            trial = Trial(name, ac, device, compile_on)
            largest, tried, at_limit = search(trial, args.start, args.limit, args.multiple)
            peak = trial.peaks.get(largest)
            trial.release()
            results.append({
                "model": name, "ac": ac, "max_batch": largest, "peak_gib": peak, "reached_limit": at_limit,
                "tried": {str(b): ok for b, ok in tried.items()}, "seconds": time.perf_counter() - t0,
            })  # fmt: skip
            print(
                f"{name} ac={ac}: largest batch {largest}{' (the limit: it may fit more)' if at_limit else ''}"
                + (f", peak {peak:.1f} GiB" if peak else "") + f"; tried {tried} in {time.perf_counter() - t0:.0f} s",
                flush=True,
            )  # fmt: skip
    from vitscale.bench.harness import device_description
    from vitscale.bench.report import git_commit

    out = {
        "device": device_description(device), "gpu_gib": gpu_gib, "torch": torch.__version__, "commit": git_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": results,
        "settings": {**vars(args), "compile": compile_on, "autocast": str(resolve_precision(PrecisionConfig(), device).autocast),
                     "optimizer": "AdamW (fused on CUDA)", "image": "224 px (each model's own size)"},
    }  # fmt: skip
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
