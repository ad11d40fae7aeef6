"""Attacks on runs, round two (docs/trust.md, "Attacks tried"): each built here as a stranger's file
would reach vitscale — a config, a run folder's stored config.yaml, a data folder, links in a run
folder, settings — through the CLI; then the leftovers of an interrupted save or a failed write; and
what held the first time, kept tested. A hang would be a failure: the commands that once hung run in
a subprocess under a timeout."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from helpers import no_hang
from PIL import Image

from vitscale.cli import main

TINY = ["model.num_layers=1", "train.batch_size=16", "data.num_workers=0", "log.flops=false", "eval.every=0", "log.progress=plain",
        "log.report=false"]  # fmt: skip
REPO = Path(__file__).parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "PYTHONUNBUFFERED": "1"}
CANARY_CODE = "import pathlib; pathlib.Path({!r}).write_text('ran')"


def _last_lines(text: str) -> list[str]:
    return [line for line in text.strip().splitlines() if line.startswith("vitscale ")]


def _bomb(levels: int = 9) -> str:
    """A YAML 'billion laughs': each anchor a list of ten aliases of the previous (10^levels strings)."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@pytest.fixture
def finished(finished_run) -> Path:
    """A real run folder (the session's tiny run, tests/conftest.py): checkpoint at step 2, config.yaml,
    metrics.jsonl, train.log, summary.json, report.html."""
    return finished_run


def _copy(run: Path, tmp: Path) -> Path:
    dst = tmp / "run"
    shutil.copytree(run, dst)
    return dst


# ------------------------------------------------------------------------------------- 3. YAML
@pytest.mark.parametrize(
    "yaml_text, reason",
    [
        ("model:\n  name: vit_debug\n  overrides:\n    drop_path_rate: *a9\n", "more than 200,000 values once aliases are expanded"),
        ("train:\n  seed: " + "[" * 50_000 + "]" * 50_000 + "\n", "nest"),
        ("data:\n  train_path: !!python/object/apply:exec [{code!r}]\n", "the tag !!python/object/apply:exec is not allowed"),
        ("train:\n  max_steps: 5\n  seed: 1\n  max_steps: 50000\n", "line 4: the key 'max_steps' appears twice in one mapping"),
    ],
    ids=["alias-bomb", "50000-deep", "python-tag", "repeated-key"],
)
def test_config_bombs_and_tags_are_one_line(tmp_path, capsys, yaml_text, reason):
    """An alias bomb as a config value hung `vitscale train` (the model config formats it with !r); a
    50,000-deep nest gave ~3,000 lines of RecursionError; a !!python tag a ConstructorError traceback;
    a key said twice was read as its last value, silently (a built-in config held two copies of a group)."""
    canary = tmp_path / "canary"
    text = (_bomb() if "*a9" in yaml_text else "") + yaml_text.replace("{code!r}", repr(CANARY_CODE.format(str(canary))))
    (tmp_path / "attack.yaml").write_text(text)
    with no_hang(120):
        rc = main(["train", str(tmp_path / "attack.yaml"), f"train.output_dir={tmp_path / 'run'}"])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and reason in err[0] and "attack.yaml" in err[0], err
    assert not canary.exists() and not (tmp_path / "run").exists()


def test_override_alias_bomb_is_one_line(tmp_path, capsys):
    inner = '&a ["x","x","x","x","x","x","x","x","x","x"]'
    value = inner
    for i in range(8):  # 10^9 values in a few hundred bytes of command line
        value = f"&b{i} [" + ", ".join([value] + [f"*{'a' if i == 0 else f'b{i - 1}'}"] * 9) + "]"
    with no_hang(120):
        assert main(["train", "digits_vit", f"data.mean={value}", f"train.output_dir={tmp_path / 'run'}"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "override data.mean" in err[0] and "more than 200,000 values" in err[0]


def test_a_bomb_in_a_stored_config_yaml(finished, tmp_path):
    """In a run folder's config.yaml it hung the resume and `vitscale report` (a fresh process each,
    as a user runs them)."""
    run = _copy(finished, tmp_path)
    (run / "config.yaml").write_text(_bomb() + "model: *a9\n")
    script = (f"from vitscale.cli import main; import sys; sys.exit(10 * main({['train', 'digits_vit', 'train.max_steps=2', 'checkpoint.every=2', f'train.output_dir={run}', 'model.hidden_size=16', *TINY]!r})"
              f" + main(['report', {str(run)!r}]))")  # fmt: skip
    res = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=240)
    assert res.returncode == 20, res.stderr[-2000:]  # the resume refused (2), the report drawn (0)
    assert _last_lines(res.stderr) == [line for line in res.stderr.splitlines() if "this resume cannot be checked" in line]
    assert "config.yaml line 6: more than 200,000 values" in res.stderr
    assert "config.yaml unreadable" in (run / "report.html").read_text()  # a note on the page, nothing expanded


# ------------------------------------------------------------------------------------- 4. files that are not files
def _image_folder(root: Path, per_class: int = 16) -> Path:
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (8, 8), (i * 10, c * 100, 50)).save(root / f"c{c}" / f"{i}.png")
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_fifo_and_socket_in_an_image_folder_are_skipped(tmp_path, workers):
    """A FIFO named x.png hung training forever after step 1, with or without workers."""
    data = _image_folder(tmp_path / "data")
    os.mkfifo(data / "c0" / "x.png")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(data / "c1" / "y.png"))
    try:
        with no_hang(120):
            rc = main(["train", "digits_vit", "data.format=imagefolder", f"data.train_path={data}", "data.img_size=8", "model.patch_dim=4",
                       f"train.output_dir={tmp_path / 'run'}", "train.max_steps=4", "train.batch_size=8", f"data.num_workers={workers}", *TINY[3:]])  # fmt: skip
    finally:
        sock.close()
    assert rc == 0
    log = (tmp_path / "run" / "train.log").read_text()
    assert "skipped 2 entries that are not regular files (never opened)" in log and "x.png (a FIFO)" in log and "y.png (a socket)" in log


def test_fifo_listed_in_a_csv_is_skipped_and_counted(tmp_path):
    """A source that lists files itself (a CSV of image paths): the FIFO is met when a sample is read,
    opened without blocking, found not to be a file and skipped like an undecodable image."""
    data = _image_folder(tmp_path / "data", per_class=8)
    os.mkfifo(data / "c0" / "x.png")
    rows = [f"{p.relative_to(data)},a photo of {p.parent.name}" for p in sorted(data.rglob("*.png"))]
    (data / "pairs.csv").write_text("filepath,title\n" + "\n".join(rows) + "\n")
    with no_hang(120):
        rc = main(["train", "digits_clip", "data.format=csv", f"data.train_path={data / 'pairs.csv'}", "train.batch_size=16", "train.max_steps=2",
                   f"train.output_dir={tmp_path / 'run'}", "model.vision.num_layers=1", "model.text.num_layers=1", "clip.zeroshot=false",
                   "clip.retrieval=false", *TINY[2:]])  # fmt: skip
    assert rc == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["skipped_files"] >= 1 and "x.png is a FIFO, not a regular file" in (tmp_path / "run" / "train.log").read_text()


# ------------------------------------------------------------------------------------- 5. links in a run folder
@pytest.mark.parametrize("name", ["metrics.jsonl", "train.log", "config.yaml", "summary.json", "tb", "classnames.txt"])
def test_links_inside_a_run_folder_are_refused(finished, tmp_path, capsys, name):
    """metrics.jsonl / train.log linked to a file outside the run were appended to on resume."""
    run = _copy(finished, tmp_path)
    outside = tmp_path / f"outside-{name}"
    (run / name).rename(outside)
    (run / name).symlink_to(outside)
    before = {p: p.read_bytes() for p in ([outside] if outside.is_file() else outside.rglob("*"))}
    rc = main(["train", "digits_vit", "train.max_steps=3", "checkpoint.allow_changes=train.max_steps", f"train.output_dir={run}",
               "model.hidden_size=16", *TINY])  # fmt: skip
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 1 and len(err) == 1 and f"{run / name} is a symbolic link" in err[0] and "nothing inside a run folder is followed" in err[0]
    assert {p: p.read_bytes() for p in before} == before and not (run / "run.lock").exists()
    if name == "config.yaml":  # nor does `vitscale report` show a linked file from elsewhere
        outside.write_text("secret: do-not-show\n")
        assert main(["report", str(run)]) == 0
        page = (run / "report.html").read_text()
        assert "config.yaml is a symbolic link" in page and "do-not-show" not in page
    if name == "classnames.txt":  # nor does `vitscale eval` map the labels to a linked class list
        assert main(["eval", str(run / "config.yaml"), f"checkpoint.path={run}", "data.num_workers=0"]) == 1
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and f"{run / name} is a symbolic link" in err[0], err


# ------------------------------------------------------------------------------------- 6. degenerate settings
@pytest.mark.parametrize(
    "override, message",
    [
        ("data.std=[0,0,0]", "data.std[0]=0.0 must be greater than 0"),
        ("data.mean=[.nan,0.5,0.5]", "data.mean[0]=nan is not a finite number"),
        ("optim.weight_decay=.nan", "optim.weight_decay=nan is not a finite number"),
        ("train.grad_clip=.nan", "train.grad_clip=nan is not a finite number"),
        ("train.epochs=.inf", "train.epochs=inf is not a finite number"),
        ("model.drop_path_rate=.nan", "model.drop_path_rate=nan is not a finite number"),
        ("optim.eps=0", "optim.eps=0.0 must be greater than 0"),
        ("optim.betas=[0.9,1.5]", "optim.betas[1]=1.5 must be in [0, 1)"),
        ("optim.weight_decay=-0.1", "optim.weight_decay=-0.1 must be at least 0"),
        ("schedule.min_lr=-1", "schedule.min_lr=-1.0 must be at least 0"),
        ("data.hflip=2", "data.hflip=2.0 must be in [0, 1]"),
        ("data.rrc_scale=[0.9,0.1]", "data.rrc_scale=[0.9, 0.1] must be 0 < low <= high <= 1"),
    ],
)
def test_degenerate_settings_are_refused_up_front(tmp_path, capsys, override, message):
    """data.std=[0,0,0] or a NaN in data.mean made every step non-finite, yet exited 0 and exported
    untrained weights; optim.weight_decay=.nan failed only at the save; train.grad_clip=.nan was
    silently "no clipping"."""
    run = tmp_path / "run"
    assert main(["train", "digits_vit", override, f"train.output_dir={run}", *TINY]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and message in err[0], err
    assert not run.exists()  # before any model was built or folder made


def test_a_run_whose_every_step_was_nonfinite_fails(tmp_path, capsys):
    """A std too small to refuse by rule (1e-45 is a positive float) makes every input infinite; with
    the non-finite budgets off, the run used to end with exit 0 and export its untouched weights."""
    run = tmp_path / "run"
    rc = main(["train", "digits_vit", "data.std=[1e-45,1e-45,1e-45]", "train.max_steps=3", "train.max_nonfinite_steps=-1",
               "train.max_consecutive_nonfinite=-1", f"train.output_dir={run}", *TINY])  # fmt: skip
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("vitscale train:")]
    assert rc == 1 and len(err) == 1 and "every one of the 3 steps of this run had a non-finite loss" in err[0]
    assert not (run / "model.safetensors").exists() and not (run / "run.lock").exists()


# ------------------------------------------------------------------------------------- 7. leftovers
def test_two_runs_at_once_then_sigterm_during_a_save(tmp_path):
    """Two runs started together on one folder: exactly one gets it, the other is refused in one line
    (held in round one, kept tested). Then SIGTERM (what a scheduler sends) arrives while the winner
    writes a checkpoint: it used to leave run.lock and a partial .tmp-step_ folder; now the run stops
    with one line and exit code 143, the partial folder removed, the lock released, and the next run
    resumes. The process is frozen (SIGSTOP) while the partial folder holds files, so the signal lands
    in the middle of the save. ``checkpoint.save_on_signal=[]``: the signal ends the run at once (by
    default SIGTERM finishes the step and its save first: tests/integration/test_preemption.py; a second
    signal then ends it at once, through this same path)."""
    run = tmp_path / "run"
    args = ["train", "digits_vit", f"train.output_dir={run}", "train.max_steps=400", "checkpoint.every=1", "checkpoint.keep=1",
            "model.num_layers=2", "model.hidden_size=128", "checkpoint.save_on_signal=[]", *TINY[1:]]  # fmt: skip
    procs = [subprocess.Popen([sys.executable, "-m", "vitscale", *args], cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    ck, caught = run / "checkpoints", None
    try:
        deadline = time.monotonic() + 240
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.01)
        loser = next(p for p in procs if p.poll() is not None)
        winner = next(p for p in procs if p is not loser)
        lines = _last_lines(loser.communicate(timeout=30)[1])
        assert loser.returncode == 1 and len(lines) == 1 and "is in use by another run" in lines[0], lines
        while caught is None and winner.poll() is None and time.monotonic() < deadline:
            tmp = [p for p in (os.scandir(ck) if ck.is_dir() else []) if p.name.startswith(".tmp-step_")]
            if tmp and os.listdir(tmp[0].path):
                os.kill(winner.pid, signal.SIGSTOP)
                if os.path.isdir(tmp[0].path) and os.listdir(tmp[0].path):  # still mid-save, now frozen
                    caught = tmp[0].name
                    os.kill(winner.pid, signal.SIGTERM)
                os.kill(winner.pid, signal.SIGCONT)
            time.sleep(0.0002)
        err = winner.communicate(timeout=120)[1]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert caught, "no save was caught in the middle"
    assert winner.returncode == 143 and _last_lines(err) == ["vitscale train: terminated (SIGTERM)"], err[-2000:]
    assert not (run / "run.lock").exists() and not any(p.name.startswith(".tmp") for p in ck.iterdir())
    assert "stopped by Terminated" in (run / "train.log").read_text()
    steps = sorted(p.name for p in ck.iterdir())
    target = (int(steps[-1][5:]) if steps else 0) + 1  # one more step than the newest intact checkpoint
    assert main([*args, f"train.max_steps={target}", "checkpoint.allow_changes=train.max_steps"]) == 0  # the next run resumes


def test_a_failed_report_write_leaves_no_temporary_file_and_is_not_listed(finished, tmp_path):
    """A full disk while report.html was written left its temporary file, and the end-of-run summary
    listed the stale report.html of an earlier run. Here, in a process with a file-size limit (as
    `ulimit -f`), every file of the run fits but the report (about 200 KB of plots) does not: the
    resumed run, then `vitscale report`."""
    run = _copy(finished, tmp_path)
    old = (run / "report.html").read_bytes()
    train = ["train", "digits_vit", "train.max_steps=3", "checkpoint.allow_changes=train.max_steps", "checkpoint.every=2",
             f"train.output_dir={run}", "model.hidden_size=16", *TINY[:-1], "log.report=true"]  # fmt: skip
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (140_000, 140_000)); from vitscale.cli import main; "
              f"sys.exit(10 * main({train!r}) + main(['report', {str(run)!r}]))")  # fmt: skip
    res = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=240)
    assert res.returncode == 1, res.stderr[-2000:]  # the run succeeded (0), `vitscale report` failed (1)
    assert "report.html not written: OSError" in res.stderr and "File too large" in res.stderr
    listed = [line.split()[0] for line in res.stdout.splitlines() if line.startswith("  ") and len(line.split()) > 1]
    assert "weights" in listed and "log" in listed and "report" not in listed  # the summary lists what this run wrote
    assert _last_lines(res.stderr)[-1].startswith("vitscale report: ") and "File too large" in _last_lines(res.stderr)[-1]
    assert (run / "report.html").read_bytes() == old and not [p for p in run.iterdir() if ".tmp" in p.name]


# ------------------------------------------------------------------------------------- what held, kept tested
def test_markup_in_names_is_escaped_in_the_report(tmp_path):
    """A run folder and a data folder named with HTML: report.html shows the names, never the markup."""
    payload = "<img src=x onerror=alert(1)>"
    data = _image_folder(tmp_path / f"data{payload}")
    run = tmp_path / f"run{payload}"
    assert main(["train", "digits_vit", "data.format=imagefolder", f"data.train_path={data}", "data.img_size=8", "model.patch_dim=4",
                 f"train.output_dir={run}", "train.max_steps=2", "train.batch_size=8", *TINY[2:-1], "log.report=true"]) == 0  # fmt: skip
    page = (run / "report.html").read_text()
    assert payload not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_members_of_a_tar_shard_write_nothing_outside(tmp_path):
    """WebDataset shards with members named ../, absolute paths, a symbolic link and a hard link: the
    shard is read in place (no member is ever extracted), links are not samples. (The hostile images
    come with their label and caption members: complete samples, which the run reads; a sample without
    its label would stop it at start-up, tests/unit/test_data_remote.py.)"""
    assert main(["data", "digits-captions", str(tmp_path / "wds")]) == 0
    shard = sorted((tmp_path / "wds" / "train").glob("*.tar"))[0]
    png = next(m for m in tarfile.open(shard) if m.name.endswith(".png"))
    blob = tarfile.open(shard).extractfile(png).read()
    escape = tmp_path / "escaped"
    with tarfile.open(shard, "a") as tf:
        for stem in (f"../../{escape.name}/a", f"{escape}/b"):
            for ext, data in (("png", blob), ("txt", b"a handwritten zero."), ("cls", b"0")):
                info = tarfile.TarInfo(f"{stem}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        for kind, name in ((tarfile.SYMTYPE, "link.png"), (tarfile.LNKTYPE, "hard.png")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, str(escape / "c.png")
            tf.addfile(info)
    run = tmp_path / "run"
    assert main(["train", "digits_clip", "data.format=webdataset", f"data.train_path={tmp_path / 'wds' / 'train'}",
                 f"data.val_path={tmp_path / 'wds' / 'val'}", "train.max_steps=2", f"train.output_dir={run}", "model.vision.num_layers=1",
                 "model.text.num_layers=1", "clip.zeroshot=false", "clip.retrieval=false", *TINY[1:]]) == 0  # fmt: skip
    assert not escape.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["run", "wds"]
