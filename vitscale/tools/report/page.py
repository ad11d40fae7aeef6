"""The report page: one self-contained HTML file (plots inline as base64 PNG data URIs, no scripts,
no external files), readable straight from the run folder."""

from __future__ import annotations

import base64
import datetime
import fnmatch
import html
import math
from typing import Any

from vitscale.config import flatten
from vitscale.tools.units import base_key

from .plots import draw, full_scale, plan, resume_steps, size_of
from .run import Run

# Keys of summary.json / metrics.jsonl that are evaluation results (the report's headline): those of the
# built-in tasks' default evaluations, and ``<name>_*`` for each of the run's evaluations (its config.yaml's
# ``evals:``, else its task's defaults: ``Run.eval_names``).
EVAL_PATTERNS = ("val_*", "zeroshot_*", "*retrieval_recall@*")
# Details of an evaluation left out of the headline (they stay in the summary table).
DETAILS = ("*_images", "*_feature_dim", "*_l2", "*_seeds", "*_note")
# The settings shown at a glance above the full config.yaml (dotted paths; missing ones are left out).
KEY_SETTINGS = (
    "model.name", "model.overrides", "train.task", "data.format", "data.train_path", "data.val_path",
    "train.batch_size", "train.grad_accum", "train.max_steps", "train.epochs", "optim.name", "optim.lr",
    "optim.weight_decay", "schedule.name", "schedule.warmup_steps", "schedule.warmup_epochs", "train.device",
    "precision.autocast", "precision.param_dtype", "parallel.dp_replicate", "parallel.dp_shard", "parallel.tp",
    "eval.every", "train.seed",
)  # fmt: skip
# Settings where 0 means "not used" (the other of steps / epochs is): left out of the short table.
ZERO_MEANS_UNSET = ("train.max_steps", "train.epochs", "schedule.warmup_steps", "schedule.warmup_epochs")
# Config keys left out of the comparison of settings (they differ between any two runs by design).
NOT_COMPARED = ("train.output_dir",)

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222;
       margin: 0 auto; max-width: 1400px; padding: 16px 24px 48px; }
h1 { font-size: 22px; margin: 8px 0 2px; } h2 { font-size: 17px; margin: 28px 0 8px;
     border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.sub { color: #666; margin: 0 0 12px; }
.headline { display: flex; flex-wrap: wrap; gap: 10px; margin: 12px 0; }
.metric { border: 1px solid #ddd; border-radius: 6px; padding: 6px 12px; min-width: 120px; }
.metric .v { font-size: 20px; font-weight: 600; } .metric .k { color: #666; font-size: 12px; }
.notes { background: #fff8e1; border: 1px solid #f0d98c; border-radius: 6px; padding: 6px 12px; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 12px; }
figure { margin: 0; } figure img { width: 100%; height: auto; border: 1px solid #eee; }
table { border-collapse: collapse; margin: 4px 0 8px; }
td, th { border-bottom: 1px solid #eee; padding: 3px 12px 3px 0; text-align: left; vertical-align: top; }
td.num { font-variant-numeric: tabular-nums; }
pre { background: #f6f8fa; padding: 10px; overflow-x: auto; font-size: 12px; }
details { margin: 6px 0; } summary { cursor: pointer; }
"""


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v).lower() if isinstance(v, bool) else "null"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.6g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def eval_patterns(run: Run | None) -> tuple[str, ...]:
    """:data:`EVAL_PATTERNS` and ``<name>_*`` of each of ``run``'s evaluations (:attr:`Run.eval_names`)."""
    names = run.eval_names if run is not None else []
    return EVAL_PATTERNS + tuple(f"{n}_*" for n in names if f"{n}_*" not in EVAL_PATTERNS)


def _is_eval(key: str, run: Run | None = None) -> bool:
    return any(fnmatch.fnmatchcase(key, p) for p in eval_patterns(run))


def _display(key: str, v: float, run: Run | None = None) -> str:
    """A metric for people: ratios in percent (read as ``run``'s files hold them)."""
    scale = full_scale(key, run)
    if scale is not None and math.isfinite(v):
        return f"{v * 100.0 / scale:.2f}%"
    return f"{v:.4g}"


def final_metrics(run: Run) -> dict[str, float]:
    """The run's evaluation results: from summary.json when it belongs to the last logged step, else the
    last evaluation logged in metrics.jsonl."""
    from .plots import _key_order

    patterns = eval_patterns(run)
    keep = lambda k: any(fnmatch.fnmatchcase(k, p) for p in patterns) and not any(fnmatch.fnmatchcase(base_key(k), d) for d in DETAILS)  # noqa: E731
    if run.finished and run.summary:
        found = {k: v for k, v in run.summary.items() if keep(k) and isinstance(v, (int, float)) and not isinstance(v, bool)}
    else:
        found = {}
        for k, s in run.series.items():
            if keep(k) and (last := s.last_finite()) is not None:
                found[k] = last[1]
    # classification, then zero-shot, then retrieval, then the evals: entries in order; accuracies
    # before losses; top-1 before top-5
    def order(k: str) -> tuple:
        group = next(i for i, p in enumerate(patterns) if fnmatch.fnmatchcase(k, p))
        return (group, full_scale(k) is None, _key_order(k))

    return {k: float(found[k]) for k in sorted(found, key=order)}


def _status(run: Run) -> str:
    total = run.total_steps()
    if run.finished:
        s = run.summary or {}
        wall = s.get("wall_time_s")
        t = f" in {wall:.1f} s of training" if isinstance(wall, (int, float)) and math.isfinite(wall) else ""
        resumes = resume_steps(run)
        if resumes:  # the whole run, across its restarts (vitscale.train.segments)
            t += f" over {len(resumes) + 1} segments (resumed at steps {', '.join(map(str, resumes))})"
        return f"finished: {s.get('steps', run.last_step)} steps{t}"
    if run.last_step is None:
        return "no steps logged yet"
    of = f" of {total}" if total and total >= run.last_step else ""
    return f"in progress (or stopped): step {run.last_step}{of} logged"


def _notes(run: Run) -> list[str]:
    notes = list(run.problems)
    if run.summary is not None and not run.finished:
        notes.append(
            f"summary.json is from step {run.summary.get('steps')}, metrics.jsonl reaches step {run.last_step}: "
            "the summary is from an earlier run in this folder (or this run has not finished)"
        )
    if run.last_step is not None and not any(_is_eval(k, run) for k in run.series):
        notes.append("no evaluation results logged: the run has no validation data, eval.every is 0 and the "
                     "run has not finished, or the run is before its first evaluation")  # fmt: skip
    for k, s in run.series.items():
        bad = s.non_finite_steps()
        if bad:
            notes.append(f"{k}: {len(bad)} non-finite value(s), first at step {int(bad[0])} (marked x on the plot)")
    if run.skipped_lines:
        notes.append(f"metrics.jsonl: {run.skipped_lines} unreadable line(s) skipped")
    if run.restarts:
        notes.append(f"metrics.jsonl: steps start over {run.restarts} time(s); only the last run is shown")
    return notes


def _lookup(d: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _table(rows: list[tuple[str, str]], head: tuple[str, str] | None = None) -> str:
    out = ["<table>"]
    if head:
        out.append(f"<tr><th>{html.escape(head[0])}</th><th>{html.escape(head[1])}</th></tr>")
    for k, v in rows:
        out.append(f'<tr><td>{html.escape(k)}</td><td class="num">{html.escape(v)}</td></tr>')
    out.append("</table>")
    return "".join(out)


def _headline(run: Run) -> str:
    # recall@K beyond K=1 and a sizes evaluation's top-5 and losses stay in the summary table and on its
    # plot: the headline is what a person checks first
    items = [(k, _display(k, v, run)) for k, v in final_metrics(run).items()
             if ("_recall@" not in k or k.endswith("@1")) and (size_of(k) or ("", 0, "top1"))[2] == "top1"]  # fmt: skip
    s = run.summary if run.finished and run.summary else {}
    if isinstance(s.get("img_per_s"), (int, float)):
        items.append(("img/s (whole run)", f"{s['img_per_s']:.0f}"))
    if not items:
        return ""
    cells = "".join(
        f'<div class="metric"><div class="v">{html.escape(v)}</div><div class="k">{html.escape(k)}</div></div>'
        for k, v in items
    )
    return f'<div class="headline">{cells}</div>'


def _plots(runs: list[Run], labels: list[str]) -> str:
    panels = plan(runs, compare=len(runs) > 1)
    if not panels:
        return "<p>No curves yet: metrics.jsonl is missing or empty.</p>"
    out = ['<div class="plots">']
    for panel, keys in panels:
        png = base64.b64encode(draw(panel, keys, runs, labels)).decode("ascii")
        alt = html.escape(panel.alt or panel.title)
        out.append(f'<figure id="plot-{html.escape(panel.id)}"><img alt="{alt}" src="data:image/png;base64,{png}">'
                   "</figure>")  # fmt: skip
    out.append("</div>")
    return "".join(out)


def _settings(run: Run) -> str:
    if run.config_text is None:
        return "<p>No config.yaml in this folder.</p>"
    rows = []
    for k in KEY_SETTINGS:
        v = _lookup(run.config or {}, k)
        if v in (None, {}, "") or (v == 0 and k in ZERO_MEANS_UNSET):
            continue
        rows.append((k, _fmt(v)))
    return (_table(rows) + "<details><summary>config.yaml (everything the run used)</summary>"
            f'<pre id="config">{html.escape(run.config_text)}</pre></details>')  # fmt: skip


def _summary(run: Run) -> str:
    if run.summary is None:
        return "<p>No summary.json yet: it is written when the run ends.</p>"
    flat = flatten({k: v for k, v in run.summary.items() if k not in ("env", "environment")})
    return _table([(k, _summary_value(k, v, run)) for k, v in flat.items()])


def _summary_value(key: str, v: Any, run: Run) -> str:
    """A summary.json entry for people: its ratios (accuracies, MFU, data_wait) in percent with a % sign,
    as in the headline and on the plots; everything else as written."""
    leaf = key.rsplit(".", 1)[-1]
    if isinstance(v, (int, float)) and not isinstance(v, bool) and full_scale(leaf, run) is not None:
        return _display(leaf, float(v), run)
    return _fmt(v)


def _environment(run: Run) -> str:
    env = (run.summary or {}).get("env", (run.summary or {}).get("environment"))
    if not isinstance(env, dict) or not env:
        return "<p>Not recorded in summary.json by the vitscale that made this run.</p>"
    return _table([(k, _fmt(v)) for k, v in flatten(env).items()])


def _files(run: Run) -> str:
    from vitscale.run.folder import LOCK_NAME  # the training's lock: removed when the run ends

    rows = []
    for p in sorted(run.path.iterdir()):
        if p.name.startswith(".") or p.name in ("report.html", LOCK_NAME):
            continue
        if p.is_dir():
            n = sum(1 for _ in p.iterdir())
            rows.append((p.name + "/", f"{n} entr{'y' if n == 1 else 'ies'}"))
        else:
            rows.append((p.name, _size(p.stat().st_size)))
    return _table(rows)


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _page(title: str, body: list[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{html.escape(title)}</title>'
        f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def _stamp() -> str:
    return datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")


def run_page(run: Run) -> str:
    """The report of one run."""
    model = (run.summary or {}).get("model") or ((run.config or {}).get("model") or {}).get("name")
    head = f"{model} — " if model else ""
    notes = _notes(run)
    body = [
        f"<h1>{html.escape(head + run.name)}</h1>",
        f'<p class="sub">{html.escape(_status(run))} · {html.escape(str(run.path))} · report written {_stamp()}</p>',
        _headline(run),
        ('<div class="notes" id="notes"><ul>' + "".join(f"<li>{html.escape(n)}</li>" for n in notes)
         + "</ul></div>") if notes else "",
        "<h2>Curves</h2>",
        _plots([run], [run.name]),
        '<h2 id="settings">Settings</h2>',
        _settings(run),
        '<h2 id="summary-h">Summary</h2>',
        _summary(run),
        '<h2 id="environment">Environment</h2>',
        _environment(run),
        '<h2 id="files">Files in the run folder</h2>',
        _files(run),
    ]  # fmt: skip
    return _page(f"{head}{run.name} — vitscale report", body)


def run_labels(runs: list[Run]) -> list[str]:
    """Legend names: the folder name, with as many parent folders as it takes to tell runs apart."""
    parts = [r.path.resolve().parts for r in runs]
    for depth in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(r.path) for r in runs]


def compare_page(runs: list[Run]) -> str:
    """One report overlaying several runs."""
    labels = run_labels(runs)
    evals: list[str] = []
    finals = [final_metrics(r) for r in runs]
    for f in finals:
        evals += [k for k in f if k not in evals]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["run", "model", "status", *evals])
    rows = []
    for r, label, f in zip(runs, labels, finals):
        model = (r.summary or {}).get("model") or ((r.config or {}).get("model") or {}).get("name") or ""
        cells = [label, str(model), _status(r), *(_display(k, f[k], r) if k in f else "—" for k in evals)]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    overview = f'<table id="overview"><tr>{head}</tr>{"".join(rows)}</table>'

    flats = [flatten(r.config) if r.config else None for r in runs]
    keys: list[str] = []
    for f in flats:
        keys += [k for k in (f or {}) if k not in keys and k not in NOT_COMPARED]
    differ = [k for k in keys if len({_fmt((f or {}).get(k, "(absent)")) for f in flats}) > 1]
    if differ:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in ["setting", *labels])
        rows = [
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in [k, *(_fmt((f or {}).get(k, "—")) for f in flats)])
            + "</tr>"
            for k in differ
        ]  # fmt: skip
        diff = f'<table id="settings-diff"><tr>{head}</tr>{"".join(rows)}</table>'
    else:
        diff = "<p>The runs' config.yaml files agree (apart from train.output_dir).</p>"

    details = []
    for r, label in zip(runs, labels):
        notes = _notes(r)
        details.append(
            f"<details><summary>{html.escape(label)} — {html.escape(str(r.path))}</summary>"
            + ("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>" if notes else "")
            + "<h3>Summary</h3>" + _summary(r) + "<h3>Environment</h3>" + _environment(r)
            + "<h3>Settings</h3>" + _settings(r) + "</details>"
        )  # fmt: skip
    title = "vitscale runs: " + ", ".join(labels)
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="sub">{len(runs)} runs · report written {_stamp()}</p>',
        overview,
        '<h2 id="settings">Settings that differ</h2>',
        diff,
        "<h2>Curves</h2>",
        _plots(runs, labels),
        "<h2>Each run</h2>",
        *details,
    ]
    return _page(title, body)
