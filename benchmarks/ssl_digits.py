"""What the self-supervised digits benchmarks share (``mae_digits.py``, ``dino_digits.py``): a
``vitscale train`` run as a user types it, in a temporary folder, read back from its summary.json and
metrics.jsonl; the seed loop of the pretrained backbone against the same backbone at random
initialisation (``train.max_steps=1 optim.lr=0``: one step at learning rate 0 leaves the weights as
initialised, AdamW's decay being scaled by the learning rate); the step cost against the supervised
``digits_vit`` (``--cost-steps`` steps each, alternated ``--cost-rounds`` times, the median
``img_per_s`` of the log records after step 10); and the JSON they write. ``--jobs N`` runs N runs of
the seed loop at once (their wall times then share the machine)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vitscale.bench.report import git_commit, write_json  # noqa: E402

QUIET = ["log.progress=none", "log.report=false"]


def scores(summary: dict) -> dict:
    """The k-NN and probe figures of a run's summary (every ``knn*`` / ``linear_probe*`` top-1 / top-5)."""
    return {k: v for k, v in summary.items()
            if k.startswith(("knn", "linear_probe")) and k.endswith(("_top1", "_top5")) and isinstance(v, (int, float))}  # fmt: skip


def train(args: list[str], out: Path, cwd: Path = ROOT, env: dict | None = None) -> tuple[dict, list[dict], float]:
    """``vitscale train ARGS`` into ``out``, run in ``cwd`` (with ``env``, else this process's
    environment): its summary, its metrics rows and its wall time (s)."""
    cmd = [sys.executable, "-m", "vitscale", "train", *args, f"train.output_dir={out}", *QUIET]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=cwd, env=env)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return json.loads((out / "summary.json").read_text()), rows, wall


def _step_cost(config: str, label: str, steps: int, rounds: int, tmp: Path, doc: dict) -> None:
    args = [f"train.max_steps={steps}", "train.log_every=5", "eval.every=0", "checkpoint.every=0"]
    cost: dict[str, list[float]] = {"digits_vit": [], config: []}
    doc["cost_commands"] = {k: "vitscale train " + " ".join([k, *args, *QUIET]) for k in cost}
    for r in range(rounds):
        for name in cost:
            _, rows, _ = train([name, *args], tmp / f"cost_{name}_{r}")
            cost[name] += [row["img_per_s"] for row in rows if "img_per_s" in row and row["step"] > 10]
    doc["step_cost"] = {n: {"median_img_per_s": statistics.median(v), "ms_per_step_batch64": 64e3 / statistics.median(v),
                            "records": len(v)} for n, v in cost.items()}  # fmt: skip
    ratio = (
        doc["step_cost"][config]["ms_per_step_batch64"]
        / doc["step_cost"]["digits_vit"]["ms_per_step_batch64"]
    )
    doc["step_cost"][f"{label}_over_supervised"] = ratio
    for name in cost:
        c = doc["step_cost"][name]
        print(
            f"{name}: {c['ms_per_step_batch64']:.1f} ms per step of 64 images (median {c['median_img_per_s']:.0f} img/s)"
        )
    print(f"one {label.upper()} step costs {ratio:.2f}x a supervised step of the same backbone", flush=True)


def run_benchmark(description: str, config: str, label: str, per_run: Callable[[list[dict]], dict], *,
                  seeds: list[int], cost_steps: int, cost_rounds: int, argv: list[str] | None = None,
                  extra: tuple[str, ...] = (), after: Callable[[Path], dict] | None = None) -> int:  # fmt: skip
    """The command line of a digits benchmark of ``config`` (``--seeds``, ``--cost-steps``,
    ``--cost-rounds``, ``--json``; the defaults given): the seed loop, the step cost, the JSON.
    ``per_run(rows)``: what a run adds to its record from its metrics rows (its health signals);
    ``extra``: overrides every run of the seed loop takes; ``after(run folder)``: what a pretrained run
    adds to its record from its folder (e.g. an evaluation of its checkpoint)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--seeds", type=int, nargs="*", default=seeds)
    ap.add_argument("--cost-steps", type=int, default=cost_steps)
    ap.add_argument("--cost-rounds", type=int, default=cost_rounds)
    ap.add_argument("--json", default=None)
    ap.add_argument("--jobs", type=int, default=1, help="runs of the seed loop at once (each on its recipe's train.cpu_threads)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: run at least 1 at a time")
    runs = {"pretrained": [config, *extra], "init": [config, "train.max_steps=1", "optim.lr=0", *extra]}
    doc: dict = {"benchmark": f"{label}_digits", "commit": git_commit(), "argv": sys.argv[1:], "loadavg_before": list(os.getloadavg()),
                 "commands": {k: "vitscale train " + " ".join([*v, *QUIET]) + " train.seed=SEED" for k, v in runs.items()},
                 "jobs": args.jobs, "runs": {k: [] for k in runs}}  # fmt: skip

    def one(name: str, seed: int, tmp: Path) -> dict:
        summary, rows, wall = train([*runs[name], f"train.seed={seed}"], tmp / f"{name}_{seed}")
        res = {"seed": seed, "steps": summary["steps"], "wall_s": wall, **scores(summary), **per_run(rows)}
        if after is not None and name == "pretrained":
            res.update(after(tmp / f"{name}_{seed}"))
        print(f"{name} seed {seed}: knn_top1 {res['knn_top1']:.2f}%, linear_probe_top1 "
              f"{res['linear_probe_top1']:.2f}% after {res['steps']} steps, {wall:.0f} s", flush=True)  # fmt: skip
        return res

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [(name, pool.submit(one, name, seed, Path(tmp))) for seed in args.seeds for name in runs]
        for name, future in futures:  # in seed order, whichever finishes first
            doc["runs"][name].append(future.result())
        if args.cost_rounds:
            _step_cost(config, label, args.cost_steps, args.cost_rounds, Path(tmp), doc)
    done = {n: r for n, r in doc["runs"].items() if r}
    keys = {n: [k for k in rs[0] if k.endswith("_top1") and all(k in r for r in rs)] for n, rs in done.items()}
    doc["mean"] = {n: {k: statistics.mean(r[k] for r in rs) for k in keys[n]} for n, rs in done.items()}
    doc["stdev"] = {n: {k: statistics.stdev(r[k] for r in rs) if len(rs) > 1 else 0.0 for k in keys[n]}
                    for n, rs in done.items()}  # fmt: skip
    doc["loadavg_after"] = list(os.getloadavg())
    for name in done:
        m, s = doc["mean"][name], doc["stdev"][name]
        print(f"{name} over seeds {args.seeds}: " + ", ".join(f"{k} {m[k]:.2f} +- {s[k]:.2f}%" for k in m))
    if args.json:
        write_json(doc, args.json)
    return 0
