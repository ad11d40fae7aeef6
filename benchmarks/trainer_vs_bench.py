"""The trainer's own overhead: the real training loop on synthetic data against the model step alone,
for the same model, batch and threads.

Two workloads, in one process, alternating round by round (trainer first in even rounds):

- **trainer**: ``Trainer(cfg).fit()`` — what ``vitscale train CONFIG KEY=VALUE ...`` runs — on
  ``data.format=synthetic`` (random images through the training transforms, loaded by the run's
  ``data.num_workers``), with everything a run does per step: the loader's wait and its main-process
  work, the task's loss, gradient clipping, the non-finite check, the schedule, the log steps at
  ``train.log_every``, evaluation and checkpoint scheduling. Each round is a fresh run of
  ``--warmup`` + ``--steps`` steps; the time of the ``--steps`` last ones counts.
- **bench**: the step ``vitscale bench MODEL --device cpu`` times (``vitscale.bench.harness``:
  forward, loss, backward, optimizer step and ``zero_grad`` on one batch kept on the device), the same
  model (``--set`` its config fields), batch and threads; ``--steps`` steps per round after
  ``--warmup`` untimed ones at the start.

For each, per step: wall time, and the CPU time of the main thread (``time.thread_time``). On a
shared machine the wall time moves with the other processes; the main thread's CPU time does much
less, and it is what a step costs the core that runs it (a loader worker's time is on another core).
The headline ratios are medians of the per-round ratios trainer rate / bench rate. The machine's
load (``os.getloadavg()``) is recorded each round.

    python benchmarks/trainer_vs_bench.py --name digits_vit --rounds 5 --steps 50 --warmup 10 \
        --batch-size 64 --threads 1 \
        --train digits_vit data.format=synthetic data.num_classes=10 data.num_workers=1 \
        --bench vit_debug --set patch_dim=4 hidden_size=96 ffn_hidden_size=192 num_attention_heads=4 \
            num_layers=4 pool=avg img_h=32 img_w=32 num_classes=10 \
        --json benchmarks/results/trainer_vs_bench_cpu_202611.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vitscale.bench.harness import BenchSettings, build_impls, with_defaults  # noqa: E402
from vitscale.bench.report import git_commit, write_json  # noqa: E402
from vitscale.config import load_config  # noqa: E402
from vitscale.config.load import parse_override  # noqa: E402
from vitscale.train import fastpath  # noqa: E402
from vitscale.train.trainer import Trainer  # noqa: E402


def trainer_round(args, tmp: str, r: int) -> dict:
    """A fresh run of warmup + steps + 1 steps; wall and main-thread CPU seconds per step over the
    ``steps`` after the warmup: from the start of the first to the start of the one after the last, so
    each counts its own loop work (log records, evaluation and checkpoint scheduling) and none counts
    the run's end (final checkpoint, summary), which is not a step."""
    sets = [*args.train[1:], f"train.output_dir={tmp}/run{r}", f"train.max_steps={args.warmup + args.steps + 1}",
            f"train.batch_size={args.batch_size}", f"train.cpu_threads={args.threads}", "log.progress=none",
            "log.report=false", "log.tensorboard=false", "checkpoint.export_safetensors=false"]  # fmt: skip
    t = Trainer(load_config(args.train[0], sets))
    marks: list[tuple[float, float]] = []
    train_step = t.train_step

    def step(batches):
        marks.append((time.perf_counter(), time.thread_time()))
        return train_step(batches)

    t.train_step = step
    t.fit()
    (w0, c0), (w1, c1) = marks[args.warmup], marks[args.warmup + args.steps]
    return {"wall_s_per_step": (w1 - w0) / args.steps, "cpu_s_per_step": (c1 - c0) / args.steps}


def bench_round(impl, args) -> dict:
    torch.set_num_threads(args.threads)
    with fastpath.sdpa_backend("auto"):
        w0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(args.steps):
            impl.step()
        w1, c1 = time.perf_counter(), time.thread_time()
    impl.release()
    return {"wall_s_per_step": (w1 - w0) / args.steps, "cpu_s_per_step": (c1 - c0) / args.steps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True, help="the entry's name in the JSON")
    ap.add_argument("--train", nargs="+", required=True, help="the run's CONFIG and KEY=VALUE overrides (as vitscale train)")
    ap.add_argument("--bench", required=True, help="the model, as vitscale bench's MODEL")
    ap.add_argument("--set", nargs="*", default=[], help="the model's config fields, as vitscale bench's --set KEY=VALUE")
    ap.add_argument("--batch-size", type=int, required=True, help="images per step, both")
    ap.add_argument("--threads", type=int, required=True, help="torch threads, both (train.cpu_threads)")
    ap.add_argument("--steps", type=int, default=50, help="timed steps per round, each")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first (the trainer: every round)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, the two alternating")
    ap.add_argument("--json", default=None, help="add the result to this JSON file (one entry per --name)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = {".".join(k): v for k, v in map(parse_override, args.set)}  # as vitscale bench --set
    settings = with_defaults(BenchSettings(args.bench, device="cpu", batch_size=args.batch_size, overrides=overrides), "cpu")
    impl = build_impls(settings)[0][0]
    with fastpath.sdpa_backend("auto"):
        for _ in range(args.warmup):
            impl.step()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            load = os.getloadavg()
            order = ("trainer", "bench") if r % 2 == 0 else ("bench", "trainer")
            res = {k: trainer_round(args, tmp, r) if k == "trainer" else bench_round(impl, args) for k in order}
            res = {**{k: res[k] for k in ("trainer", "bench")}, "loadavg": load}
            for unit in ("wall", "cpu"):
                res[f"ratio_{unit}"] = res["bench"][f"{unit}_s_per_step"] / res["trainer"][f"{unit}_s_per_step"]
            rounds.append(res)
            print(f"round {r}: trainer {1e3 * res['trainer']['wall_s_per_step']:.1f} ms wall / "
                  f"{1e3 * res['trainer']['cpu_s_per_step']:.1f} ms CPU, bench {1e3 * res['bench']['wall_s_per_step']:.1f} / "
                  f"{1e3 * res['bench']['cpu_s_per_step']:.1f} ms; trainer / bench rate {res['ratio_wall']:.3f} wall, "
                  f"{res['ratio_cpu']:.3f} CPU; load {load[0]:.1f}", flush=True)  # fmt: skip
    med = {k: statistics.median(r[k] for r in rounds) for k in ("ratio_wall", "ratio_cpu")}
    for who in ("trainer", "bench"):
        for unit in ("wall", "cpu"):
            med[f"{who}_img_per_{unit}_s"] = args.batch_size / statistics.median(r[who][f"{unit}_s_per_step"] for r in rounds)
    med["loadavg_median"] = statistics.median(r["loadavg"][0] for r in rounds)
    entry = {**med, "batch_size": args.batch_size, "threads": args.threads, "rounds": rounds, "argv": sys.argv[1:],
             "commit": git_commit(), "torch": torch.__version__}  # fmt: skip
    print(f"{args.name}: trainer / bench = {med['ratio_wall']:.3f} (wall), {med['ratio_cpu']:.3f} (main-thread CPU), "
          f"median of {args.rounds} rounds, load {med['loadavg_median']:.1f}")  # fmt: skip
    if args.json:
        path = Path(args.json)
        doc = json.loads(path.read_text()) if path.exists() else {}
        doc.setdefault("command", "python benchmarks/trainer_vs_bench.py (one run per entry: its `argv`)")
        doc.setdefault("entries", {})[args.name] = entry
        write_json(doc, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
