"""report.html from real digits runs through the CLI: written by training (at each evaluation and at the
end), self-contained, with the run's plots, config and final metric; `vitscale report` redraws one run
and overlays several; runs in progress, from an older vitscale or with non-finite values still draw."""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import re
import shutil
import struct
import threading
import time

import numpy as np
import pytest
from PIL import Image

from vitscale.cli import main

TINY = ["train.epochs=0", "train.max_steps=40", "train.batch_size=32", "model.num_layers=2", "model.hidden_size=64",
        "model.ffn_hidden_size=128", "schedule.warmup_steps=5", "train.log_every=5", "eval.every=20",
        "log.progress=none", "checkpoint.every=0"]  # fmt: skip
SINGLE_RUN_PLOTS = ("loss", "accuracy", "lr", "throughput", "mfu", "grad_norm")


def _train(out, *extra):
    assert main(["train", "digits_vit", f"train.output_dir={out}", *TINY, *extra]) == 0


def _figures(page: str) -> dict[str, bytes]:
    """id -> PNG bytes of every plot in the page."""
    found = re.findall(r'<figure id="plot-([^"]+)"><img alt="[^"]+" src="data:image/png;base64,([^"]+)">', page)
    return {pid: base64.b64decode(data) for pid, data in found}


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", png[16:24])


def _self_contained(page: str) -> None:
    assert not re.search(r"<(script|link|iframe)\b", page, re.I)
    assert "href=" not in page and "url(" not in page
    srcs = re.findall(r'src="([^"]*)"', page)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two real digits runs (lr 3e-3 and 1e-3); the first watched while it trains."""
    root = tmp_path_factory.mktemp("report_runs")
    seen: list[str] = []
    done = threading.Event()

    def watch(path):  # every distinct report the trainer writes while run "a" trains
        while not done.is_set():
            try:
                text = path.read_text()
            except FileNotFoundError:
                text = None
            if text and (not seen or text != seen[-1]):
                seen.append(text)
            time.sleep(0.01)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VITSCALE_CACHE_DIR", str(root / "cache"))
        t = threading.Thread(target=watch, args=(root / "a" / "report.html",), daemon=True)
        t.start()
        try:
            _train(root / "a", "optim.lr=3e-3")
        finally:
            done.set()
            t.join()
        _train(root / "b", "optim.lr=1e-3")
    return root, seen


def test_training_writes_a_self_contained_report(runs):
    root, seen = runs
    out = root / "a"
    page = (out / "report.html").read_text()
    _self_contained(page)
    figs = _figures(page)
    assert set(SINGLE_RUN_PLOTS) <= set(figs), sorted(figs)
    for pid, png in figs.items():
        assert _png_size(png) == (640, 360), pid
        assert Image.open(io.BytesIO(png)).getextrema()  # decodes
    # the final metric and the settings of this run
    summary = json.loads((out / "summary.json").read_text())
    assert f'<div class="v">{summary["val_top1"]:.2f}%</div><div class="k">val_top1</div>' in page
    assert "finished: 40 steps" in page
    assert f'<pre id="config">{html.escape((out / "config.yaml").read_text())}</pre>' in page
    assert "<td>optim.lr</td><td class=\"num\">0.003</td>" in page
    # a report written at the evaluation of step 20, while the run was still going
    mid = [p for p in seen if "in progress (or stopped): step 20 of 40 logged" in p]
    assert mid, [re.search(r'<p class="sub">[^<]*', p).group(0) for p in seen]
    assert set(SINGLE_RUN_PLOTS) <= set(_figures(mid[0]))


def test_report_command_redraws_one_run(runs, tmp_path, capsys):
    root, _ = runs
    out = tmp_path / "a_again.html"
    assert main(["report", str(root / "a"), "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    page = out.read_text()
    _self_contained(page)
    assert set(SINGLE_RUN_PLOTS) <= set(_figures(page))


def _has_colour(png: bytes, rgb: tuple[int, int, int], min_pixels: int = 20) -> bool:
    px = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16).reshape(-1, 3)
    return int((np.abs(px - np.array(rgb)).max(axis=1) <= 12).sum()) >= min_pixels


def test_report_command_overlays_two_runs(runs, tmp_path, monkeypatch, capsys):
    from vitscale.tools.report.plots import COLORS

    root, _ = runs
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(root / "a"), str(root / "b")]) == 0  # default: ./report.html
    assert "report.html" in capsys.readouterr().out
    page = (tmp_path / "report.html").read_text()
    _self_contained(page)
    overview = re.search(r'<table id="overview">.*?</table>', page).group(0)
    assert "<td>a</td>" in overview and "<td>b</td>" in overview
    for run in ("a", "b"):
        top1 = json.loads((root / run / "summary.json").read_text())["val_top1"]
        assert f"{top1:.2f}%" in overview
    diff = re.search(r'<table id="settings-diff">.*?</table>', page).group(0)
    assert "optim.lr" in diff and "0.003" in diff and "0.001" in diff and "output_dir" not in diff
    figs = _figures(page)
    assert {"loss", "val-loss", "val-top1", "val-top5", "lr", "throughput", "mfu"} <= set(figs), sorted(figs)
    blue, red = (tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)) for c in COLORS[:2])
    for pid in ("loss", "lr", "val-top1"):  # both runs' curves in one picture, a colour each
        assert _has_colour(figs[pid], blue) and _has_colour(figs[pid], red), pid


def test_report_tolerates_missing_fields_and_non_finite_values(runs, tmp_path):
    """An older run (no MFU, no grad norm, no evaluation), still in progress (no summary.json), with a
    NaN loss and a line cut by a kill: the report still draws and says what it found."""
    from vitscale.tools.report import write_report

    root, _ = runs
    run = tmp_path / "old_run"
    run.mkdir()
    shutil.copy(root / "a" / "config.yaml", run / "config.yaml")
    rows = [json.loads(line) for line in (root / "a" / "metrics.jsonl").read_text().splitlines()]
    with open(run / "metrics.jsonl", "w") as f:
        for r in rows[:5]:
            r = {k: v for k, v in r.items() if k in ("step", "loss", "lr", "img_per_s")}
            if r["step"] == 10:
                r["loss"] = "nan"
            f.write(json.dumps(r) + "\n")
        f.write('{"step": 30, "loss": 1.')  # cut by a kill
    page = write_report(run).read_text()
    _self_contained(page)
    assert set(_figures(page)) == {"loss", "lr", "throughput"}
    assert "in progress (or stopped): step 20 of 40 logged" in page
    assert "loss: 1 non-finite value(s), first at step 10" in page
    assert "1 unreadable line(s) skipped" in page
    assert "no evaluation results logged" in page
    assert "No summary.json yet" in page

    # a folder with only a config (a run that died before its first log line)
    (run / "metrics.jsonl").unlink()
    page = write_report(run).read_text()
    assert "No curves yet" in page and not _figures(page)


def test_report_command_refuses_what_is_not_a_run(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip() == f"vitscale report: {tmp_path / 'missing'}: no such run folder"
    assert main(["report", str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err


def test_a_report_that_cannot_be_written_does_not_fail_training(tmp_path, caplog):
    out = tmp_path / "run"
    (out / "report.html").mkdir(parents=True)  # a folder where the report should go: the write fails
    with caplog.at_level(logging.WARNING, logger="vitscale.report"):
        _train(out, "train.max_steps=5", "eval.every=0")
    assert json.loads((out / "summary.json").read_text())["steps"] == 5
    warnings = [r.getMessage() for r in caplog.records if r.name == "vitscale.report"]
    assert warnings and all(w.startswith("report.html not written: ") and "\n" not in w for w in warnings)


def test_report_reads_each_run_in_the_units_it_was_written_in(runs, tmp_path):
    """Today every ratio is in percent in a run's files, and summary.json says so ("units"); a finished run
    of an older vitscale (no "units") wrote MFU and CLIP's zero-shot / retrieval as fractions. The report
    shows both in percent."""
    from vitscale.tools.report import write_report

    root, _ = runs
    assert json.loads((root / "a" / "summary.json").read_text())["units"] == {"accuracy": "%", "recall": "%", "mfu": "%"}
    for name, scale in (("today", 100.0), ("older", 1.0)):
        run = tmp_path / name
        run.mkdir()
        rows = [{"step": s, "loss": 2.0 / s, "mfu": 0.125 * scale, "zeroshot_top1": 0.5 * s * scale} for s in (1, 2)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary = {"model": "clip_debug", "steps": 2, "zeroshot_top1": 0.957 * scale,
                   "text_retrieval_recall@1": 0.25 * scale}  # fmt: skip
        if scale == 100.0:
            summary["units"] = {"accuracy": "%", "recall": "%", "mfu": "%"}
        (run / "summary.json").write_text(json.dumps(summary))
        page = write_report(run).read_text()
        assert '<div class="v">95.70%</div><div class="k">zeroshot_top1</div>' in page, name
        assert '<div class="v">25.00%</div><div class="k">text_retrieval_recall@1</div>' in page, name
        assert {"mfu", "zeroshot"} <= set(_figures(page))


def _summary_table(page: str) -> str:
    return re.search(r'<h2 id="summary-h">Summary</h2>\s*(<table>.*?</table>)', page).group(1)


def _files_table(page: str) -> str:
    return re.search(r'<h2 id="files">Files in the run folder</h2>\s*(<table>.*?</table>)', page).group(1)


def test_report_reads_as_the_project_units_percent_and_files(runs):
    """Every axis has a unit (data_wait in %, on its own panel, not a bare key), the summary table writes
    its ratios with a % sign as the headline does, and the files listed are those the run keeps: the
    training's run.lock, there while the run trains, is never listed."""
    from vitscale.tools.report import read_run
    from vitscale.tools.report.plots import plan

    root, seen = runs
    run = read_run(root / "a")
    panels = [p.id for p, _ in plan([run], compare=False)]
    assert not [pid for pid in panels if pid.startswith("other-")], panels  # no key drawn under its bare name
    share, keys = next((p, keys) for p, keys in plan([run], compare=False) if p.id == "time_shares")
    assert share.percent and share.ylabel == "share of wall time (%)" and keys == ["data_wait"]
    page = (root / "a" / "report.html").read_text()
    assert "time_shares" in _figures(page)

    summary = json.loads((root / "a" / "summary.json").read_text())
    table = _summary_table(page)
    for key in ("val_top1", "val_top5"):
        assert f'<td>{key}</td><td class="num">{summary[key]:.2f}%</td>' in table, key
    assert f'<td>val_loss</td><td class="num">{summary["val_loss"]:.6g}</td>' in table  # a loss is no ratio
    assert '<td>steps</td><td class="num">40</td>' in table

    mid = [p for p in seen if "in progress (or stopped)" in p]
    assert mid and not (root / "a" / "run.lock").exists()  # the run held it while it trained, and removed it
    for p in (*mid, page):
        files = _files_table(p)
        assert "<td>config.yaml</td>" in files and "<td>metrics.jsonl</td>" in files
        assert "run.lock" not in files


def test_naflex_report_draws_accuracy_per_sequence_length(tmp_path):
    """A NaFlex run of digits_naflex as it ships (its sizes evaluation at 36, 64 and 100 patches): the
    sizes plot holds the accuracies only, in %, against the sequence length (top-1 and top-5 a colour
    each); the losses have their own panel; each logged step's sequence length is drawn as points on a
    patches axis."""
    from vitscale.tools.report import read_run
    from vitscale.tools.report.plots import COLORS, legend_name, plan

    out, other = tmp_path / "naflex", tmp_path / "naflex_seed1"
    for folder, seed in ((out, 0), (other, 1)):
        assert main(["train", "digits_naflex", f"train.output_dir={folder}", f"train.seed={seed}", "train.epochs=0",
                     "train.max_steps=6", "train.log_every=1", "model.num_layers=1", "schedule.warmup_steps=2",
                     "log.progress=none", "data.tokens_per_batch=1600", "checkpoint.every=0",
                     "log.tensorboard=false"]) == 0  # fmt: skip
    run = read_run(out)
    panels = {p.id: (p, keys) for p, keys in plan([run], compare=False)}
    sizes, keys = panels["eval-sizes"]
    assert sizes.percent and sizes.ylabel == "accuracy (%)"
    assert keys == [f"sizes_seq{n}_top{k}" for n in (36, 64, 100) for k in (1, 5)]  # by length, top-1 before top-5
    assert [legend_name(k) for k in keys[:2]] == ["36 patches, top-1", "36 patches, top-5"]
    loss, loss_keys = panels["eval-sizes-loss"]
    assert not loss.percent and loss.ylabel == "loss (mean per image)"
    assert loss_keys == [f"sizes_seq{n}_loss" for n in (36, 64, 100)]
    seq, seq_keys = panels["seq_len"]
    assert seq.points and seq.ylabel == "patches per image" and seq_keys == ["seq_len"]
    assert not [pid for pid in panels if pid.startswith("other-")], sorted(panels)

    page = (out / "report.html").read_text()
    figs = _figures(page)
    assert {"eval-sizes", "eval-sizes-loss", "seq_len", "time_shares"} <= set(figs), sorted(figs)
    blue, red = (tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)) for c in COLORS[:2])
    assert _has_colour(figs["eval-sizes"], blue) and _has_colour(figs["eval-sizes"], red)  # top-1 and top-5
    assert _has_colour(figs["eval-sizes-loss"], blue) and not _has_colour(figs["eval-sizes-loss"], red)
    summary = json.loads((out / "summary.json").read_text())
    table = _summary_table(page)
    headline = re.search(r'<div class="headline">.*?</div></div></div>', page).group(0)
    for n in (36, 64, 100):
        assert f'<td>sizes_seq{n}_top1</td><td class="num">{summary[f"sizes_seq{n}_top1"]:.2f}%</td>' in table
        assert f'<div class="k">sizes_seq{n}_top1</div>' in headline  # the top-1 per length at a glance
        assert f"sizes_seq{n}_top5" not in headline and f"sizes_seq{n}_loss" not in headline  # those: table, plot

    # two runs overlaid: the sizes plot stays one panel (each run's final evaluation against the size, a
    # colour per run), not a panel per key over steps
    assert main(["report", str(out), str(other), "--out", str(tmp_path / "cmp.html")]) == 0
    figs = _figures((tmp_path / "cmp.html").read_text())
    assert {"eval-sizes", "eval-sizes-loss"} <= set(figs) and not [f for f in figs if f.startswith("sizes-")], sorted(figs)
    for pid in ("eval-sizes", "eval-sizes-loss"):
        assert _has_colour(figs[pid], blue) and _has_colour(figs[pid], red), pid
