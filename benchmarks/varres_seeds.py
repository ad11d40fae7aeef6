"""Variable resolution on the digits against the fixed-size run, over several seeds.

One digits run on 300 validation images moves by whole percentage points from seed to seed (each
image is 0.33 points), so "reaches the fixed-size run's accuracy" is told on the mean of several
seeds, each recipe with the same seeds. Every run is ``vitscale train`` as a user types it, in a
temporary folder; its final figures are read from its summary.json.

Recipes (``--recipes``, default all):

- ``fixed``: ``vitscale train digits_vit`` (32x32 px, the demo);
- ``multi``: ``vitscale train digits_vit 'data.image_sizes=[24,32,40]'`` (a keyed size draw per
  step, batch 64 at every size, evaluation at the largest, 40 px);
- ``progressive``: the same sizes grown in three equal stages (``data.size_schedule=progressive``);
- ``naflex``: ``vitscale train digits_naflex`` (native aspect ratio; its accuracy per sequence length too).

    python benchmarks/varres_seeds.py --seeds 0 1 2 --json benchmarks/results/varres_seeds_cpu_202611.json \
        2>&1 | tee benchmarks/results/varres_seeds_cpu_202611.log
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

RECIPES = {
    "fixed": ["digits_vit"],
    "multi": ["digits_vit", "data.image_sizes=[24,32,40]"],
    "progressive": ["digits_vit", "data.image_sizes=[24,32,40]", "data.size_schedule=progressive"],
    "naflex": ["digits_naflex"],
}


def run(recipe: list[str], seed: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "vitscale", "train", *recipe, f"train.seed={seed}", f"train.output_dir={out}",
           "log.progress=none", "log.report=false"]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    wall = time.perf_counter() - t0
    summary = json.loads((out / "summary.json").read_text())
    keep = {k: v for k, v in summary.items() if k.endswith("_top1")}
    return {"wall_s": wall, "steps": summary["steps"], "img_per_s": summary.get("img_per_s"), **keep}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="train.seed of the runs, every recipe")
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument("--json", default=None, help="write the result here")
    args = ap.parse_args(argv)
    doc: dict = {"benchmark": "varres_seeds", "commit": git_commit(), "seeds": args.seeds,
                 "commands": {k: "vitscale train " + " ".join(f"'{a}'" if "[" in a else a for a in RECIPES[k])
                              + " train.seed=SEED" for k in args.recipes},
                 "loadavg_before": list(os.getloadavg()), "runs": {}, "mean_val_top1": {}, "stdev_val_top1": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:  # seed by seed, every recipe: a machine that slows down slows all alike
            for name in args.recipes:
                res = run(RECIPES[name], seed, Path(tmp) / f"{name}_{seed}")
                doc["runs"].setdefault(name, []).append({"seed": seed, **res})
                extra = ", ".join(f"{k} {v:.2f}" for k, v in res.items() if k.startswith("sizes_"))
                print(f"{name} seed {seed}: val_top1 {res['val_top1']:.2f}% after {res['steps']} steps, "
                      f"{res['wall_s']:.0f} s" + (f" ({extra})" if extra else ""), flush=True)  # fmt: skip
    for name, runs in doc["runs"].items():
        accs = [r["val_top1"] for r in runs]
        doc["mean_val_top1"][name] = statistics.mean(accs)
        doc["stdev_val_top1"][name] = statistics.stdev(accs) if len(accs) > 1 else 0.0
        print(f"{name}: mean val_top1 {doc['mean_val_top1'][name]:.2f} +- {doc['stdev_val_top1'][name]:.2f}% "
              f"over seeds {args.seeds}")  # fmt: skip
    doc["loadavg_after"] = list(os.getloadavg())
    if args.json:
        write_json(doc, Path(args.json))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
