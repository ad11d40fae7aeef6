"""Per-operator time of one training (or inference) step, ours next to the reference implementation.

The profile behind a speed figure: where the step's time goes, operator by operator, for vitscale's
model and timm's / open_clip's in the same process, same batch, precision and optimizer as
``vitscale bench`` (it builds them with the bench harness). On CPU it sums each operator's self CPU
time; on CUDA each kernel's device time (kernels only: an operator's device time is its kernels'
again; ``vitscale.bench.profile.op_times``). The totals are a second, lower-noise reading of the ratio
the bench reports, since profiler time counts only work done, not waiting.

    python benchmarks/profile_ops.py --model vit_s16 --device cpu --batch-size 8 --steps 2 --repeats 2
    python benchmarks/profile_ops.py --model vit_b16 --device cuda --batch-size 256 --compile
    python benchmarks/profile_ops.py --model clip_b32 --device cuda --batch-size 512 --compare open_clip
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vitscale.bench.harness import BenchSettings, build_impls, sync  # noqa: E402
from vitscale.bench.profile import op_times  # noqa: E402
from vitscale.distributed.parallel_dims import resolve_device  # noqa: E402
from vitscale.train import fastpath  # noqa: E402


def profile_ops(settings: BenchSettings, steps: int, repeats: int) -> dict[str, dict[str, float]]:
    """``{implementation key: {operator: ms per step}}``, summed over ``repeats`` alternating
    profiles of ``steps`` steps each (after ``settings.warmup`` untimed steps)."""
    impls, info = build_impls(settings)
    device = info["device"]
    out: dict[str, dict[str, float]] = {}
    with fastpath.sdpa_backend(settings.sdpa):
        for impl in impls:
            for _ in range(max(1, settings.warmup)):
                impl.step()
            sync(device)
            impl.release()
        for r in range(repeats):
            for impl in impls if r % 2 == 0 else impls[::-1]:
                times = op_times(impl.step, device, steps)
                impl.release()
                ops = out.setdefault(impl.key, {})
                for name, ms in times.items():
                    ops[name] = ops.get(name, 0.0) + ms / repeats
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_s16")
    p.add_argument("--device", default="auto")
    p.add_argument("--mode", default="train", choices=("train", "infer"))
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=2, help="steps per profile")
    p.add_argument("--repeats", type=int, default=2, help="alternating profiles per implementation")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--compare", default="timm", help="timm | open_clip | none")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--top", type=int, default=30, help="operators listed")
    p.add_argument("--json", help="write {implementation: {operator: ms/step}} here")
    a = p.parse_args(argv)
    settings = BenchSettings(
        model=a.model, mode=a.mode, device=a.device, batch_size=a.batch_size, warmup=a.warmup,
        compare=None if a.compare == "none" else a.compare, compile=a.compile, compare_compiled=False,
    )  # fmt: skip
    res = profile_ops(settings, a.steps, a.repeats)
    keys = list(res)
    unit = "device ms/step" if resolve_device(a.device).type == "cuda" else "CPU ms/step"
    print(f"self time per operator ({unit}), {a.model} {a.mode}, batch {a.batch_size}, torch {torch.__version__}")
    print(f"{'operator':<60}" + "".join(f"{k:>14}" for k in keys))
    ops = sorted({o for d in res.values() for o in d}, key=lambda o: -sum(d.get(o, 0.0) for d in res.values()))
    for o in ops[: a.top]:
        print(f"{o[:60]:<60}" + "".join(f"{res[k].get(o, 0.0):>14.2f}" for k in keys))
    totals = {k: sum(d.values()) for k, d in res.items()}
    print(f"{'total':<60}" + "".join(f"{totals[k]:>14.2f}" for k in keys))
    if len(keys) > 1:
        print(f"{keys[1]} / {keys[0]} total time: {totals[keys[1]] / totals[keys[0]]:.3f}x")
    if a.json:
        Path(a.json).write_text(json.dumps({"settings": vars(a), "torch": torch.__version__, "ms_per_step": res,
                                            "total_ms_per_step": totals}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
