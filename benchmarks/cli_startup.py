"""How long the ``vitscale`` command takes to answer ``--help`` (or any arguments): the whole process, its
interpreter start and imports included, timed from outside, N rounds. With ``--baseline-src DIR`` (a
checkout of another commit, e.g. ``git archive 1fc0b9c | tar -x -C /tmp/base``) each round also runs
that tree's ``vitscale`` (``PYTHONPATH=DIR``), alternating, and the ratio of the medians is reported.
Each side's heavy imports (torch, torchvision, numpy) are listed too. Not a test.

    git archive 1fc0b9c | (mkdir -p /tmp/base && tar -x -C /tmp/base)
    python benchmarks/cli_startup.py --rounds 7 --baseline-src /tmp/base --baseline-label 1fc0b9c \
        --json benchmarks/results/cli_startup_cpu_202611.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "torchvision", "numpy", "PIL", "yaml")
PROBE = ("import sys\nfrom vitscale.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
         "print('HEAVY', [m for m in {heavy!r} if m in sys.modules])")  # fmt: skip


def _env(src: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}


def _once(src: Path, args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "vitscale", *args], env=_env(src), cwd=src, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)  # fmt: skip
    return time.perf_counter() - t0


def _heavy(src: Path, args: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *args], env=_env(src), cwd=src,
                         capture_output=True, text=True, check=False).stdout  # fmt: skip
    line = next((x for x in out.splitlines() if x.startswith("HEAVY ")), "HEAVY []")
    return json.loads(line[len("HEAVY "):].replace("'", '"'))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="timed runs per tree (after one untimed warm-up each)")
    ap.add_argument("--args", default="--help", help="the vitscale arguments, one string (default: --help)")
    ap.add_argument("--baseline-src", default=None, help="another source tree to time against, alternating")
    ap.add_argument("--baseline-label", default="baseline", help="what the JSON calls it (e.g. its commit)")
    ap.add_argument("--json", default=None, help="write the result here (and the printed lines beside it, .log)")
    a = ap.parse_args()
    args = a.args.split()
    trees = {"this": REPO}
    if a.baseline_src:
        trees["baseline"] = Path(a.baseline_src).resolve()
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    log(f"$ python benchmarks/cli_startup.py {' '.join(sys.argv[1:])}")
    times: dict[str, list[float]] = {k: [] for k in trees}
    for src in trees.values():
        _once(src, args)  # warm-up: the page cache, .pyc files
    load_before = os.getloadavg()
    for r in range(a.rounds):
        for name, src in trees.items():
            times[name].append(_once(src, args))
        log(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()))
    load_after = os.getloadavg()
    res: dict = {"command": f"python -m vitscale {a.args}", "rounds": a.rounds, "python": sys.version.split()[0],
                 "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in load_after],
                 "cpus": os.cpu_count(), "trees": {}}  # fmt: skip
    for name, src in trees.items():
        med = statistics.median(times[name])
        label = a.baseline_label if name == "baseline" else "this checkout"
        res["trees"][name] = {"tree": label, "median_s": round(med, 3), "min_s": round(min(times[name]), 3),
                              "max_s": round(max(times[name]), 3), "heavy_imports": _heavy(src, args)}  # fmt: skip
        log(f"{name}: median {med:.3f} s (min {min(times[name]):.3f}, max {max(times[name]):.3f}); "
            f"imports {res['trees'][name]['heavy_imports'] or 'none of ' + ', '.join(HEAVY)}")  # fmt: skip
    if "baseline" in trees:
        res["speedup"] = round(res["trees"]["baseline"]["median_s"] / res["trees"]["this"]["median_s"], 1)
        log(f"baseline / this: {res['speedup']}x (load average {load_before[0]:.2f} before, {load_after[0]:.2f} after)")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
        Path(a.json).with_suffix(".log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
