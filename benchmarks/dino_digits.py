"""DINO on the digits: the k-NN top-1 of the pretrained backbone against the same backbone at random
initialisation, and its linear probe. Every run is ``vitscale train`` as a user types it, in a
temporary folder (``train`` of ``benchmarks/mae_digits.py``); the figures are read from its summary.json.

- ``pretrained``: ``vitscale train digits_dino train.seed=SEED``;
- ``init``: ``vitscale train digits_dino train.seed=SEED train.max_steps=1 optim.lr=0`` (one step at
  learning rate 0 leaves the backbone as initialised);
- step cost (``--cost-rounds`` > 0): ``digits_vit`` and ``digits_dino`` for ``--cost-steps`` steps each,
  alternated; the median ``img_per_s`` of the log records after step 10.

    python benchmarks/dino_digits.py --seeds 0 --json benchmarks/results/dino_digits_cpu_202611.json
    python benchmarks/dino_digits.py --seeds --cost-rounds 2 --json benchmarks/results/dino_step_cost_cpu_202611.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mae_digits import QUIET, ROOT, train  # noqa: E402

sys.path.insert(0, str(ROOT))
from vitscale.bench.report import git_commit, write_json  # noqa: E402

RUNS = {"pretrained": ["digits_dino"], "init": ["digits_dino", "train.max_steps=1", "optim.lr=0"]}
SIGNALS = ("train_rankme", "train_teacher_entropy", "train_teacher_kl_uniform")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--cost-steps", type=int, default=40)
    ap.add_argument("--cost-rounds", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    doc: dict = {"benchmark": "dino_digits", "commit": git_commit(), "argv": sys.argv[1:], "loadavg_before": list(os.getloadavg()),
                 "commands": {k: "vitscale train " + " ".join([*v, *QUIET]) + " train.seed=SEED" for k, v in RUNS.items()},
                 "runs": {k: [] for k in RUNS}}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for name, recipe in RUNS.items():
                summary, rows, wall = train([*recipe, f"train.seed={seed}"], Path(tmp) / f"{name}_{seed}")
                res = {"seed": seed, "steps": summary["steps"], "wall_s": wall,
                       **{k: summary[k] for k in ("knn_top1", "knn_top5", "linear_probe_top1")},
                       "signals_first_last": {s: [r[s] for r in rows if s in r][:: max(len(rows) - 1, 1)] for s in SIGNALS}}  # fmt: skip
                doc["runs"][name].append(res)
                print(f"{name} seed {seed}: knn_top1 {res['knn_top1']:.2f}%, linear_probe_top1 "
                      f"{res['linear_probe_top1']:.2f}% after {res['steps']} steps, {wall:.0f} s", flush=True)  # fmt: skip
        if args.cost_rounds:
            steps = [f"train.max_steps={args.cost_steps}", "train.log_every=5", "eval.every=0", "checkpoint.every=0"]
            cost: dict[str, list[float]] = {"digits_vit": [], "digits_dino": []}
            doc["cost_commands"] = {k: "vitscale train " + " ".join([k, *steps, *QUIET]) for k in cost}
            for r in range(args.cost_rounds):
                for name in cost:
                    _, rows, _ = train([name, *steps], Path(tmp) / f"cost_{name}_{r}")
                    cost[name] += [row["img_per_s"] for row in rows if "img_per_s" in row and row["step"] > 10]
            doc["step_cost"] = {n: {"median_img_per_s": statistics.median(v), "ms_per_step_batch64": 64e3 / statistics.median(v),
                                    "records": len(v)} for n, v in cost.items()}  # fmt: skip
            doc["step_cost"]["dino_over_supervised"] = (doc["step_cost"]["digits_dino"]["ms_per_step_batch64"]
                                                        / doc["step_cost"]["digits_vit"]["ms_per_step_batch64"])  # fmt: skip
            print(f"a DINO step costs {doc['step_cost']['dino_over_supervised']:.2f}x a supervised step", flush=True)
    doc["mean"] = {n: {k: statistics.mean(r[k] for r in runs) for k in ("knn_top1", "linear_probe_top1")}
                   for n, runs in doc["runs"].items() if runs}  # fmt: skip
    doc["loadavg_after"] = list(os.getloadavg())
    if args.json:
        write_json(doc, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
