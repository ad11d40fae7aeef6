"""The report's plots: one PNG per panel, drawn with matplotlib's Agg canvas (headless; pyplot and the
user's matplotlib backend are left alone, so a notebook that trains keeps its own backend).

A panel gathers the logged keys that share an axis (train and val loss; val top-1 and top-5). In a
comparison of several runs each panel holds one key, one colour per run. Curves with more than
``MAX_POINTS`` points are drawn as the mean of ``BUCKETS`` equal bins with their min-max band, so a
100k-step run draws as fast as a short one.
"""

from __future__ import annotations

import fnmatch
import io
import math
import re
from dataclasses import dataclass, replace

from vitscale.tools.units import base_key, is_percent

from .run import Run, Series

MAX_POINTS = 2000
BUCKETS = 800

# Before summary.json recorded its "units" (vitscale.tools.units: every ratio in percent), MFU and CLIP
# zero-shot / retrieval were written as fractions of 1: a finished run folder without "units" is read
# with these keys as fractions. The plots show every ratio in percent.
LEGACY_FRACTIONS = ("mfu", "zeroshot_*", "*retrieval_recall@*")


@dataclass(frozen=True)
class Panel:
    id: str
    title: str
    ylabel: str
    patterns: tuple[str, ...]
    percent: bool = False
    log_y: bool = False
    sci_y: bool = False
    alt: str = ""
    pair_style: bool = False  # colour by the trailing number (@K), line style by what comes before it
    size_style: bool = False  # a sizes evaluation (seq<N>, px<S> in its keys): drawn against the size
    points: bool = False  # markers only, no line: a value drawn at each logged step (the step's size)
    zero_y: bool = False  # the y axis starts at 0 (a share of the time)


# In page order. A key goes to the first panel whose patterns match it; keys no panel claims get one
# panel each ("other"), so a new logged value is drawn without a change here.
PANELS = (
    Panel("loss", "Loss", "loss (mean per image)", ("loss", "train_*loss", "val_loss*"),
          alt="training and validation loss over steps"),
    Panel("accuracy", "Accuracy", "top-k accuracy (%)", ("val_top*", "train_top1", "train_i2t_top1"), percent=True,
          alt="validation and training-batch accuracy over steps"),
    Panel("zeroshot", "Zero-shot classification", "accuracy (%)", ("zeroshot_*",), percent=True,
          alt="CLIP zero-shot top-1 and top-5 accuracy over steps"),
    Panel("retrieval", "Image-text retrieval", "recall@K (%)", ("*retrieval_recall@*",), percent=True,
          alt="CLIP image-to-text and text-to-image retrieval recall@K over steps", pair_style=True),
    Panel("knn", "k-NN classification", "top-k accuracy (%)", ("knn_top*",), percent=True,
          alt="weighted k-NN top-1 and top-5 accuracy of frozen features over steps"),
    Panel("linear_probe", "Linear probe", "top-k accuracy (%)", ("linear_probe_top*",), percent=True,
          alt="top-1 and top-5 accuracy of a linear probe of frozen features over steps"),
    # the collapse signals, each on its own axis: a rank (1 to min(n, d)) and two values in nats whose scales
    # differ by orders of magnitude (digits_dino: entropy ~5, KL ~0.01) would flatten one another
    Panel("collapse", "Collapse signals: effective rank", "effective rank (RankMe)", ("train_rankme",), zero_y=True,
          alt="effective rank of the batch's embeddings over steps (RankMe; a collapsing representation falls to 1)"),
    Panel("teacher_entropy", "Collapse signals: the teacher's entropy", "mean entropy of a target (nats)",
          ("train_teacher_entropy",), zero_y=True,
          alt="mean entropy of a self-distillation teacher's targets over steps, in nats (near log K: every target "
              "close to uniform)"),
    Panel("teacher_kl", "Collapse signals: the teacher's KL from uniform", "KL(mean target || uniform) (nats)",
          ("train_teacher_kl_uniform",), zero_y=True,
          alt="KL divergence of a self-distillation teacher's mean target from uniform over steps, in nats (near "
              "log K: the batch's mass on few prototypes)"),
    # feature distillation (vitscale.tasks.feature_distill): the student's adaptors against each teacher, by
    # token kind (train_<teacher>_summary_cos, train_<teacher>_patch_cos); each teacher's loss is in "loss"
    Panel("teacher_cos", "Feature distillation: cosine to each teacher", "cosine similarity", ("train_*_cos",),
          alt="cosine between the student's adaptor outputs and each teacher's features (summary token, patch "
              "tokens) over steps"),
    Panel("lr", "Learning rate", "learning rate", ("lr",), sci_y=True, alt="learning rate over steps"),
    Panel("throughput", "Throughput", "images / s", ("img_per_s",), alt="training images per second over steps"),
    Panel("time_shares", "Where the time goes", "share of wall time (%)", ("data_wait", "*_time_pct"), percent=True,
          zero_y=True,
          alt="share of the time spent waiting for the next batch (and in a task's parts) over steps"),
    Panel("mfu", "Model FLOPs utilisation", "MFU (% of peak)", ("mfu",), percent=True,
          alt="model FLOPs utilisation over steps"),
    Panel("tflops", "Achieved compute", "TFLOP/s", ("tflops",), alt="achieved TFLOP/s over steps"),
    Panel("grad_norm", "Gradient norm", "global L2 norm (before clipping)", ("grad_norm",), log_y=True,
          alt="global gradient norm over steps"),
    Panel("seq_len", "Sequence length of the logged step", "patches per image", ("seq_len",), points=True,
          alt="NaFlex sequence length of each logged step"),
    Panel("img_size", "Image size of the logged step", "image side (px)", ("img_size",), points=True,
          alt="image side of each logged step"),
    Panel("memory", "Peak memory", "GiB (allocator peak)", ("mem_peak_gib",), alt="peak GPU memory over steps"),
    Panel("nonfinite", "Steps not applied", "steps with a non-finite loss or gradient (count)", ("nonfinite_steps",),
          alt="running count of steps skipped for a non-finite loss or gradient norm"),
)


# Panel titles of single keys in a comparison (where a panel holds one key).
KEY_TITLES = {
    "loss": "Training loss", "val_loss": "Validation loss", "train_top1": "Training-batch top-1",
    "val_top1": "Validation top-1", "val_top5": "Validation top-5", "zeroshot_top1": "Zero-shot top-1",
    "zeroshot_top5": "Zero-shot top-5", "train_i2t_top1": "In-batch image-to-text top-1",
}  # fmt: skip


def full_scale(key: str, run: Run | None = None) -> float | None:
    """The value of ``key`` that means 100% in ``run``'s files (None: not a ratio)."""
    if not is_percent(key):
        return None
    base = base_key(key)
    if run is not None and run.legacy_units and any(fnmatch.fnmatchcase(base, p) for p in LEGACY_FRACTIONS):
        return 1.0
    return 100.0


def _panel_of(key: str) -> Panel | None:
    for p in PANELS:
        if any(fnmatch.fnmatchcase(key, pat) for pat in p.patterns):
            return p
    return None


# Details of an evaluation that are not curves (image counts, feature sizes, a chosen penalty).
DETAILS = ("*_images", "*_feature_dim", "*_l2")


def _eval_names(runs: list[Run]) -> list[str]:
    """The names of the runs' evaluations (their ``evals:``, else their task's defaults:
    :attr:`Run.eval_names`), in order."""
    names: list[str] = []
    for run in runs:
        names += [n for n in run.eval_names if n not in names]
    return names


def _eval_panel(key: str, names: list[str]) -> Panel | None:
    """One panel per named evaluation (its metrics), for keys no built-in panel claims; split by unit in
    :func:`_by_unit`."""
    for n in names:
        if key.startswith(n + "_"):
            return Panel(f"eval-{_slug(n)}", f"Evaluation: {n}", f"{n} metrics", (f"{n}_*",), alt=f"evaluation {n} over steps")
    return None


_SIZED = re.compile(r"_(seq|px)(\d+)_([a-z0-9]+)$")


def size_of(key: str) -> tuple[str, int, str] | None:
    """``sizes_seq64_top1`` -> ("seq", 64, "top1"), ``sizes_px24_loss`` -> ("px", 24, "loss") (the
    ``sizes`` evaluator's keys, vitscale.eval.sizes); None for other keys."""
    m = _SIZED.search(key.removesuffix("_ema"))
    return (m.group(1), int(m.group(2)), m.group(3)) if m else None


def _is_loss(key: str) -> bool:
    return base_key(key).endswith("loss")


def _by_unit(p: Panel, keys: list[str]) -> list[tuple[Panel, list[str]]]:
    """An evaluation's panel split so that each axis has one unit: its percentages (accuracy), its
    losses, then anything else it logs; the first keeps the panel's id. A ``sizes`` evaluation's panels
    are drawn against the size (:func:`_draw_sizes`)."""
    groups = (
        ("", "accuracy (%)", True, [k for k in keys if is_percent(k)]),
        ("loss", "loss (mean per image)", False, [k for k in keys if not is_percent(k) and _is_loss(k)]),
        ("other", p.ylabel, False, [k for k in keys if not is_percent(k) and not _is_loss(k)]),
    )
    out: list[tuple[Panel, list[str]]] = []
    for suffix, ylabel, percent, ks in groups:
        if not ks:
            continue
        pid, title = (p.id, p.title) if not out else (f"{p.id}-{suffix}", f"{p.title}, {suffix}")
        sized = all(size_of(k) for k in ks)
        what = "accuracy" if percent else suffix
        alt = p.alt.replace(" over steps", f": {what} against the size") if sized else f"{p.alt}: {what}"
        out.append((Panel(pid, title, ylabel, p.patterns, percent=percent, alt=alt, size_style=sized), ks))
    return out


def plan(runs: list[Run], compare: bool) -> list[tuple[Panel, list[str]]]:
    """The panels to draw and the keys of each, in page order. TFLOP/s is drawn only where no MFU is
    logged (MFU is TFLOP/s over one fixed peak: the same curve)."""
    keys: list[str] = []
    for run in runs:
        keys += [k for k in run.series if k not in keys and run.series[k].finite()[0]]
    keys = [k for k in keys if not any(fnmatch.fnmatchcase(base_key(k), d) for d in DETAILS)]
    if "mfu" in keys and "tflops" in keys:
        keys.remove("tflops")
    grouped: dict[str, tuple[Panel, list[str]]] = {}
    order = {p.id: i for i, p in enumerate(PANELS)}
    names = _eval_names(runs)
    for k in keys:
        p = _panel_of(k) or _eval_panel(k, names)
        if p is None:  # a key vitscale does not know: its name on the axis, and % where it is a ratio
            p = Panel(f"other-{k}", k, k + (" (%)" if is_percent(k) else ""), (k,), percent=is_percent(k),
                      alt=f"{k} over steps")
        if p.id not in order:
            order[p.id] = len(order)
        grouped.setdefault(p.id, (p, []))[1].append(k)
    out = []
    for pid in sorted(grouped, key=lambda i: order[i]):
        p, ks = grouped[pid]
        ks.sort(key=_key_order)
        for part, part_keys in _by_unit(p, ks) if pid.startswith("eval-") else [(p, ks)]:
            out += _compared(part, part_keys, compare)
    return out


def _compared(p: Panel, ks: list[str], compare: bool) -> list[tuple[Panel, list[str]]]:
    """The panel as it is drawn: in a comparison of runs one key per panel, a colour per run (a sizes
    evaluation stays one panel: each run's final evaluation against the size)."""
    if not compare or len(ks) == 1 or p.size_style:
        return [(p, ks)]
    out = []
    for k in ks:
        title = f"{KEY_TITLES[k]} ({k})" if k in KEY_TITLES else f"{p.title}: {k}"
        out.append((replace(p, id=_slug(k), title=title, patterns=(k,), alt=f"{k} of each run over steps",
                            pair_style=False), [k]))  # fmt: skip
    return out


def _key_order(k: str) -> tuple:
    # train before val, top-1 before top-5, recall@1 before @10, the model before its EMA; a sizes
    # evaluation's keys by size, then metric
    sized = size_of(k)
    return (base_key(k) != k, not k.startswith(("loss", "train")), sized[1] if sized else 0, _num_suffix(base_key(k)), k)


def _num_suffix(k: str) -> float:
    digits = ""
    for ch in reversed(k.removesuffix("_ema")):
        if not ch.isdigit():
            break
        digits = ch + digits
    return float(digits) if digits else -1.0


def _slug(k: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in k)


def _bucketed(xs: list[float], ys: list[float]):
    """Mean per bin and the min-max band, for curves too long to draw point by point."""
    n = len(xs)
    mx, my, lo, hi = [], [], [], []
    for b in range(BUCKETS):
        i, j = b * n // BUCKETS, (b + 1) * n // BUCKETS
        if j <= i:
            continue
        seg = ys[i:j]
        mx.append(sum(xs[i:j]) / (j - i))
        my.append(sum(seg) / (j - i))
        lo.append(min(seg))
        hi.append(max(seg))
    return mx, my, lo, hi


def _sparse(s: Series, run: Run) -> bool:
    """Logged at few of the run's records (evaluation results): drawn with markers."""
    return len(s.steps) * 2 <= run.records or len(s.steps) <= 12


# open_clip's names: text retrieval ranks captions for each image, image retrieval images for each caption.
_DIRECTION = {"text": "image → text", "image": "text → image"}


_SIZE_UNIT = {"seq": "patches", "px": "px"}
_METRIC = {"loss": "loss"}


def legend_name(key: str) -> str:
    """``text_retrieval_recall@5`` -> ``image → text, R@5``; ``sizes_seq64_top1`` -> ``64 patches, top-1``;
    ``data_wait`` -> ``waiting for data (data_wait)``; other keys as logged."""
    head, sep, k = key.partition("_retrieval_recall@")
    if sep and head in _DIRECTION:
        return f"{_DIRECTION[head]}, R@{k}"
    sized = size_of(key)
    if sized:
        kind, n, metric = sized
        metric = _METRIC.get(metric, metric.replace("top", "top-"))
        return f"{n} {_SIZE_UNIT[kind]}, {metric}" + (" (EMA)" if key.endswith("_ema") else "")
    if key == "data_wait":
        return "waiting for data (data_wait)"
    return key


COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
          "#bcbd22")
STYLES = ("-", "--", ":", "-.")


def _styles(panel: Panel, keys: list[str], compare: bool) -> list[tuple[int, str]]:
    """(colour index, line style) per key: in a comparison the colour is the run's, keys differ by style."""
    if compare:
        return [(0, STYLES[i % len(STYLES)]) for i in range(len(keys))]
    if not panel.pair_style:
        return [(i, "-") for i in range(len(keys))]
    nums = sorted({_num_suffix(k) for k in keys})
    heads = sorted({k.removesuffix("_ema").rstrip("0123456789") for k in keys})
    return [(nums.index(_num_suffix(k)), STYLES[heads.index(k.removesuffix("_ema").rstrip("0123456789")) % len(STYLES)])
            for k in keys]  # fmt: skip


def resume_steps(run: Run) -> list[int]:
    """The steps at which the run was resumed, from its summary's segments (none when unknown)."""
    segments = (run.summary or {}).get("segments") if run.finished else None
    if not isinstance(segments, list):
        return []
    return [s["start_step"] for s in segments[1:] if isinstance(s, dict) and isinstance(s.get("start_step"), int)]


def draw(panel: Panel, keys: list[str], runs: list[Run], labels: list[str], *, dpi: int = 100) -> bytes:
    """The panel as PNG bytes."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig = Figure(figsize=(6.4, 3.6), dpi=dpi)  # fixed margins: a constrained layout draws everything twice
    ax = fig.add_subplot()
    compare = len(runs) > 1
    if panel.size_style:
        return _draw_sizes(fig, ax, panel, keys, runs, labels)
    styles = _styles(panel, keys, compare)
    curves = []  # (xs, ys, colour, style, label, sparse)
    bad_steps: list[float] = []
    for ri, run in enumerate(runs):
        for ki, key in enumerate(keys):
            s = run.series.get(key)
            if s is None:
                continue
            bad_steps += s.non_finite_steps()
            xs, ys = s.finite()
            if not xs:
                continue
            scale = full_scale(key, run) if panel.percent else None
            if scale:
                ys = [y * 100.0 / scale for y in ys]
            ci, style = styles[ki]
            color = COLORS[(ri if compare else ci) % len(COLORS)]
            name = legend_name(key)
            label = (f"{labels[ri]}: {name}" if len(keys) > 1 else labels[ri]) if compare else name
            curves.append((xs, ys, color, style, label, _sparse(s, run)))
    ys_all = [y for c in curves for y in c[1]]
    exp = 0
    if panel.sci_y and ys_all and max(abs(y) for y in ys_all) > 0:
        exp = math.floor(math.log10(max(abs(y) for y in ys_all)))
        exp = exp if exp < -2 or exp > 4 else 0
    for xs, ys, color, style, label, sparse in curves:
        if exp:
            ys = [y / 10.0**exp for y in ys]
        if panel.points:  # one value per logged step (a drawn size): dots, no line between draws
            ax.plot(xs, ys, "o", markersize=3, color=color, label=label, alpha=0.8)
        elif sparse:
            ax.plot(xs, ys, style, marker="o", markersize=4, color=color, label=label, linewidth=1.5)
        elif len(xs) > MAX_POINTS:
            bx, by, lo, hi = _bucketed(xs, ys)
            ax.fill_between(bx, lo, hi, color=color, alpha=0.2, linewidth=0)
            ax.plot(bx, by, style, color=color, linewidth=1.2,
                    label=label if compare else f"{label} (mean of {len(xs) // len(bx)}-step bins; band: min to max)")
        else:
            ax.plot(xs, ys, style, color=color, label=label, linewidth=1.2)
    resumes = [] if compare else resume_steps(runs[0])
    for i, x in enumerate(resumes):  # each start of the job after the first (vitscale.train.segments)
        ax.axvline(x, color="#7f7f7f", linestyle=":", linewidth=1.2, label=f"resumed ({len(resumes)})" if i == 0 else None)
    if bad_steps:
        ax.plot(bad_steps, [0.0] * len(bad_steps), "x", color="#d62728", markersize=7, clip_on=False,
                transform=ax.get_xaxis_transform(), label=f"non-finite ({len(bad_steps)})")  # fmt: skip
    positive = [y for y in ys_all if y > 0]
    if panel.log_y and positive and len(positive) == len(ys_all) and max(positive) > 20 * min(positive):
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    if panel.percent:
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
    levels = sorted(set(ys_all))
    if panel.points and 0 < len(levels) <= 8:  # the sizes themselves as the ticks
        ax.set_yticks(levels)
        ax.set_ylim(levels[0] - 0.1 * (levels[-1] - levels[0] or 1), levels[-1] + 0.1 * (levels[-1] - levels[0] or 1))
    fig.text(0.012, 0.975, panel.title, fontsize=12, va="top", ha="left")
    epochs = "" if compare or not runs[0].epoch_per_step else f"; 1 epoch = {1 / runs[0].epoch_per_step:.4g} steps"
    ax.set_xlabel(f"step (optimizer updates{epochs})")  # not a second axis: that doubles the drawing time
    ax.set_ylabel(panel.ylabel + (f" (×1e{exp})" if exp else ""))
    ax.grid(True, alpha=0.3)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_xlim(left=0)
    if panel.zero_y:
        ax.set_ylim(bottom=0)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.14, top=0.88)
    if max((c[0][-1] for c in curves), default=0) >= 10000:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:g}k" if v else "0"))
    if (curves or bad_steps) and not (panel.points and len(curves) == 1 and not bad_steps and not resumes):  # one series of points: the title names it
        n = len(curves) + bool(bad_steps) + bool(resumes)
        ax.legend(fontsize=9 if n <= 4 else 8, frameon=False, loc="best", ncol=1 if n <= 4 else 2)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


SIZE_AXIS = {"seq": "sequence length (patches per image)", "px": "image side (px)"}
SIZE_EVALS = 4  # the evaluations a sizes plot draws: the last ones, the final one in full colour


def _draw_sizes(fig, ax, panel: Panel, keys: list[str], runs: list[Run], labels: list[str]) -> bytes:
    """A ``sizes`` evaluation against the size (the x axis: sequence length or image side): how accuracy
    falls with fewer patches reads at a glance, where a curve over steps is a few stacked dots. One run: a
    colour per metric (top-1, top-5; or the loss), its last evaluations, the earlier ones fainter, the
    final values written on the points. Several runs: each run's final evaluation, a colour per run, a
    line style per metric."""
    from matplotlib.ticker import FuncFormatter

    parsed = {k: (kind, n, m + ("_ema" if k.endswith("_ema") else "")) for k in keys for kind, n, m in [size_of(k)]}
    sizes = sorted({p[1] for p in parsed.values()})
    metrics = sorted({p[2] for p in parsed.values()}, key=lambda m: (m.startswith("loss"), m.endswith("_ema"), m))
    compare = len(runs) > 1
    lines = 0
    for ri, run in enumerate(runs):
        at: dict[tuple[float, int, str], float] = {}  # (step, size, metric) -> value
        for k, (_, n, m) in parsed.items():
            s = run.series.get(k)
            if s is None:
                continue
            scale = full_scale(k, run) if panel.percent else None
            for x, y in zip(*s.finite()):
                at[(x, n, m)] = y * 100.0 / scale if scale else y
        steps = sorted({x for x, _, _ in at})[-(1 if compare else SIZE_EVALS) :]
        for mi, m in enumerate(metrics):
            base = m.removesuffix("_ema")
            name = _METRIC.get(base, base.replace("top", "top-")) + (" (EMA)" if m != base else "")
            for si, step in enumerate(steps):
                pts = [(n, at[(step, n, m)]) for n in sizes if (step, n, m) in at]
                if not pts:
                    continue
                final = si == len(steps) - 1
                color = COLORS[(ri if compare else mi) % len(COLORS)]
                style = STYLES[mi % len(STYLES)] if compare else "-"
                label = f"{labels[ri]}: {name}" if compare else f"{name}, step {step:g}"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", color=color,
                        alpha=1.0 if final else 0.25 + 0.5 * si / max(len(steps) - 1, 1), linewidth=1.8 if final else 1.0,
                        markersize=5 if final else 3, label=label)  # fmt: skip
                lines += 1
                if final and not compare:
                    for n, y in pts:
                        ax.annotate(f"{y:.1f}%" if panel.percent else f"{y:.3g}", (n, y), textcoords="offset points",
                                    xytext=(0, 6), ha="center", fontsize=8, color=color)  # fmt: skip
    fig.text(0.012, 0.975, panel.title, fontsize=12, va="top", ha="left")
    ax.set_xlabel(SIZE_AXIS[next(iter(parsed.values()))[0]])
    ax.set_xticks(sizes)
    span = (sizes[-1] - sizes[0]) or 1
    ax.set_xlim(sizes[0] - 0.08 * span, sizes[-1] + 0.08 * span)
    ax.set_ylabel(panel.ylabel)
    if panel.percent:
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
    ax.margins(y=0.15)  # room for the values written above the points
    ax.grid(True, alpha=0.3)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.14, top=0.88)
    if lines:
        ax.legend(fontsize=8, frameon=False, loc="best", ncol=1 if lines <= 4 else 2)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()
