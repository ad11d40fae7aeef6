"""The team's experiment trackers beside TensorBoard: Weights & Biases (``log.wandb``) and MLflow
(``log.mlflow``), on rank 0 only.

Each tracker gets the run's config (flattened dotted keys), every logged record (by step), the
summary at the end and the report's plots (PNG images). The tracker's run id is kept in the run folder
(``trackers.json``), so a resumed or requeued run — another process, another node — continues the
same tracker run: W&B's ``wandb.init(id=..., resume="allow")``, MLflow's ``start_run(run_id=...)``.

A tracker never stops training: a package that is not installed, a server that cannot be reached, a
call that fails midway — each is one line (``log.wandb=true, but ...``), and the run goes on without
that tracker. Settings come from the trackers' own environment variables (``WANDB_MODE=offline``,
``WANDB_DIR``, ``WANDB_API_KEY``; ``MLFLOW_TRACKING_URI``, a server or a file store ``file:/path``).
Closing them is bounded by :func:`vitscale.train.closing.bounded` (a tracker that hangs on its
upload is abandoned with a line; the run's own files are complete by then).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

IDS_NAME = "trackers.json"


def _numbers(record: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in record.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)}  # fmt: skip


def _read_ids(out: Path) -> dict[str, Any]:
    p = out / IDS_NAME
    try:
        ids = json.loads(p.read_text()) if p.is_file() and not p.is_symlink() else {}
    except (OSError, ValueError):
        ids = {}
    return ids if isinstance(ids, dict) else {}


def _write_ids(out: Path, ids: dict[str, Any]) -> None:
    from vitscale.safe_write import write_atomic  # never through a symbolic link

    write_atomic(out / IDS_NAME, json.dumps(ids, indent=1))


class Tracker:
    """One tracker run: ``log`` (a record), ``summary`` (the end), ``images`` (the report's plots), ``close``."""

    name = ""
    takes_images = True  # whether :meth:`images` wants the report's plots (drawn at the run's end only then)

    def log(self, record: dict[str, Any]) -> None: ...

    def summary(self, values: dict[str, Any]) -> None: ...

    def images(self, pngs: dict[str, bytes], step: int) -> None: ...

    def close(self) -> None: ...


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, out: Path, project: str, config: dict[str, Any], run_id: str | None):
        import wandb

        kw: dict[str, Any] = {"dir": os.environ.get("WANDB_DIR") or str(out)}
        try:
            kw["settings"] = wandb.Settings(init_timeout=60, silent=True)
        except Exception:  # older wandb: its defaults
            pass
        self.wandb = wandb
        self.run = wandb.init(project=project, name=out.name, id=run_id, resume="allow", config=config, **kw)
        self.id = self.run.id

    def log(self, record):
        self.run.log(_numbers(record), step=int(record["step"]))

    def summary(self, values):
        self.run.summary.update({k: v for k, v in values.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)})

    def images(self, pngs, step):
        import io

        from PIL import Image

        self.run.log({f"report/{k}": self.wandb.Image(Image.open(io.BytesIO(v))) for k, v in pngs.items()}, step=step)

    def close(self):
        self.run.finish()


class MlflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, out: Path, project: str, config: dict[str, Any], run_id: str | None):
        import mlflow

        self.mlflow = mlflow
        if run_id:
            self.run = mlflow.start_run(run_id=run_id)
        else:
            mlflow.set_experiment(project)
            self.run = mlflow.start_run(run_name=out.name)
            items = [(k, str(v)[:6000]) for k, v in config.items()]
            for i in range(0, len(items), 100):  # MLflow takes at most 100 parameters per call
                mlflow.log_params(dict(items[i : i + 100]))
        self.id = self.run.info.run_id

    def log(self, record):
        self.mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in _numbers(record).items()}, step=int(record["step"]))

    def summary(self, values):
        self.mlflow.set_tags({f"summary.{k}": str(v) for k, v in values.items() if isinstance(v, (int, float, str))})

    def images(self, pngs, step):
        for k, v in pngs.items():
            self.mlflow.log_image(_png_array(v), f"report/{k}.png")

    def close(self):
        self.mlflow.end_run()


class ReportTracker(Tracker):
    """``log.report``: the run folder's ``report.html`` kept current while the run trains — drawn again
    after each record that carries an evaluation's results, but the last step's (the run's end draws
    the final report after summary.json: :class:`vitscale.train.reporting.Reporting`)."""

    name = "report"
    takes_images = False

    def __init__(self, out: Path, total_steps: int, is_eval: Callable[[str], bool]):
        self.out, self.total, self.is_eval = Path(out), total_steps, is_eval

    def log(self, record):
        from vitscale.tools.report import try_write_report

        if record.get("step", 0) < self.total and any(self.is_eval(k) for k in record):
            try_write_report(self.out)  # a failure to draw is one warning line


def _png_array(png: bytes):
    import io

    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


KINDS = {"wandb": WandbTracker, "mlflow": MlflowTracker}
PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}


class Trackers:
    """The trackers a run's ``log`` group asks for (rank 0; ``enabled`` False: none). Every call is
    guarded: a tracker whose call fails is dropped with one line through ``info``."""

    def __init__(self, out: Path, cfg: Any, config: dict[str, Any], info, enabled: bool = True, *,
                 total_steps: int = 0, is_eval: Callable[[str], bool] = lambda key: False):  # fmt: skip
        self.out, self.info, self.active = Path(out), info, []
        if enabled and cfg is not None and cfg.log.report:  # report.html, current after each evaluation
            self.active.append(ReportTracker(self.out, total_steps, is_eval))
        wanted = [k for k in KINDS if enabled and cfg is not None and getattr(cfg.log, k, False)]
        if not wanted:
            return
        ids = _read_ids(self.out)
        for kind in wanted:
            known = ids.get(kind)
            try:
                tracker = KINDS[kind](self.out, cfg.log.project, config, known)
            except ImportError:
                info(f"log.{kind}=true, but the {PACKAGES[kind]} package is not installed (pip install {PACKAGES[kind]}): "
                     f"the run goes on without it")  # fmt: skip
                continue
            except Exception as e:  # an unreachable server, missing credentials: the run goes on without it
                info(f"log.{kind}=true, but {kind} could not start ({_reason(e)}): the run goes on without it")
                continue
            self.active.append(tracker)
            if ids.get(kind) != tracker.id:
                ids[kind] = tracker.id
                try:
                    _write_ids(self.out, ids)
                except BaseException:  # a link at trackers.json's name, a full disk: the started runs are ended
                    self.close()
                    raise
            info(f"{kind}: run {tracker.id}" + (" (continued)" if known == tracker.id else ""))

    def _each(self, what: str, *args) -> None:
        for tracker in list(self.active):
            try:
                getattr(tracker, what)(*args)
            except Exception as e:  # a tracker never stops training
                self.active.remove(tracker)
                self.info(f"{tracker.name}: {what} failed ({_reason(e)}): no more reports to {tracker.name} from this run")

    def log(self, record: dict[str, Any]) -> None:
        self._each("log", record)

    @property
    def takes_images(self) -> bool:
        """Whether a tracker wants the report's plots at the run's end (W&B, MLflow)."""
        return any(t.takes_images for t in self.active)

    def summary(self, values: dict[str, Any], plots: dict[str, bytes] | None, step: int) -> None:
        self._each("summary", values)
        if plots:
            self._each("images", plots, step)

    def close(self) -> None:
        from .closing import bounded

        for tracker in self.active:
            bounded(tracker.close, tracker.name, self.info)
        self.active = []


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


__all__ = ["IDS_NAME", "Trackers"]
