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

``--variant NAME='CONFIG KEY=VALUE ...'`` adds a recipe of your own (run after the built-in ones
named by ``--recipes``), e.g. ``--variant "multi_eval32=digits_vit data.image_sizes=[24,32,40]
data.eval_image_size=32"``. ``--append`` adds this invocation's runs to the ``--json`` file's (a
recipe and seed run again replaces the old run) and takes the means over all of them; each
invocation's commit, arguments and load are kept under ``invocations``.

    python benchmarks/varres_seeds.py --seeds 0 1 2 --json benchmarks/results/varres_seeds_cpu_202611.json \
        2>&1 | tee benchmarks/results/varres_seeds_cpu_202611.log

Every run trains on one thread (``train.cpu_threads: 1`` in both configs), so ``--jobs 2`` runs two at
a time on two cores: the accuracies are those of one at a time (a run's numbers do not depend on the
machine's load), only the wall times are not comparable then.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
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
    ap.add_argument("--recipes", nargs="*", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument("--variant", action="append", default=[], metavar="NAME='CONFIG KEY=VALUE ...'",
                    help="another recipe: a name, '=', the config and overrides (repeatable)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (>1: the wall times are not comparable)")
    ap.add_argument("--json", default=None, help="write the result here")
    ap.add_argument("--append", action="store_true", help="add to the runs already in --json (see above)")
    args = ap.parse_args(argv)
    recipes = {name: RECIPES[name] for name in args.recipes}
    for spec in args.variant:
        name, sep, words = spec.partition("=")
        recipe = shlex.split(words)  # quotes keep a value with spaces together
        if not sep or not name or not recipe:
            ap.error(f"--variant {spec!r}: expected NAME='CONFIG KEY=VALUE ...'")
        recipes[name] = recipe
    commands = {k: f"vitscale train {shlex.join(recipe)} train.seed=SEED" for k, recipe in recipes.items()}
    this = {"commit": git_commit(), "argv": sys.argv[1:], "seeds": args.seeds, "jobs": args.jobs,
            "commands": commands, "loadavg_before": list(os.getloadavg())}  # fmt: skip
    doc: dict = {"benchmark": "varres_seeds", "invocations": [], "commands": {}, "runs": {}}
    if args.append and args.json and Path(args.json).exists():
        doc = json.loads(Path(args.json).read_text())
    doc["invocations"].append(this)
    doc["commands"].update(commands)
    # seed by seed, every recipe: a machine that slows down slows all alike
    todo = [(seed, name) for seed in args.seeds for name in recipes]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = pool.map(lambda job: run(recipes[job[1]], job[0], Path(tmp) / f"{job[1]}_{job[0]}"), todo)
        for (seed, name), res in zip(todo, results):  # in the order of todo
            kept = [r for r in doc["runs"].get(name, []) if r["seed"] != seed]
            doc["runs"][name] = sorted([*kept, {"seed": seed, **res}], key=lambda r: r["seed"])
            extra = ", ".join(f"{k} {v:.2f}" for k, v in res.items() if k.startswith("sizes_"))
            print(f"{name} seed {seed}: val_top1 {res['val_top1']:.2f}% after {res['steps']} steps, "
                  f"{res['wall_s']:.0f} s" + (f" ({extra})" if extra else ""), flush=True)  # fmt: skip
    doc["mean_val_top1"], doc["stdev_val_top1"] = {}, {}
    for name, runs in doc["runs"].items():
        accs = [r["val_top1"] for r in runs]
        doc["mean_val_top1"][name] = statistics.mean(accs)
        doc["stdev_val_top1"][name] = statistics.stdev(accs) if len(accs) > 1 else 0.0
        print(f"{name}: mean val_top1 {doc['mean_val_top1'][name]:.2f} +- {doc['stdev_val_top1'][name]:.2f}% "
              f"over seeds {[r['seed'] for r in runs]}")  # fmt: skip
    this["loadavg_after"] = list(os.getloadavg())
    if args.json:
        write_json(doc, Path(args.json))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
