"""Does the loader starve the step? The same training run on a real image folder and on synthetic data.

Two runs of ``Trainer.fit`` (what ``vitscale train`` runs) that differ only in where their images come
from: ``--real`` overrides (an image folder of PNGs, decoded by the run's ``data.num_workers``
workers) and ``--synthetic`` overrides (random images, no decoding), alternating round by round. Each
round is a fresh run of ``--warmup`` + ``--steps`` steps; the wall time of the last ``--steps``
counts, and the main thread's CPU time beside it. The headline is the median of the per-round ratios
real rate / synthetic rate: 1.0 when the workers keep every step fed. ``os.getloadavg()`` is recorded
each round (on a shared machine the workers compete with other processes for the cores).

    python benchmarks/mnist_imagefolder.py data/mnist
    python benchmarks/trainer_data_rate.py --name mnist_png_1worker --rounds 5 --steps 60 --warmup 10 \
        --batch-size 64 --threads 1 --train digits_vit data.num_workers=1 \
        --real data.format=imagefolder data.train_path=data/mnist/train \
        --synthetic data.format=synthetic data.num_classes=10 \
        --json benchmarks/results/trainer_data_rate_cpu_202611.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer_vs_bench import trainer_round  # noqa: E402

from vitscale.bench.report import git_commit, write_json  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True, help="the entry's name in the JSON")
    ap.add_argument("--train", nargs="+", required=True, help="the run's CONFIG and the overrides both sides share")
    ap.add_argument("--real", nargs="+", required=True, help="overrides of the image-folder side")
    ap.add_argument("--synthetic", nargs="+", required=True, help="overrides of the synthetic side")
    ap.add_argument("--batch-size", type=int, required=True, help="train.batch_size")
    ap.add_argument("--threads", type=int, required=True, help="train.cpu_threads")
    ap.add_argument("--steps", type=int, default=60, help="timed steps per round")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first, every round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, the two alternating")
    ap.add_argument("--json", default=None, help="add the result to this JSON file (one entry per --name)")
    args = ap.parse_args(argv)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            load = os.getloadavg()
            res = {}
            for side in ("real", "synthetic") if r % 2 == 0 else ("synthetic", "real"):
                side_args = argparse.Namespace(**{**vars(args), "train": [*args.train, *getattr(args, side)]})
                res[side] = trainer_round(side_args, f"{tmp}/{side}", r)
            res = {"real": res["real"], "synthetic": res["synthetic"], "loadavg": load}
            for unit in ("wall", "cpu"):
                res[f"ratio_{unit}"] = res["synthetic"][f"{unit}_s_per_step"] / res["real"][f"{unit}_s_per_step"]
            rounds.append(res)
            print(f"round {r}: real {1e3 * res['real']['wall_s_per_step']:.1f} ms wall / {1e3 * res['real']['cpu_s_per_step']:.1f} "
                  f"ms CPU, synthetic {1e3 * res['synthetic']['wall_s_per_step']:.1f} / {1e3 * res['synthetic']['cpu_s_per_step']:.1f} "
                  f"ms; real / synthetic rate {res['ratio_wall']:.3f} wall, {res['ratio_cpu']:.3f} CPU; load {load[0]:.1f}",
                  flush=True)  # fmt: skip
    med = {k: statistics.median(r[k] for r in rounds) for k in ("ratio_wall", "ratio_cpu")}
    for side in ("real", "synthetic"):
        med[f"{side}_img_per_wall_s"] = args.batch_size / statistics.median(r[side]["wall_s_per_step"] for r in rounds)
    med["loadavg_median"] = statistics.median(r["loadavg"][0] for r in rounds)
    entry = {**med, "batch_size": args.batch_size, "threads": args.threads, "rounds": rounds, "argv": sys.argv[1:],
             "commit": git_commit(), "torch": torch.__version__}  # fmt: skip
    print(f"{args.name}: real / synthetic = {med['ratio_wall']:.3f} (wall), {med['ratio_cpu']:.3f} (main-thread CPU), "
          f"median of {args.rounds} rounds, load {med['loadavg_median']:.1f}")  # fmt: skip
    if args.json:
        path = Path(args.json)
        doc = json.loads(path.read_text()) if path.exists() else {}
        doc.setdefault("command", "python benchmarks/trainer_data_rate.py (one run per entry: its `argv`)")
        doc.setdefault("entries", {})[args.name] = entry
        write_json(doc, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
