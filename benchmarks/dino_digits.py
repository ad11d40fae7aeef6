"""DINO on the digits: the k-NN top-1 of the pretrained backbone against the same backbone at random
initialisation, and its linear probe. Every run is ``vitscale train`` as a user types it, in a
temporary folder (``train`` of ``benchmarks/mae_digits.py``); the figures are read from its summary.json.

- ``pretrained``: ``vitscale train digits_dino train.seed=SEED``;
- ``init``: ``vitscale train digits_dino train.seed=SEED train.max_steps=1 optim.lr=0`` (one step at
  learning rate 0 leaves the backbone as initialised).

    python benchmarks/dino_digits.py --seeds 0 --json benchmarks/results/dino_digits_cpu_202611.json
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
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
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
    doc["mean"] = {n: {k: statistics.mean(r[k] for r in runs) for k in ("knn_top1", "linear_probe_top1")}
                   for n, runs in doc["runs"].items()}  # fmt: skip
    doc["loadavg_after"] = list(os.getloadavg())
    if args.json:
        write_json(doc, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
