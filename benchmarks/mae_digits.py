"""MAE on the digits: the k-NN top-1 of the pretrained backbone against the same backbone at random
initialisation, its linear probe, and what an MAE step costs against a supervised step of the same
backbone. Every run is ``vitscale train`` as a user types it, in a temporary folder; the figures are
read from its summary.json and metrics.jsonl.

- ``pretrained``: ``vitscale train digits_mae train.seed=SEED`` (600 steps, knn and linear probe at
  the end);
- ``init``: ``vitscale train digits_mae train.seed=SEED train.max_steps=1 optim.lr=0``: one step at
  learning rate 0 leaves the weights as initialised (AdamW's decay is scaled by the learning rate), so
  its evaluations are those of the random initialisation under the same seed;
- step cost: ``digits_vit`` and ``digits_mae`` for ``--cost-steps`` steps each, alternated
  ``--cost-rounds`` times; the median ``img_per_s`` of the log records after step 10 (evaluations and
  checkpoints are not counted in it).

    python benchmarks/mae_digits.py --seeds 0 1 2 --json benchmarks/results/mae_digits_cpu_202611.json \\
        2>&1 | tee benchmarks/results/mae_digits_cpu_202611.log

Every run trains on one thread (``train.cpu_threads: 1``), one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vitscale.bench.report import git_commit, write_json  # noqa: E402

RUNS = {
    "pretrained": ["digits_mae"],
    "init": ["digits_mae", "train.max_steps=1", "optim.lr=0"],
}
QUIET = ["log.progress=none", "log.report=false"]


def train(args: list[str], out: Path) -> tuple[dict, list[dict], float]:
    cmd = [sys.executable, "-m", "vitscale", "train", *args, f"train.output_dir={out}", *QUIET]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return json.loads((out / "summary.json").read_text()), rows, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--cost-steps", type=int, default=60)
    ap.add_argument("--cost-rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    doc: dict = {"benchmark": "mae_digits", "commit": git_commit(), "argv": sys.argv[1:], "loadavg_before": list(os.getloadavg()),
                 "commands": {k: "vitscale train " + " ".join(v) + " train.seed=SEED" for k, v in RUNS.items()},
                 "runs": {k: [] for k in RUNS}}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for name, recipe in RUNS.items():
                summary, rows, wall = train([*recipe, f"train.seed={seed}"], Path(tmp) / f"{name}_{seed}")
                ranks = [r["train_rankme"] for r in rows if "train_rankme" in r]
                res = {"seed": seed, "steps": summary["steps"], "wall_s": wall,
                       **{k: summary[k] for k in ("knn_top1", "knn_top5", "linear_probe_top1")},
                       "train_rankme_first_last_min": [ranks[0], ranks[-1], min(ranks)]}  # fmt: skip
                doc["runs"][name].append(res)
                print(f"{name} seed {seed}: knn_top1 {res['knn_top1']:.2f}%, linear_probe_top1 "
                      f"{res['linear_probe_top1']:.2f}% after {res['steps']} steps, {wall:.0f} s", flush=True)  # fmt: skip
        doc["mean"] = {name: {k: statistics.mean(r[k] for r in runs) for k in ("knn_top1", "linear_probe_top1")}
                       for name, runs in doc["runs"].items()}  # fmt: skip
        doc["stdev"] = {name: {k: statistics.stdev(r[k] for r in runs) if len(runs) > 1 else 0.0
                               for k in ("knn_top1", "linear_probe_top1")} for name, runs in doc["runs"].items()}  # fmt: skip
        cost = {"digits_vit": [], "digits_mae": []}
        steps = [
            f"train.max_steps={args.cost_steps}",
            "train.log_every=5",
            "eval.every=0",
            "checkpoint.every=0",
        ]
        doc["cost_commands"] = {k: f"vitscale train {k} " + " ".join(steps) for k in cost}
        for r in range(args.cost_rounds):
            for name in cost:
                _, rows, _ = train([name, *steps], Path(tmp) / f"cost_{name}_{r}")
                cost[name] += [row["img_per_s"] for row in rows if "img_per_s" in row and row["step"] > 10]
        doc["step_cost"] = {name: {"median_img_per_s": statistics.median(v), "ms_per_step_batch64": 64e3 / statistics.median(v),
                                   "records": len(v)} for name, v in cost.items()}  # fmt: skip
        doc["step_cost"]["mae_over_supervised"] = (doc["step_cost"]["digits_mae"]["ms_per_step_batch64"]
                                                   / doc["step_cost"]["digits_vit"]["ms_per_step_batch64"])  # fmt: skip
    doc["loadavg_after"] = list(os.getloadavg())
    for name in RUNS:
        m, s = doc["mean"][name], doc["stdev"][name]
        print(f"{name}: knn_top1 {m['knn_top1']:.2f} +- {s['knn_top1']:.2f}%, linear_probe_top1 "
              f"{m['linear_probe_top1']:.2f} +- {s['linear_probe_top1']:.2f}% over seeds {args.seeds}")  # fmt: skip
    for name in ("digits_vit", "digits_mae"):
        c = doc["step_cost"][name]
        print(
            f"{name}: {c['ms_per_step_batch64']:.1f} ms per step of 64 images (median {c['median_img_per_s']:.0f} img/s)"
        )
    print(
        f"an MAE step costs {doc['step_cost']['mae_over_supervised']:.2f}x a supervised step of the same backbone"
    )
    if args.json:
        write_json(doc, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
