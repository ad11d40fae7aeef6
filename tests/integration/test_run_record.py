"""What a run folder records and what the terminal shows, read from the real files of tiny digits runs
through the CLI: train.log, summary.json's environment, TensorBoard events, config.yaml, the fitted
warmup, the end-of-run summary and its next commands, and the progress bar at 80 columns."""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from vitscale import __version__
from vitscale.cli import main
from vitscale.config import config_to_dict, load_config

ROOT = Path(__file__).resolve().parents[2]
TINY = ["train.epochs=0", "train.max_steps=20", "train.batch_size=32", "model.num_layers=1", "model.hidden_size=32",
        "model.ffn_hidden_size=64", "train.log_every=5", "eval.every=10", "checkpoint.every=0", "log.progress=plain",
        "eval.batch_size=300"]  # fmt: skip


def _summary_block(printed: str) -> list[str]:
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("vit_debug: 20 steps in "))
    return lines[start:]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One tiny digits run through `vitscale train` (digits_vit's 100-step warmup in a 20-step run),
    with its printed output."""
    out = tmp_path_factory.mktemp("record") / "run"
    with pytest.MonkeyPatch.context() as mp:
        import io

        buf = io.StringIO()
        mp.setattr(sys, "stdout", buf)
        assert main(["train", "digits_vit", f"train.output_dir={out}", *TINY]) == 0
    return out, buf.getvalue()


def test_summary_records_versions_devices_layout_times_and_command(run):
    out, _ = run
    summary = json.loads((out / "summary.json").read_text())
    env = summary["env"]
    assert env["vitscale"] == __version__ and env["torch"] == torch.__version__ and env["cuda"] == torch.version.cuda
    commit = env["git_commit"]  # this checkout's commit (the tests run from a git checkout), or None
    assert commit is None or re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", commit), commit
    assert env["gpu_count"] == torch.cuda.device_count() == len(env["gpus"])
    assert env["device"] == "cpu" and env["layout"]["world_size"] == 1 and env["layout"]["tp"] == 1
    assert env["command"] == shlex.join(["vitscale", "train", "digits_vit", f"train.output_dir={out}", *TINY])
    assert 0 < summary["wall_time_s"] <= summary["total_time_s"]
    assert summary["started_at"] <= summary["finished_at"]
    assert summary["units"] == {"accuracy": "%", "recall": "%", "mfu": "%"}
    # the report shows the environment
    page = (out / "report.html").read_text()
    env_table = page[page.index('id="environment"') :]
    assert f'<td>torch</td><td class="num">{torch.__version__}</td>' in env_table
    assert "<td>layout.world_size</td>" in env_table and "<td>command</td>" in env_table


def test_train_log_holds_what_was_printed(run):
    out, printed = run
    log = (out / "train.log").read_text()
    first, *rest = log.splitlines()
    assert first.startswith("==> ") and first.endswith(shlex.join(["vitscale", "train", "digits_vit",
                                                                    f"train.output_dir={out}", *TINY]))  # fmt: skip
    remaining = iter(rest)  # everything printed, line for line and in order (and any warning lines between)
    assert all(line in remaining for line in printed.splitlines())
    assert "\r" not in log and "\x1b" not in log
    for step in (1, 5, 10, 15, 20):
        assert sum(line.startswith(f"step {step}/20  loss ") for line in rest) == 1, step
    assert sum(line.startswith("step 10/20  eval  val_top1 ") for line in rest) == 1
    # MFU in percent on the terminal, as in the files
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert f"MFU {rows[1]['mfu']:.2f}%" in rest[[i for i, x in enumerate(rest) if x.startswith("step 5/20 ")][0]]


def test_warmup_longer_than_the_run_is_fitted_with_one_notice(run):
    out, printed = run
    notices = [line for line in printed.splitlines() if line.startswith("schedule:")]
    assert notices == ["schedule: a 100-step warmup does not fit a 20-step run: using 10 steps (a warmup is at "
                       "most half the run)"]  # fmt: skip
    lr = {r["step"]: r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    assert lr[5] == pytest.approx(1.5e-3) and lr[10] == pytest.approx(3e-3)  # the peak at step 10 of 20
    assert lr[20] == pytest.approx(0.0, abs=1e-12)  # and the cosine decays to its floor by the last step
    assert "no validation data" not in printed


def test_run_ends_with_a_short_summary_whose_next_commands_work(run, capsys):
    out, printed = run
    block = _summary_block(printed)
    summary = json.loads((out / "summary.json").read_text())
    assert block[1].strip() == (f"val_top1 {summary['val_top1']:.2f}%  val_top5 {summary['val_top5']:.2f}%  "
                                f"val_loss {summary['val_loss']:.4g}")  # fmt: skip
    assert f"  weights      {out / 'model.safetensors'}" in block
    assert any(line.startswith(f"  report       {out / 'report.html'}  (open file://") for line in block)
    assert any(line.startswith(f"  log          {out / 'train.log'}") for line in block)
    assert f"  tensorboard  tensorboard --logdir {out}" in block
    assert not any(line.lstrip().startswith("{") for line in printed.splitlines())  # no JSON dump
    nxt = [line.strip() for line in block[block.index("Next:") + 1 :]]
    assert [c.split()[:2] for c in nxt] == [["vitscale", "eval"], ["vitscale", "report"], ["vitscale", "export"]]
    capsys.readouterr()
    assert main(shlex.split(nxt[0])[1:]) == 0  # vitscale eval RUN/config.yaml checkpoint.path=RUN
    assert json.loads(capsys.readouterr().out)["val_top1"] == pytest.approx(summary["val_top1"])
    (out / "report.html").unlink()
    assert main(shlex.split(nxt[1])[1:]) == 0 and (out / "report.html").is_file()
    assert main(shlex.split(nxt[2])[1:]) == 0 and (out / "export" / "onnx" / "image.onnx").is_file()


def test_json_flag_prints_the_summary_for_scripts(tmp_path, capsys):
    out = tmp_path / "run"
    over = [*TINY, "train.max_steps=2", "eval.every=0", "log.progress=none", "log.report=false", "log.tensorboard=false"]
    assert main(["train", "digits_vit", f"train.output_dir={out}", *over, "--json"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed[printed.index("\n{") + 1 :]) == json.loads((out / "summary.json").read_text())


def test_tensorboard_by_default_with_scalars_and_hyperparameters(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    out, _ = run
    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    assert {"loss", "lr", "grad_norm", "mfu", "val_top1", "val_loss"} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("loss")] == [1, 5, 10, 15, 20]
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["optim.lr"].number_value == pytest.approx(3e-3)
    assert start.hparams["model.overrides.hidden_size"].number_value == 32
    assert start.hparams["model.name"].string_value == "vit_debug"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} == {"val_top1", "val_top5", "val_loss"}


def test_no_validation_and_no_tensorboard_package_are_said_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if the package were not installed
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    over = ["data.format=synthetic", "data.synthetic_size=64", "data.num_classes=10", "data.num_workers=0", "model.num_layers=1",
            "train.max_steps=4", "train.epochs=0", "train.batch_size=16", "train.log_every=2", "log.progress=plain",
            "log.report=false", "checkpoint.export_safetensors=false"]  # fmt: skip
    asked = tmp_path / "asked"
    assert main(["train", "digits_vit", f"train.output_dir={asked}", "log.tensorboard=true", *over]) == 0
    printed = capsys.readouterr().out
    no_val = [line for line in printed.splitlines() if line.startswith("no validation data")]
    no_tb = [line for line in printed.splitlines() if "tensorboard package is not installed" in line]
    assert len(no_val) == 1 and "set data.val_split" in no_val[0] and "val_path" not in no_val[0]  # what synthetic reads
    assert len(no_tb) == 1 and no_tb[0].startswith("log.tensorboard=true")
    assert not (asked / "tb").exists()
    assert "no evaluation (the run has no validation data)" in printed  # the summary says so too
    assert "weights" not in printed and "vitscale export" not in printed  # nothing exported: not offered
    log = (asked / "train.log").read_text()
    assert no_val[0] in log and no_tb[0] in log
    # by default (null): without the package, nothing to say about it
    assert main(["train", "digits_vit", f"train.output_dir={tmp_path / 'auto'}", *over]) == 0
    assert "tensorboard" not in capsys.readouterr().out.lower()


def test_config_yaml_holds_the_groups_of_the_task_in_one_style(run, capsys):
    out, _ = run
    text = (out / "config.yaml").read_text()
    tree = yaml.safe_load(text)
    # the common groups, then the classification task's own (distill), in the tasks' table order
    assert list(tree) == ["model", "data", "optim", "schedule", "train", "parallel", "precision", "checkpoint",
                          "eval", "evals", "log", "distill"]  # fmt: skip
    assert not any(k.startswith(("csv_", "webdataset_")) or k == "caption_context_length" for k in tree["data"])
    flow = text.replace("overrides: {}", "").replace(": []", "")  # an empty mapping or list has no block form
    assert "[" not in flow and "{" not in flow  # block style only
    cfg = load_config(out / "config.yaml")
    assert config_to_dict(cfg) == tree  # reloads to the same run
    assert cfg.model.overrides["hidden_size"] == 32 and cfg.train.max_steps == 20
    # --print-config shows what a run's config.yaml holds: each task with its own groups
    groups = {}
    for name in ("digits_clip", "digits_volo"):
        assert main(["train", name, "--print-config"]) == 0
        groups[name] = list(yaml.safe_load(capsys.readouterr().out))
    assert "clip" in groups["digits_clip"] and not {"token_label", "teacher"} & set(groups["digits_clip"])
    assert {"token_label", "teacher"} <= set(groups["digits_volo"]) and "clip" not in groups["digits_volo"]
    assert main(["train", "digits_clip", "data.format=csv", "data.train_path=x.csv", "--print-config"]) == 0
    data = yaml.safe_load(capsys.readouterr().out)["data"]
    assert data["csv_caption_key"] == "title" and "webdataset_mode" not in data


def _run_on_a_terminal(argv: list[str], cols: int, cwd: Path) -> bytes:
    """Run ``argv`` with its stdout and stderr on a pseudo-terminal ``cols`` wide; returns what it wrote."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
    env = {**os.environ, "COLUMNS": str(cols), "LINES": "24", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd, close_fds=True)
    os.close(slave)
    data = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                data += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=300) == 0, data.decode(errors="replace")[-3000:]
    finally:
        os.close(master)
    return data


def test_progress_bar_keeps_bar_and_eta_at_80_columns(tmp_path):
    out = tmp_path / "run"
    over = [o for o in TINY if not o.startswith("log.progress")] + ["log.progress=auto", "log.report=false",
                                                                    "log.tensorboard=false"]  # fmt: skip
    text = _run_on_a_terminal([sys.executable, "-m", "vitscale", "train", "digits_vit", f"train.output_dir={out}",
                               *over], 80, tmp_path).decode()  # fmt: skip
    lines = text.replace("\r\n", "\n").split("\n")
    bars = [seg for line in lines for seg in line.split("\r") if re.match(r"\s*\d+%\|", seg)]
    assert len(bars) >= 5, text[-2000:]  # auto on a terminal: the bar, redrawn as the run goes
    for seg in bars:
        assert len(seg) <= 80, seg
        bar = seg.split("|")[1]
        assert len(bar) >= 20, seg  # the bar itself keeps its width (the postfix is only the loss)
        assert re.search(r"\[\d\d:\d\d<(\d\d:\d\d|\?)", seg), seg  # elapsed < ETA
    assert re.match(r"100%\|█+\| 20/20 \[", bars[-1]), bars[-1]
    assert "loss=" in bars[-1]
    # metrics on lines of their own, above the bar
    metric_lines = [seg for line in lines for seg in line.split("\r") if seg.startswith("step ")]
    assert {m.split()[1] for m in metric_lines} >= {"1/20", "5/20", "10/20", "15/20", "20/20"}
    # train.log keeps the lines and the bar's final state, not its redraws
    log = (out / "train.log").read_text()
    assert "\r" not in log and "\x1b" not in log
    in_log = [line for line in log.splitlines() if re.match(r"\s*\d+%\|", line)]
    assert len(in_log) == 1 and in_log[0].startswith("100%|")
    assert sum(line.startswith("step ") and "  loss " in line for line in log.splitlines()) == 5
