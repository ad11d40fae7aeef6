"""fp8 (and the blocks' other numerics switches) against bf16 in the real trainer: the same run
(model, data order, seed) once per precision, the loss curves side by side and the trainer's own img/s.

Each run is ``vitscale train`` on real images — scikit-learn's handwritten digits at the model's
224 px (``--data digits``), or an image folder with ``train/`` and ``val/`` (``--data PATH``, e.g.
``vitscale data digits DIR --size 224`` written where scikit-learn is installed) — for ``--steps``
steps with per-block compile and bf16 autocast, first with ``precision.fp8=none`` and then with
each recipe of ``--fp8``, and with ``--residual-bf16`` a run with ``precision.residual=bf16`` (the
residual stream held in bf16), with ``--mlp-epilogue MODE`` one with ``precision.mlp_epilogue=MODE``
(each in bf16 without fp8). The comparison (issue 15's criterion): the mean logged loss over the last
``--window`` steps of each other run within ``--tolerance`` (2%) of bf16's; also the largest
step-by-step gap and the steady img/s (median of the logged img/s after ``--skip`` steps, which
holds the compile warm-up). The run folders stay in ``--out-dir``.

    python benchmarks/loss_curve.py --model vit_h14 --batch-size 64 --steps 300 --fp8 tensorwise rowwise \
        --json benchmarks/results/fp8_curve_vit_h14_h100_202611.json
    python benchmarks/loss_curve.py --model vit_b16 --batch-size 128 --steps 300 --fp8 --residual-bf16
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_config(args, precision: dict, out: Path) -> dict:
    """The ``vitscale train`` config of one run (written into its folder as YAML); ``precision``: its
    ``precision`` settings besides bf16 autocast and ``fp8_filter``."""
    data = {"format": "digits", "img_size": args.img_size} if args.data == "digits" else {
        "format": "imagefolder", "train_path": str(Path(args.data) / "train"), "val_path": str(Path(args.data) / "val"),
    }  # fmt: skip
    if args.data != "digits":
        data["img_size"] = args.img_size
    data.update(mean=[0.5] * 3, std=[0.5] * 3, hflip=0.0, rrc_scale=[0.8, 1.0], num_workers=args.workers)
    return {
        "model": {"name": args.model},
        "data": data,
        "optim": {"name": "adamw", "lr": args.lr, "weight_decay": 0.05},
        "schedule": {"name": "cosine", "warmup_steps": max(args.steps // 10, 1)},
        "train": {"batch_size": args.batch_size, "max_steps": args.steps, "seed": 0, "grad_clip": 1.0,
                  "log_every": args.log_every, "output_dir": str(out), "compile": args.compile},  # fmt: skip
        "precision": {"autocast": "bf16", "fp8_filter": args.fp8_filter, **precision},
        "eval": {"every": 0, "batch_size": 256},
        "checkpoint": {"every": 0, "export_safetensors": False, "resume": False},
        "log": {"progress": "plain"},
    }


def compare(base: dict[int, float], other: dict[int, float], window: int) -> dict[str, float]:
    """Mean loss over the last ``window`` steps of each curve, their relative difference, and the
    largest relative gap at any logged step (both curves logged at the same steps)."""
    steps = sorted(set(base) & set(other))
    last = [s for s in steps if s > steps[-1] - window]
    mb, mo = statistics.fmean(base[s] for s in last), statistics.fmean(other[s] for s in last)
    return {
        "mean_last_bf16": mb, "mean_last": mo, "rel_diff_last": (mo - mb) / mb,
        "max_rel_gap": max(abs(other[s] - base[s]) / base[s] for s in steps), "steps_compared": len(last),
    }  # fmt: skip


def read_run(out: Path, skip: int) -> dict:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    losses = {r["step"]: r["loss"] for r in rows if "loss" in r}
    ips = [r["img_per_s"] for r in rows if "img_per_s" in r and r["step"] > skip]
    summary = json.loads((out / "summary.json").read_text())
    return {"losses": losses, "img_per_s": statistics.median(ips) if ips else None,
            "val_top1": summary.get("val_top1"), "wall_time_s": summary.get("wall_time_s")}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="vit_h14")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--fp8", nargs="*", default=["tensorwise"], help="recipes compared with bf16 (none: --fp8 alone)")
    ap.add_argument("--fp8-filter", default="auto", choices=("auto", "all", "torchao"))
    ap.add_argument("--residual-bf16", action="store_true", help="also a run with precision.residual=bf16")
    ap.add_argument("--mlp-epilogue", choices=("cublaslt", "cublaslt_tanh"), default=None,
                    help="also a run with precision.mlp_epilogue=MODE (CUDA, nvmath-python)")  # fmt: skip
    ap.add_argument("--data", default="digits", help="digits, or an image folder with train/ and val/")
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--window", type=int, default=100, help="last steps whose mean loss is compared")
    ap.add_argument("--skip", type=int, default=50, help="steps left out of the steady img/s")
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--out-dir", default=None, help="run folders (default: a temporary folder)")
    ap.add_argument("--json", help="write the comparison here")
    ap.add_argument("--dry-run", action="store_true", help="check the arguments and the configs, run nothing")
    args = ap.parse_args(argv)
    from vitscale.config import load_config
    from vitscale.distributed.float8 import RECIPES

    bad = [r for r in args.fp8 if r not in RECIPES or r == "none"]
    if bad:
        ap.error(f"--fp8: {bad} (choose from {', '.join(RECIPES[1:])})")
    runs = {"bf16": {"fp8": "none"}, **{r: {"fp8": r} for r in args.fp8}}
    if args.residual_bf16:
        runs["residual_bf16"] = {"fp8": "none", "residual": "bf16"}
    if args.mlp_epilogue:
        runs[f"mlp_{args.mlp_epilogue}"] = {"fp8": "none", "mlp_epilogue": args.mlp_epilogue}
    if len(runs) == 1:
        ap.error("nothing to compare with bf16: give --fp8 RECIPE..., --residual-bf16 or --mlp-epilogue")
    if args.dry_run:  # every config must load (unknown keys, bad values)
        with tempfile.TemporaryDirectory() as tmp:
            for label, prec in runs.items():
                (Path(tmp) / f"{label}.yaml").write_text(yaml.safe_dump(run_config(args, prec, Path(tmp) / label)))
                load_config(Path(tmp) / f"{label}.yaml")
        if args.fp8:
            from vitscale.distributed.float8 import require_torchao

            require_torchao()  # a machine without it learns so before its time is spent
        print(f"dry run: {vars(args)}")
        return 0
    root = Path(args.out_dir or tempfile.mkdtemp(prefix="fp8_curve_"))
    for label, prec in runs.items():
        (root / label).mkdir(parents=True, exist_ok=True)
        (root / label / "run.yaml").write_text(yaml.safe_dump(run_config(args, prec, root / label)))
    results: dict = {}
    for label in runs:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "vitscale", "train", str(root / label / "run.yaml")],
                              cwd=ROOT, text=True, capture_output=True)  # fmt: skip
        # the run keeps what it printed in root/label/train.log itself
        print(f"=== {label}: exit {proc.returncode} in {time.perf_counter() - t0:.0f} s", flush=True)
        print("\n".join((proc.stdout + proc.stderr).splitlines()[-6:]), flush=True)
        if proc.returncode != 0:
            results[label] = {"error": (proc.stdout + proc.stderr)[-2000:]}
            continue
        results[label] = read_run(root / label, args.skip)
    base = results.get("bf16", {})
    verdicts = {}
    for label in [r for r in runs if r != "bf16"]:
        if "losses" in base and "losses" in results.get(label, {}):
            c = compare(base["losses"], results[label]["losses"], args.window)
            c["within_tolerance"] = abs(c["rel_diff_last"]) <= args.tolerance
            if base["img_per_s"] and results[label]["img_per_s"]:
                c["speedup"] = results[label]["img_per_s"] / base["img_per_s"]
            verdicts[label] = c
            print(f"{label} vs bf16: mean loss of the last {args.window} steps {c['mean_last']:.4f} vs "
                  f"{c['mean_last_bf16']:.4f} ({c['rel_diff_last'] * 100:+.2f}%, tolerance {args.tolerance * 100:g}%), "
                  f"largest gap {c['max_rel_gap'] * 100:.2f}%, img/s x{c.get('speedup', float('nan')):.3f}")  # fmt: skip
    import torch

    from vitscale.bench.report import git_commit

    out = {"model": args.model, "settings": vars(args), "torch": torch.__version__, "commit": git_commit(),
           "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": results, "vs_bf16": verdicts}  # fmt: skip
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0 if all("losses" in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
