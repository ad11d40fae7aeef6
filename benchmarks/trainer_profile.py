"""Where a training step's time goes in ``vitscale train``: data wait, forward, backward, optimizer and
the trainer's own work, measured with ``torch.profiler`` on the real trainer.

The run is the one ``vitscale train CONFIG KEY=VALUE ...`` would make (built by ``Trainer``, looped by
``Trainer.fit``); this script only names the parts of each step with ``torch.profiler.record_function``
ranges, wrapped around the trainer's components from the outside (nothing in the trainer changes):

- ``data``: waiting for the next batch (``Trainer._batches``: the loader, its main-process work and,
  with workers, the wait for them);
- ``forward``: the task's loss (``task.loss``: forward pass and loss);
- ``backward``: ``Tensor.backward`` (the autograd engine runs on the calling thread on the CPU);
- ``optimizer``: PyTorch's own ``Optimizer.step#...`` and ``Optimizer.zero_grad#...`` ranges;
- the trainer's own work, part by part: ``grad_norm`` (``clip_grad_norm_``), ``nonfinite`` (the
  step's finite flag and counts), ``schedule`` (the learning rate), ``ema``, ``log`` (the record of a
  log step: the read-back, and the metrics logger), ``scheduling`` (whether an evaluation or a
  checkpoint is due), and ``other``: the rest of the step (the loop itself, seeding, batch
  book-keeping, the progress counters) — the step's time minus every named part.

A step is one ``ProfilerStep#`` range (from one ``train_step`` call to the next), so the parts add up
to the step. The first ``--warmup`` steps are not profiled. Profiling costs time of its own (a few
microseconds per operator), so the run is also timed without the profiler: ``unprofiled_ms_per_step``
(median over ``--rounds`` alternating rounds, with the profiled ones).

    python benchmarks/trainer_profile.py --name digits_vit --config digits_vit --steps 40 --warmup 5 \
        --set data.format=synthetic data.num_classes=10 train.batch_size=64 train.cpu_threads=1 \
        --json benchmarks/results/trainer_profile_cpu_202611.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vitscale.bench.report import git_commit, write_json  # noqa: E402
from vitscale.config import load_config  # noqa: E402
from vitscale.train import logstep, metrics  # noqa: E402
from vitscale.train.trainer import Trainer  # noqa: E402

PARTS = ("data", "forward", "backward", "optimizer", "grad_norm", "nonfinite", "schedule", "ema", "log", "scheduling")
OWN = ("grad_norm", "nonfinite", "schedule", "ema", "log", "scheduling", "other")


def _ranged(name: str, fn):
    def wrapped(*a, **kw):
        with record_function(f"vitscale::{name}"):
            return fn(*a, **kw)

    return wrapped


@contextlib.contextmanager
def _named_parts(t: Trainer, on_step):
    """The trainer's parts wrapped in ``vitscale::<part>`` ranges; ``on_step()`` called as each
    ``train_step`` starts (the profiler's step boundary). Undone on exit."""
    undo = []

    def patch(obj, attr, new):
        undo.append((obj, attr, getattr(obj, attr), attr in vars(obj)))
        setattr(obj, attr, new)

    batches = t._batches

    def named_batches():
        it = batches()
        while True:
            with record_function("vitscale::data"):
                batch = next(it)
            yield batch

    train_step = t.train_step

    def step(b):
        on_step()
        return train_step(b)

    patch(t, "_batches", named_batches)
    patch(t, "train_step", step)
    patch(t.task, "loss", _ranged("forward", t.task.loss))
    patch(torch.Tensor, "backward", _ranged("backward", torch.Tensor.backward))
    patch(torch.nn.utils, "clip_grad_norm_", _ranged("grad_norm", torch.nn.utils.clip_grad_norm_))
    patch(t.guard, "flag", _ranged("nonfinite", t.guard.flag))
    patch(t.schedule, "apply", _ranged("schedule", t.schedule.apply))
    if t.ema is not None:
        patch(t.ema, "update", _ranged("ema", t.ema.update))
    patch(logstep.LogStep, "record", _ranged("log", logstep.LogStep.record))
    patch(metrics.MetricsLogger, "log", _ranged("log", metrics.MetricsLogger.log))
    patch(t.evals, "due", _ranged("scheduling", t.evals.due))
    patch(t.checkpoints, "due", _ranged("scheduling", t.checkpoints.due))
    try:
        yield
    finally:
        for obj, attr, old, own in reversed(undo):
            if own or isinstance(obj, type):
                setattr(obj, attr, old)
            else:
                delattr(obj, attr)


def _config(args, out: str):
    sets = [*args.set, f"train.output_dir={out}", f"train.max_steps={args.warmup + args.steps}", "log.progress=none",
            "log.report=false", "log.tensorboard=false", "checkpoint.every=0", "eval.every=0",
            "checkpoint.export_safetensors=false"]  # fmt: skip
    return load_config(args.config, sets)


def _breakdown(prof, steps: int) -> dict:
    """ms per step of each part, from the profile's ranges (top-level ranges of each name only)."""
    ms = dict.fromkeys(PARTS, 0.0)
    step_ms = []
    for e in prof.events():
        name = e.name
        if name.startswith("ProfilerStep"):
            step_ms.append(e.cpu_time_total / 1e3)
        elif name.startswith("vitscale::"):
            part = name.split("::", 1)[1]
            if not any(p.name == name for p in _ancestors(e)):  # a nested range of the same part counts once
                ms[part] += e.cpu_time_total / 1e3
        elif name.startswith("Optimizer.step#") or name.startswith("Optimizer.zero_grad#"):
            ms["optimizer"] += e.cpu_time_total / 1e3
    n = len(step_ms)
    out = {k: v / n for k, v in ms.items()}
    out["step"] = statistics.fmean(step_ms)
    out["other"] = out["step"] - sum(out[p] for p in PARTS)
    out["trainer_own"] = sum(out[p] for p in OWN)
    out["profiled_steps"] = n
    return out


def _ancestors(e):
    p = e.cpu_parent
    while p is not None:
        yield p
        p = p.cpu_parent


def _one_run(args, profiled: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        t = Trainer(_config(args, str(Path(tmp) / "run")))
        starts: list[float] = []
        if not profiled:
            with _timed_steps(t, starts):
                t.fit()
            per = [b - a for a, b in zip(starts[args.warmup:], starts[args.warmup + 1:])]
            return {"ms_per_step": 1e3 * statistics.fmean(per)}
        sched = schedule(wait=max(args.warmup - 1, 0), warmup=1, active=args.steps - 1, repeat=1)
        with profile(activities=[ProfilerActivity.CPU], schedule=sched) as prof:
            with _named_parts(t, prof.step):
                t.fit()
        return _breakdown(prof, args.steps - 1)


@contextlib.contextmanager
def _timed_steps(t: Trainer, starts: list[float]):
    train_step = t.train_step

    def step(b):
        starts.append(time.perf_counter())
        return train_step(b)

    t.train_step = step
    try:
        yield
    finally:
        del t.train_step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True, help="the entry's name in the JSON (e.g. digits_vit)")
    ap.add_argument("--config", default=None, help="built-in config name or YAML (none: the defaults)")
    ap.add_argument("--set", nargs="*", default=[], help="config overrides, as vitscale train takes them")
    ap.add_argument("--steps", type=int, default=40, help="profiled steps per round")
    ap.add_argument("--warmup", type=int, default=5, help="steps before them, not profiled")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of (profiled, unprofiled) runs, alternating")
    ap.add_argument("--json", default=None, help="add the result to this JSON file (one entry per --name)")
    args = ap.parse_args(argv)
    rounds, plain = [], []
    for r in range(args.rounds):
        for profiled in ((True, False) if r % 2 == 0 else (False, True)):
            res = _one_run(args, profiled)
            (rounds if profiled else plain).append(res)
            print(f"round {r} {'profiled' if profiled else 'unprofiled'}: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in res.items() if isinstance(v, float)), flush=True)  # fmt: skip
    keys = [k for k in rounds[0] if isinstance(rounds[0][k], float)]
    med = {k: statistics.median(r[k] for r in rounds) for k in keys}
    cfg = _config(args, "unused")
    entry = {
        "config": args.config, "overrides": args.set, "batch_size": cfg.train.batch_size,
        "threads": torch.get_num_threads(), "ms_per_step": med,
        "share_of_step": {k: med[k] / med["step"] for k in (*PARTS, "other", "trainer_own")},
        "unprofiled_ms_per_step": statistics.median(p["ms_per_step"] for p in plain),
        "rounds": rounds, "unprofiled_rounds": [p["ms_per_step"] for p in plain],
        "loadavg": os.getloadavg(),
    }  # fmt: skip
    print(json.dumps({args.name: entry}, indent=2))
    if args.json:
        path = Path(args.json)
        doc = json.loads(path.read_text()) if path.exists() else {}
        doc.setdefault("command", "python benchmarks/trainer_profile.py (one run per entry: its `argv`)")
        doc.setdefault("entries", {})[args.name] = {"argv": sys.argv[1:], "commit": git_commit(), "torch": torch.__version__,
                                                    **entry}  # fmt: skip
        write_json(doc, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
