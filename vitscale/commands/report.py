"""``vitscale report RUN_DIR [RUN_DIR ...]``: the HTML report of a run, or of several runs overlaid."""

from __future__ import annotations

import sys
from pathlib import Path

from ..registry import COMMANDS
from . import HelpFormatter

DEFAULT_COMPARISON = "report.html"

EPILOG = f"""\
Examples:
  vitscale report runs/digits_vit                  (writes runs/digits_vit/report.html)
  vitscale report runs/a runs/b --out cmp.html     (both runs' curves overlaid, a colour per run)

With one RUN_DIR the report goes to RUN_DIR/report.html; with several, to --out, by default
./{DEFAULT_COMPARISON} in the current folder. The report is one self-contained HTML file (the plots
are inside it): open it in a browser, copy it anywhere. Training writes RUN_DIR/report.html itself at
each evaluation and at the end of the run; this command redraws it from the run folder's files
(metrics.jsonl, summary.json, config.yaml), for a run in progress, a finished one or an older one.
"""


HELP = "write a run's HTML report (training curves, settings, summary), or compare runs"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help=HELP,
        description="Draw the training curves (loss, learning rate, validation metrics, img/s, MFU; "
        "zero-shot and retrieval for CLIP) of a run folder as PNG plots, with the run's settings, "
        "environment and summary, in one HTML file.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folder(s): a train.output_dir")
    p.add_argument(
        "--out",
        metavar="FILE",
        default=None,
        help=f"where to write the HTML (default: RUN_DIR/report.html for one run, ./{DEFAULT_COMPARISON} "
        "for several)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from vitscale.tools.report import write_comparison, write_report

    try:
        if len(args.runs) == 1:
            path = write_report(args.runs[0], args.out)
        else:
            path = write_comparison(args.runs, args.out or DEFAULT_COMPARISON)
    except FileNotFoundError as e:  # a refusal: one line (vitscale.cli)
        from vitscale.errors import ConfigError

        raise ConfigError(str(e)) from None
    print(f"report: {path}  (open {Path(path).resolve().as_uri()} in a browser)")
    return 0


COMMANDS.register("report", sys.modules[__name__])
