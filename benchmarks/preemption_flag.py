"""What the per-step agreement of save-on-signal costs (``checkpoint.save_on_signal``,
:mod:`vitscale.train.preemption`): one all-reduce (maximum) of a 4-byte CPU tensor on a gloo group of
its own, per step, on every rank. Measured on N local gloo processes, each "step" a fixed piece of
CPU work (``--work-ms``): the step time with no agreement, with a blocking all-reduce per step (the
plain scheme) and with vitscale's pipelined one (launched after a step, read after the next), in
interleaved rounds; medians, the load average recorded. Not a test.

    python benchmarks/preemption_flag.py --ranks 2 --steps 500 --rounds 7 --work-ms 2 --json benchmarks/results/preemption_flag_cpu_202611.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp


def _work(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:  # the step's own work (holds the core, as a CPU step or a GPU launch loop)
        pass


def _worker(rank: int, world: int, port: int, steps: int, rounds: int, work_ms: float, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import torch.distributed as dist

    from vitscale.train.preemption import Preemption

    dist.init_process_group("gloo")
    pipelined = Preemption(["SIGTERM", "SIGUSR1", "SIGINT"])
    blocking_group = dist.new_group(backend="gloo")
    flag = torch.zeros(1, dtype=torch.int32)

    def blocking() -> int:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=blocking_group)
        return int(flag[0])

    schemes = {"none": lambda: 0, "blocking": blocking, "pipelined": pipelined.agreed}
    out = {k: [] for k in schemes}
    names = list(schemes)
    for i in range(rounds):
        for name in names[i % 3:] + names[: i % 3]:  # rotated: no scheme always first after the barrier
            agree = schemes[name]
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                _work(work_ms)
                agree()
            out[name].append((time.perf_counter() - t0) / steps)
        pipelined._settle()
    queue.put((rank, out))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work-ms", type=float, default=2.0, help="CPU work per step")
    ap.add_argument("--json", default=None)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    if args.dry_run:
        print(f"dry run: {vars(args)}")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    load = [os.getloadavg()]
    procs = [ctx.Process(target=_worker, args=(r, args.ranks, port, args.steps, args.rounds, args.work_ms, queue)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    load.append(os.getloadavg())
    per_rank = {r: {k: statistics.median(v) * 1e6 for k, v in res.items()} for r, res in results.items()}
    res = {
        "ranks": args.ranks, "steps_per_round": args.steps, "rounds": args.rounds, "work_ms_per_step": args.work_ms,
        "backend": "gloo (localhost TCP)",
        "step_us_median": {str(r): {k: round(x, 1) for k, x in v.items()} for r, v in per_rank.items()},
        "added_us_per_step_worst_rank": {k: round(max(v[k] - v["none"] for v in per_rank.values()), 1)
                                          for k in ("blocking", "pipelined")},
        "all_us": {str(r): {k: [round(x * 1e6, 1) for x in v] for k, v in res.items()} for r, res in results.items()},
        "loadavg_before_after": [list(x) for x in load], "cpu_count": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
        "command": f"python benchmarks/preemption_flag.py --ranks {args.ranks} --steps {args.steps} --rounds {args.rounds} "
                   f"--work-ms {args.work_ms}",
    }  # fmt: skip
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
