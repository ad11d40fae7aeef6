"""Feature distillation on the digits, over seeds: does a student distilled from two teachers keep each
teacher's own strength, and does it beat the same student distilled from either teacher alone?
Every run is ``vitscale train`` / ``vitscale eval`` as a user types it, in a folder of its seed (the
recipes' own ``runs/...`` output folders), read back from its summary.json or its ``--output`` file.

Per seed S, one run at a time:

- teachers, their recipes as shipped: ``vitscale train digits_vit train.seed=S`` (supervised: its val
  top-1, and its k-NN and linear probe by ``vitscale eval runs/digits_vit/config.yaml
  checkpoint.path=runs/digits_vit evals=[...]`` with the frozen-backbone evaluations a
  ``feature_distill`` run gets, ``vitscale.tasks.health.frozen_backbone_evals``) and ``vitscale train
  digits_mae train.seed=S`` (self-supervised: its k-NN and linear probe at the end of its run);
- ``both``: ``vitscale train digits_distill train.seed=S`` (the recipe as shipped: both teachers);
- ``supervised_only`` / ``mae_only``: the same with ``distill.teachers`` of one entry, the recipe's own
  entry for that teacher (``distill.teachers=[{name: supervised, path: runs/digits_vit}]``);
- ``init``: the same student at random initialisation, ``vitscale train digits_distill train.seed=S
  train.max_steps=1 optim.lr=0`` (one step at learning rate 0 leaves the weights as initialised, AdamW's
  decay being scaled by the learning rate), scored by ``vitscale eval runs/student_init/config.yaml
  checkpoint.path=runs/student_init`` (its default evaluations: k-NN and linear probe).

``--student-steps N`` gives every distilled student (``both``, ``supervised_only``, ``mae_only``) the same
``train.max_steps=N`` (the JSON says so); the teachers always train as their recipes ship.

The criteria (docs/distillation.md; on the means over the seeds, each seed's outcome listed beside):

1. ``both`` within 2 points of the supervised teacher on its own strength: its linear-probe top-1 >= the
   teacher's val top-1 - 2, and its k-NN top-1 >= the teacher's k-NN top-1 - 2;
2. ``both`` within 2 points of the MAE teacher's k-NN top-1;
3. ``both`` beats ``supervised_only`` on the MAE teacher's measure (k-NN top-1), and ``mae_only`` on the
   supervised teacher's (linear-probe top-1 and k-NN top-1).

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/distill_digits.py --seeds 0 1 2 \\
        --json benchmarks/results/distill_digits_cpu_202612.json 2>&1 | tee benchmarks/results/distill_digits_cpu_202612.log

Every run trains on one thread (``train.cpu_threads: 1`` in each recipe).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ssl_digits import QUIET, ROOT, scores, train  # noqa: E402

from vitscale.bench.report import git_commit, write_json  # noqa: E402
from vitscale.config import load_config  # noqa: E402
from vitscale.tasks.health import frozen_backbone_evals  # noqa: E402

MARGIN = 2.0  # points: "at least the teacher's figure minus 2 points" (vitscale issue 48, item 6)
STUDENTS = {  # side -> the overrides of `vitscale train digits_distill` beside train.seed (the recipe's own entries)
    "both": [],
    "supervised_only": ["distill.teachers=[{name: supervised, path: runs/digits_vit}]"],
    "mae_only": ["distill.teachers=[{name: mae, path: runs/digits_mae}]"],
}


def evaluate(config: str, run: str, cwd: Path, extra: list[str] | None = None) -> tuple[dict, float]:
    """``vitscale eval CONFIG checkpoint.path=RUN EXTRA`` in ``cwd``: its figures and its wall time (s)."""
    out = cwd / f"{Path(run).name}_eval.json"
    cmd = [sys.executable, "-m", "vitscale", "eval", config, f"checkpoint.path={run}", *(extra or []), "--output", str(out)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=cwd, env=_env())
    return scores(json.loads(out.read_text())), time.perf_counter() - t0


def _env() -> dict:
    """The environment of a run in a seed's folder: this checkout's vitscale first on the path."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def one_seed(seed: int, work: Path, student_steps: int | None) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    s = f"train.seed={seed}"
    steps = [f"train.max_steps={student_steps}"] if student_steps else []
    res: dict = {"seed": seed}

    def run(side: str, args: list[str], out: str) -> dict:
        summary, _, wall = train(args, work / out, cwd=work, env=_env())
        named = [] if out.startswith("runs/digits_") else [f"train.output_dir={out}"]  # else the recipe's own folder
        rec = {"command": "vitscale train " + " ".join([*args, *named, *QUIET]), "steps": summary["steps"], "wall_s": wall,
               **scores(summary)}  # fmt: skip
        if "val_top1" in summary:
            rec["val_top1"] = summary["val_top1"]
        res[side] = rec
        return rec

    t = run("teacher_supervised", ["digits_vit", s], "runs/digits_vit")
    knn_evals = json.dumps(frozen_backbone_evals(load_config("digits_distill")))  # as the students are evaluated
    figures, wall = evaluate("runs/digits_vit/config.yaml", "runs/digits_vit", work, [f"evals={knn_evals}"])
    t.update(figures, eval_wall_s=wall, eval_command=f"vitscale eval runs/digits_vit/config.yaml "
             f"checkpoint.path=runs/digits_vit 'evals={knn_evals}'")  # fmt: skip
    print(f"seed {seed} supervised teacher: val_top1 {t['val_top1']:.2f}%, knn_top1 {t['knn_top1']:.2f}%, "
          f"linear_probe_top1 {t['linear_probe_top1']:.2f}%, {t['wall_s']:.0f} s + eval {wall:.0f} s", flush=True)  # fmt: skip
    t = run("teacher_mae", ["digits_mae", s], "runs/digits_mae")
    print(f"seed {seed} MAE teacher: knn_top1 {t['knn_top1']:.2f}%, linear_probe_top1 {t['linear_probe_top1']:.2f}%, "
          f"{t['wall_s']:.0f} s", flush=True)  # fmt: skip
    for side, extra in STUDENTS.items():
        t = run(side, ["digits_distill", s, *steps, *extra], f"runs/student_{side}")
        print(f"seed {seed} student {side}: knn_top1 {t['knn_top1']:.2f}%, linear_probe_top1 "
              f"{t['linear_probe_top1']:.2f}% after {t['steps']} steps, {t['wall_s']:.0f} s", flush=True)  # fmt: skip
    t = run("init", ["digits_distill", s, "train.max_steps=1", "optim.lr=0"], "runs/student_init")
    trained = {k: t.pop(k) for k in [k for k in t if k.startswith(("knn", "linear_probe"))]}
    figures, wall = evaluate("runs/student_init/config.yaml", "runs/student_init", work)
    t.update(figures, eval_wall_s=wall, in_training_run=trained,
             eval_command="vitscale eval runs/student_init/config.yaml checkpoint.path=runs/student_init")  # fmt: skip
    print(f"seed {seed} student at random init: knn_top1 {t['knn_top1']:.2f}%, linear_probe_top1 "
          f"{t['linear_probe_top1']:.2f}% (vitscale eval; the 1-step run's own evaluation: knn_top1 "
          f"{trained.get('knn_top1', float('nan')):.2f}%, linear_probe_top1 {trained.get('linear_probe_top1', float('nan')):.2f}%)",
          flush=True)  # fmt: skip
    return res


FIGURES = {  # side -> the figures of the table
    "teacher_supervised": ["val_top1", "knn_top1", "linear_probe_top1"],
    "teacher_mae": ["knn_top1", "linear_probe_top1"],
    "both": ["knn_top1", "linear_probe_top1"],
    "supervised_only": ["knn_top1", "linear_probe_top1"],
    "mae_only": ["knn_top1", "linear_probe_top1"],
    "init": ["knn_top1", "linear_probe_top1"],
}
CRITERIA = [  # (name, student figure, reference side, reference figure, margin): student >= reference - margin (> with 0)
    ("both linear_probe_top1 >= supervised teacher val_top1 - 2", "linear_probe_top1", "teacher_supervised", "val_top1", MARGIN),
    ("both knn_top1 >= supervised teacher knn_top1 - 2", "knn_top1", "teacher_supervised", "knn_top1", MARGIN),
    ("both knn_top1 >= MAE teacher knn_top1 - 2", "knn_top1", "teacher_mae", "knn_top1", MARGIN),
    ("both knn_top1 > supervised_only knn_top1 (the MAE teacher's measure)", "knn_top1", "supervised_only", "knn_top1", 0.0),
    ("both linear_probe_top1 > mae_only linear_probe_top1 (the supervised teacher's top-1)", "linear_probe_top1",
     "mae_only", "linear_probe_top1", 0.0),
    ("both knn_top1 > mae_only knn_top1 (the supervised teacher's k-NN)", "knn_top1", "mae_only", "knn_top1", 0.0),
]  # fmt: skip


def verdict(student: float, ref: float, margin: float) -> bool:
    return student >= ref - margin if margin else student > ref


def summarise(doc: dict) -> None:
    seeds = doc["seeds"]
    doc["mean"], doc["stdev"], doc["per_seed"] = {}, {}, {}
    for side, figs in FIGURES.items():
        vals = {f: [s[side][f] for s in seeds] for f in figs}
        doc["per_seed"][side] = vals
        doc["mean"][side] = {f: statistics.mean(v) for f, v in vals.items()}
        doc["stdev"][side] = {f: statistics.stdev(v) if len(v) > 1 else 0.0 for f, v in vals.items()}
        doc["mean"][side]["wall_s"] = statistics.mean(s[side]["wall_s"] for s in seeds)
    doc["criteria"] = []
    for name, fig, ref_side, ref_fig, margin in CRITERIA:
        student, ref = doc["mean"]["both"][fig], doc["mean"][ref_side][ref_fig]
        per_seed = [verdict(s["both"][fig], s[ref_side][ref_fig], margin) for s in seeds]
        doc["criteria"].append({"criterion": name, "student_mean": student, "reference_mean": ref,
                                "difference": student - ref, "margin": margin, "pass": verdict(student, ref, margin),
                                "pass_per_seed": per_seed})  # fmt: skip
    doc["all_pass"] = all(c["pass"] for c in doc["criteria"])


def table(doc: dict) -> str:
    lines = ["| side | " + " | ".join(["val top-1", "k-NN top-1", "linear probe top-1", "wall s (mean)"]) + " |",
             "|---|---|---|---|---|"]  # fmt: skip
    for side in FIGURES:
        m, s = doc["mean"][side], doc["stdev"][side]
        cell = [f"{m[f]:.2f} ± {s[f]:.2f}" if f in m else "" for f in ("val_top1", "knn_top1", "linear_probe_top1")]
        lines.append(f"| {side} | " + " | ".join([*cell, f"{m['wall_s']:.0f}"]) + " |")
    lines.append("")
    for c in doc["criteria"]:
        lines.append(f"{'PASS' if c['pass'] else 'FAIL'}: {c['criterion']}: {c['student_mean']:.2f} vs "
                     f"{c['reference_mean']:.2f} ({c['difference']:+.2f}); per seed "
                     + " / ".join("pass" if p else "fail" for p in c["pass_per_seed"]))  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--student-steps", type=int, default=None,
                    help="train.max_steps of every distilled student (default: the recipe's, 20 epochs)")  # fmt: skip
    ap.add_argument("--work", default=None, help="folder of the runs (default: a temporary one, removed)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.student_steps is not None and args.student_steps < 1:
        ap.error(f"--student-steps {args.student_steps}: at least 1")
    doc: dict = {"benchmark": "distill_digits", "commit": git_commit(), "argv": sys.argv[1:],
                 "loadavg_before": list(os.getloadavg()), "student_steps": args.student_steps or "the recipe's",
                 "student_overrides": STUDENTS, "margin_points": MARGIN, "seeds": []}  # fmt: skip
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        for seed in args.seeds:
            doc["seeds"].append(one_seed(seed, work / f"seed_{seed}", args.student_steps))
            print(f"seed {seed} done, {time.perf_counter() - t0:.0f} s so far", flush=True)
    doc["wall_s_total"] = time.perf_counter() - t0
    doc["loadavg_after"] = list(os.getloadavg())
    summarise(doc)
    print(f"\nseeds {args.seeds}, mean ± std (%), {doc['wall_s_total']:.0f} s in all:")
    print(table(doc))
    print("all criteria met" if doc["all_pass"] else "NOT all criteria met")
    if args.json:
        write_json(doc, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
