"""``vitscale bench-data``: the input-pipeline benchmark (vitscale vs torchvision, per CPU core)."""

from __future__ import annotations

import sys

from ..registry import COMMANDS
from . import DefaultsHelpFormatter

HELP = "benchmark JPEG decode + RandomResizedCrop + flip against torchvision (per core)"


def register(subparsers) -> None:
    from vitscale.bench import data_pipeline

    p = subparsers.add_parser(
        "bench-data",
        help=HELP,
        description=data_pipeline.__doc__,
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--images", type=int, default=256, help="number of JPEGs to generate")
    p.add_argument("--size", type=int, default=224, help="output resolution")
    p.add_argument("--batch-size", type=int, default=32, help="images per batch")
    p.add_argument("--rounds", type=int, default=5, help="timed passes per pipeline, alternating")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality of the generated images (1-95)")
    p.add_argument("--out-dir", default="benchmarks/results", help="where the JSON and the raw log go ('' = nowhere)")
    p.set_defaults(func=run)


def run(args) -> int:
    from vitscale.bench.data_pipeline import run as run_benchmark
    from vitscale.bench.data_pipeline import write_results

    given = sys.argv[sys.argv.index("bench-data") + 1 :] if "bench-data" in sys.argv else sys.argv[1:]
    command = "vitscale bench-data " + " ".join(given)
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    log(f"$ {command}")
    result = run_benchmark(args.images, args.size, args.batch_size, args.rounds, args.quality, log=log)
    result["command"] = command
    if args.out_dir:
        js, lg = write_results(result, lines, args.out_dir)
        print(f"wrote {js} and {lg}")
    return 0


COMMANDS.register("bench-data", sys.modules[__name__])
