"""``vitscale bench-data``: the input-pipeline benchmark (vitscale vs torchvision, per CPU core)."""

from __future__ import annotations

from . import DefaultsHelpFormatter


def register(subparsers) -> None:
    from vitscale.data import benchmark

    p = subparsers.add_parser(
        "bench-data",
        help="benchmark JPEG decode + RandomResizedCrop + flip against torchvision (per core)",
        description=benchmark.__doc__,
        formatter_class=DefaultsHelpFormatter,
    )
    benchmark.add_arguments(p)

    def run(args) -> int:
        import sys

        return benchmark.run_from_args(args, command="vitscale " + " ".join(sys.argv[1:]))

    p.set_defaults(func=run)
