"""``report.html`` for a run folder: training curves as PNG plots (matplotlib, headless), the run's
settings, summary and environment, in one self-contained HTML file.

The report reads only the files a run writes (``metrics.jsonl``, ``summary.json``, ``config.yaml``), so
``vitscale report`` can draw any run folder, finished, in progress or from an older vitscale.

    write_report("runs/digits_vit")                      # -> runs/digits_vit/report.html
    write_comparison(["runs/a", "runs/b"], "cmp.html")   # the curves of both runs overlaid
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .page import compare_page, run_page
from .run import Run, read_run

REPORT_NAME = "report.html"

log = logging.getLogger("vitscale.report")


def _write_atomic(path: Path, text: str) -> Path:
    """Write via a temporary file and a rename, so a browser never opens half a report; a write that
    fails (a full disk) or is interrupted removes the temporary file, and the old report stays."""
    from vitscale.safe_write import write_atomic  # never through a symbolic link

    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, text, tmp=path.with_name(f".{path.name}.tmp{os.getpid()}"))


def write_report(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``run_dir/report.html``); returns its path."""
    run = read_run(run_dir)
    return _write_atomic(Path(out) if out else run.path / REPORT_NAME, run_page(run))


def write_comparison(run_dirs: list[str | os.PathLike], out: str | os.PathLike) -> Path:
    """Write one report overlaying the curves of several runs (a colour per run folder) to ``out``."""
    runs = [read_run(d) for d in run_dirs]
    return _write_atomic(Path(out), compare_page(runs))


def report_plots(run_dir: str | os.PathLike) -> dict[str, bytes]:
    """The report's plots of ``run_dir`` as PNG bytes, by panel id (for the experiment trackers); {}
    when it cannot draw them."""
    try:
        from .plots import draw, plan

        run = read_run(run_dir)
        return {panel.id: draw(panel, keys, [run], [run.path.name]) for panel, keys in plan([run], compare=False)}
    except Exception as e:  # noqa: BLE001 — plots are informative only
        log.warning("report plots not drawn: %s: %s", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return {}


def try_write_report(run_dir: str | os.PathLike) -> Path | None:
    """``write_report`` for the trainer: a failure to draw is one warning line, never a failed run."""
    try:
        return write_report(run_dir)
    except Exception as e:  # noqa: BLE001 — the report must never end a training run
        log.warning("report.html not written: %s: %s", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return None


__all__ = ["REPORT_NAME", "Run", "read_run", "report_plots", "try_write_report", "write_comparison", "write_report"]
