"""Short bf16 training runs of the real trainer on a GPU, each against the same run in eager mode: the
GPU-only paths of a training step (per-block ``torch.compile`` with flash SDPA, the Triton outlook
kernels of VOLO under per-outlooker compile, FlexAttention with NaFlex key-padding masks, CUDA graphs
of the compiled blocks, the bf16 residual stream, torchao float8, pinned asynchronous checkpoints, peak-memory reporting) run once
end to end, their loss curves compared step by step with eager's.

Each run is ``vitscale train`` on ``data.format=synthetic`` (random images keyed by index, fixed
labels; CLIP's captions from its templates; DINO's and MAE's runs pretrain ViT-B/16 without the
labels: ``train.task=dino`` / ``mae``), dropout and drop-path off, ``log_every`` 1, so two runs
of one model differ only in how their steps are computed. The comparisons, per run against the
model's ``eager`` run (same weights, same batches):

- ``first_rel``: the relative gap of the first step's loss (same weights: only the arithmetic
  differs) — at most ``--first-tol`` (1%; the fp8 variant 3%);
- ``mean_rel``: the relative gap of the mean loss over the last ``--window`` logged steps — at most
  ``--tol`` (2%; fp8 5%), and every loss finite;
- ``mem_peak_gib`` present at every log step (the trainer's peak-memory report on CUDA);
- for the ``graphs`` variant: its asynchronous pinned checkpoints written (``checkpoints/step_*``), and
  its ``mem_peak_gib`` at least 90% of the compiled run's without graphs (the graphs' pools counted).

Runs go ``--jobs`` at a time, the compiled ones first (they share the GPU: their img/s are not timings, only the curves are
compared). Writes one JSON (``--json``); each run's own folder keeps its ``train.log`` and
``metrics.jsonl`` (``--out-dir``).

    python benchmarks/gpu_curves.py --json benchmarks/results/gpu_curves_h100_202611.json
    python benchmarks/gpu_curves.py --dry-run        # every config loads; no GPU needed
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# model -> (batch size, image size, model overrides, data extras); ImageNet-sized models at 224 px.
MODELS = {
    "vit_b16": (32, 224, {"drop_path_rate": 0.0}, {}),
    "clip_b32": (64, 224, {}, {}),
    "volo_d1": (32, 224, {"drop_path_rate": 0.0, "outlook_impl": "auto"}, {}),
    # NaFlex: square images on a 12x12 / 14x14 grid padded to 160 / 200 tokens -> key-padding masks
    "naflex_b16_gap": (32, 224, {"attn_impl": "flex"}, {"seq_lens": [160, 200], "tokens_per_batch": 6400}),
    # self-supervised pretraining of ViT-B/16 (docs/ssl.md): DINOv2's defaults (2 global crops of 224 px,
    # 8 local of 96, 65,536 prototypes, iBOT, KoLeo) and MAE's (75% masked, a 512-wide 8-block decoder)
    "dino_vit_b16": (32, 224, {"drop_path_rate": 0.0}, {}),
    "mae_vit_b16": (32, 224, {"drop_path_rate": 0.0}, {}),
}
# runs of another task than classification: name -> (its model, its task, its config groups under --tiny)
TASKS = {
    "dino_vit_b16": ("vit_b16", "dino", {"dino": {"global_crops_size": 32, "local_crops_size": 16, "local_crops_number": 2,
                                                  "head_n_prototypes": 64, "head_hidden_dim": 32,
                                                  "head_bottleneck_dim": 16}}),
    "mae_vit_b16": ("vit_b16", "mae", {"mae": {"decoder_width": 32, "decoder_depth": 1, "decoder_heads": 2}}),
}  # fmt: skip
# tiny stand-ins of the same families for --tiny (the CPU test of this script's logic), by model
TINY = {"vit_b16": "vit_debug", "clip_b32": "clip_debug", "volo_d1": "volo_debug", "naflex_b16_gap": "naflex_debug"}
# variant -> (train / precision / checkpoint settings changed from eager, models it applies to)
VARIANTS = {
    "eager": ({"train": {"compile": False}}, None),
    "compile": ({"train": {"compile": True}}, None),
    "graphs": ({"train": {"compile": True, "compile_mode": "reduce-overhead"},
                "checkpoint": {"every": 10, "keep": 2, "async_mode": "async_pinned"}}, ("vit_b16",)),
    # the residual stream between the blocks held in bf16 (precision.residual, issue 50)
    "residual": ({"train": {"compile": True}, "precision": {"residual": "bf16"}}, ("vit_b16",)),
    # every block linear in float8 (fp8_filter=auto would keep B/16's small shapes in bf16)
    "fp8": ({"train": {"compile": True}, "precision": {"fp8": "tensorwise", "fp8_filter": "all"}}, ("vit_b16",)),
}  # fmt: skip
TOLERANCES = {"fp8": (0.03, 0.05)}  # (first step, last-window mean) where not (--first-tol, --tol)


def run_config(model: str, variant: str, out: Path, args) -> dict:
    """The ``vitscale train`` config of one run."""
    batch, img, overrides, data_extra = MODELS[model]
    base, task, tiny_groups = TASKS.get(model, (model, None, {}))
    name = TINY[base] if args.tiny else base
    if args.tiny:
        batch, img = 8, 32
        # on the CPU: no Triton kernel, no FlexAttention backward
        overrides = {k: v for k, v in overrides.items() if k not in ("outlook_impl", "attn_impl")}
        data_extra = {"seq_lens": [10, 20], "tokens_per_batch": 160} if data_extra else {}
    cfg = {
        "model": {"name": name, "overrides": dict(overrides)},
        "data": {"format": "synthetic", "synthetic_size": batch * (args.steps + 2), "val_split": 0.0,
                 "num_workers": args.workers, "img_size": img, **data_extra},
        "optim": {"name": "adamw", "lr": args.lr, "weight_decay": 0.05},
        "schedule": {"name": "cosine", "warmup_steps": max(args.steps // 4, 1)},
        "train": {"batch_size": batch, "max_steps": args.steps, "seed": 0, "grad_clip": 1.0, "log_every": 1,
                  "output_dir": str(out), "device": "cpu" if args.tiny else "cuda"},
        "precision": {"autocast": "none" if args.tiny else "bf16"},
        "eval": {"every": 0},
        "checkpoint": {"every": 0, "export_safetensors": False, "resume": False},
        "log": {"progress": "plain"},
    }  # fmt: skip
    if task:  # the model family's own task otherwise
        cfg["train"]["task"] = task
    if args.tiny:
        cfg.update(tiny_groups)
    if model.startswith("naflex"):
        cfg["model"]["overrides"].pop("img_size", None)
    for group, values in VARIANTS[variant][0].items():
        cfg.setdefault(group, {}).update(values)
    if args.tiny and cfg["precision"].get("residual") == "bf16":
        cfg["precision"]["autocast"] = "bf16"  # the bf16 stream needs bf16 autocast (the CPU's here)
    if args.tiny and cfg["train"].get("compile_mode") == "reduce-overhead":
        cfg["train"]["compile_mode"] = "default"  # no CUDA graphs on a CPU: the rest of the variant stays
    if cfg["train"].get("compile") and args.compile_backend != "inductor":  # Dynamo's graphs, no code generation
        cfg["train"].update(compile_backend=args.compile_backend, compile_mode="default")
    return cfg


def plan(args) -> list[tuple[str, str]]:
    """(model, variant) of every run: the compiled ones first (their compile warm-ups are the long
    part), then the eager ones, which take the places the first to finish leave."""
    runs = [(m, v) for m in args.models for v, (_, only) in VARIANTS.items() if v in args.variants
            and (only is None or m in only) and f"{m}/{v}" not in args.skip]  # fmt: skip
    return sorted(runs, key=lambda r: r[1] == "eager")


def read_run(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if "loss" in r]
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    return {
        "losses": {r["step"]: r["loss"] for r in train},
        "mem_peak_gib": [r.get("mem_peak_gib") for r in train],
        "checkpoints": sorted(p.name for p in (out / "checkpoints").glob("step_*") if p.is_dir()),
        "wall_time_s": summary.get("wall_time_s"),
    }


def compare(base: dict[int, float], other: dict[int, float], window: int) -> dict:
    steps = sorted(set(base) & set(other))
    if not steps:
        return {"steps_compared": 0}
    last = steps[-window:]
    mb, mo = statistics.fmean(base[s] for s in last), statistics.fmean(other[s] for s in last)
    return {
        "steps_compared": len(steps),
        "first_rel": abs(other[steps[0]] - base[steps[0]]) / abs(base[steps[0]]),
        "mean_rel": abs(mo - mb) / abs(mb),
        "max_rel": max(abs(other[s] - base[s]) / abs(base[s]) for s in steps),
        "all_finite": all(math.isfinite(v) for v in [*base.values(), *other.values()]),
    }


def verdict(variant: str, run: dict, cmp: dict, args, on_cuda: bool, compiled_peak: float | None = None) -> list[str]:
    """What is wrong with one run against its eager run (empty: it agrees); ``compiled_peak``: the last
    ``mem_peak_gib`` of the same model's compiled run without CUDA graphs."""
    first_tol, tol = TOLERANCES.get(variant, (args.first_tol, args.tol))
    bad = []
    if cmp.get("steps_compared", 0) < args.steps:
        bad.append(f"{cmp.get('steps_compared', 0)} of {args.steps} steps logged by both runs")
    elif not cmp["all_finite"]:
        bad.append("a non-finite loss")
    else:
        if cmp["first_rel"] > first_tol:
            bad.append(f"first step's loss {cmp['first_rel']:.2%} from eager's (tolerance {first_tol:.0%})")
        if cmp["mean_rel"] > tol:
            bad.append(f"last {args.window} steps' mean loss {cmp['mean_rel']:.2%} from eager's (tolerance {tol:.0%})")
    if on_cuda and not all(isinstance(m, float) and m > 0 for m in run["mem_peak_gib"]):
        bad.append("mem_peak_gib missing or not positive at a log step")
    if variant == "graphs" and not run["checkpoints"]:
        bad.append("no checkpoint written (checkpoint.async_mode=async_pinned)")
    if on_cuda and variant == "graphs" and compiled_peak and run["mem_peak_gib"][-1] < 0.9 * compiled_peak:
        bad.append(f"mem_peak_gib {run['mem_peak_gib'][-1]:.2f} under CUDA graphs, below the {compiled_peak:.2f} GiB of the "
                   "compiled run without graphs (the graphs' memory pools not counted)")  # fmt: skip
    return bad


def junit_outcomes(xml: Path) -> dict[str, dict]:
    """``{test id: {"outcome": passed | failed | error | skipped, "seconds", "message"}}`` of a pytest
    ``--junitxml`` file (a file pytest never wrote: one ``error`` entry saying so)."""
    import xml.etree.ElementTree as ET

    if not xml.exists():
        return {"(pytest)": {"outcome": "error", "seconds": None, "message": f"no {xml.name}: pytest did not finish"}}
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome, message = ("failed" if tag == "failure" else tag), (node.get("message") or "")[:2000]
                break
        test_id = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        out[test_id] = {"outcome": outcome, "seconds": float(case.get("time") or 0), "message": message}
    return out


def merge_junit(xml: Path, json_path: Path) -> int:
    """Add the tests' outcomes to the curves' JSON; exit 1 if a test did not pass."""
    data = json.loads(json_path.read_text()) if json_path.exists() else {"failed": []}
    data["tests"] = junit_outcomes(xml)
    bad = [t for t, r in data["tests"].items() if r["outcome"] != "passed"]
    data["tests_failed"] = bad
    json_path.write_text(json.dumps(data, indent=1, default=str))
    counts: dict[str, int] = {}
    for r in data["tests"].values():
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    print(f"tests marked gpu: {', '.join(f'{n} {k}' for k, n in sorted(counts.items()))} -> {json_path}")
    for t in bad:
        print(f"  {data['tests'][t]['outcome'].upper()} {t}: {data['tests'][t]['message'][:300]}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--skip", nargs="+", default=[], metavar="MODEL/VARIANT", help="runs of the --models x "
                    "--variants set left out (e.g. vit_b16/compile)")  # fmt: skip
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--window", type=int, default=5, help="last logged steps whose mean loss is compared")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--workers", type=int, default=2, help="data.num_workers of each run")
    ap.add_argument("--first-tol", type=float, default=0.01)
    ap.add_argument("--tol", type=float, default=0.02)
    ap.add_argument("--jobs", type=int, default=6, help="runs at a time")
    ap.add_argument("--timeout", type=float, default=200, help="seconds per run before it is ended")
    ap.add_argument("--deadline", type=float, default=0, help="seconds for all the runs: a run is ended at "
                    "the deadline, one not started by then is not started (default 0: none)")  # fmt: skip
    ap.add_argument("--tiny", action="store_true", help="each family's debug model on the CPU, fp32 "
                    "(this script's own test; the compiled variants still compile)")  # fmt: skip
    ap.add_argument("--compile-backend", default="inductor", choices=("inductor", "aot_eager"),
                    help="train.compile_backend of the compiled variants (aot_eager: the graphs and their "
                    "recompiles without inductor's code generation, for this script's CPU test)")  # fmt: skip
    ap.add_argument("--out-dir", default=None, help="run folders (default: a temporary folder)")
    ap.add_argument("--json", help="write the runs and comparisons here")
    ap.add_argument("--dry-run", action="store_true", help="load every run's config, run nothing")
    ap.add_argument("--merge-junit", metavar="XML", help="add the outcomes of a pytest --junitxml file to "
                    "the existing --json file (tests), run nothing")  # fmt: skip
    args = ap.parse_args(argv)
    if args.merge_junit:
        if not args.json:
            ap.error("--merge-junit needs --json (the file to add the outcomes to)")
        return merge_junit(Path(args.merge_junit), Path(args.json))
    if "eager" not in args.variants:
        ap.error("--variants must include eager (every run is compared with it)")
    runs = plan(args)
    unknown = sorted(set(args.skip) - {f"{m}/{v}" for m in args.models for v in args.variants})
    if unknown:
        ap.error(f"--skip {unknown[0]}: not one of the --models x --variants runs")
    if any((m, "eager") not in runs for m, _ in runs):
        ap.error("--skip leaves a run without its model's eager run (every run is compared with it)")
    from vitscale.config import load_config

    if args.dry_run:
        with tempfile.TemporaryDirectory() as tmp:
            for model, variant in runs:
                path = Path(tmp) / f"{model}-{variant}.yaml"
                path.write_text(yaml.safe_dump(run_config(model, variant, Path(tmp) / path.stem, args)))
                load_config(path)  # unknown keys and bad values fail here
        if "fp8" in args.variants and not args.tiny:
            from vitscale.distributed.float8 import require_torchao

            require_torchao()  # the GPU machine must have it: say so before its time is spent
        print(f"dry run: {len(runs)} runs: {', '.join(f'{m}/{v}' for m, v in runs)}")
        return 0
    root = Path(args.out_dir or tempfile.mkdtemp(prefix="gpu_curves_"))
    deadline = time.monotonic() + args.deadline if args.deadline > 0 else float("inf")

    def launch(run: tuple[str, str]) -> tuple[tuple[str, str], dict]:
        model, variant = run
        out = root / f"{model}-{variant}"
        out.mkdir(parents=True, exist_ok=True)
        (out / "run.yaml").write_text(yaml.safe_dump(run_config(model, variant, out, args)))
        limit = min(args.timeout, deadline - time.monotonic())
        if limit < 10:
            print(f"=== {model}/{variant}: not started (the --deadline is {limit:.0f} s away)", flush=True)
            return run, {"error": "not started before the deadline", "exit": "deadline", "seconds": 0.0}
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "vitscale", "train", str(out / "run.yaml")], cwd=ROOT,
                                  text=True, capture_output=True, timeout=limit)  # fmt: skip
            rc, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            said = [x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr)]
            rc, text = "timeout", f"ended after {limit:.0f} s\n{said[0]}{said[1]}"
        took = time.perf_counter() - t0
        print(f"=== {model}/{variant}: exit {rc} in {took:.0f} s\n" + "\n".join(str(text).splitlines()[-8:]), flush=True)
        if rc != 0:
            return run, {"error": str(text)[-3000:], "exit": rc, "seconds": took}
        return run, {**read_run(out), "seconds": took}

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = dict(pool.map(launch, runs))
    import torch

    on_cuda = torch.cuda.is_available() and not args.tiny
    table, failed = [], []
    for (model, variant), res in results.items():
        if variant == "eager":
            continue
        base = results.get((model, "eager"), {})
        if "losses" not in base or "losses" not in res:
            res["problems"] = ["the run or its eager run failed"]
        else:
            res["vs_eager"] = compare(base["losses"], res["losses"], args.window)
            peaks = results.get((model, "compile"), {}).get("mem_peak_gib") or [None]
            res["problems"] = verdict(variant, res, res["vs_eager"], args, on_cuda, compiled_peak=peaks[-1])
        c = res.get("vs_eager", {})
        table.append(f"{model:16s} {variant:8s} first {c.get('first_rel', float('nan')):8.4%}  "
                     f"last-{args.window} {c.get('mean_rel', float('nan')):8.4%}  max {c.get('max_rel', float('nan')):8.4%}  "
                     f"{'ok' if not res['problems'] else 'FAIL: ' + '; '.join(res['problems'])}")  # fmt: skip
        failed += [f"{model}/{variant}"] if res["problems"] else []
    for (model, variant), res in results.items():
        if variant == "eager" and "error" in res:
            failed.append(f"{model}/eager")
            table.append(f"{model:16s} eager    FAIL: exit {res['exit']}")
    from vitscale.bench.report import git_commit

    out = {
        "settings": vars(args), "torch": torch.__version__, "commit": git_commit(),
        "device": torch.cuda.get_device_name(0) if on_cuda else "cpu",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": {f"{m}/{v}": {**{k: val for k, val in r.items() if k != "losses"},
                              "losses": {str(s): x for s, x in r.get("losses", {}).items()}}
                 for (m, v), r in results.items()},
        "failed": failed,
    }  # fmt: skip
    print("\n".join(["model            variant  loss gap vs eager (first step / last window / largest)", *table]))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {args.json}")
    print("all runs agree with eager" if not failed else f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
