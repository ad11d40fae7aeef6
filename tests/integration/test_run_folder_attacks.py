"""Attacks on runs, round three (docs/trust.md, "Attacks tried"): a run folder handed over by someone
else (its config.yaml holding shell commands, its names linked elsewhere), a setting the chosen data
format never reads, two runs mirrored to one ``checkpoint.remote``. Each input is built here and run
through the CLI (``vitscale.cli.main``) a user runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import vitscale
from vitscale.cli import main
from vitscale.errors import ConfigError

TINY = ["model.num_layers=1", "model.hidden_size=16", "train.batch_size=16", "data.num_workers=0", "log.flops=false",
        "eval.every=0", "log.progress=none", "log.report=false"]  # fmt: skip
REPO = Path(__file__).parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "PYTHONUNBUFFERED": "1"}


def _err_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.fixture
def finished(finished_run) -> Path:
    """A real run folder (the session's tiny run, tests/conftest.py): a checkpoint at step 2,
    model.safetensors, config.yaml, metrics, summary."""
    return finished_run


def _copy(run: Path, tmp: Path) -> Path:
    dst = tmp / "run"
    shutil.copytree(run, dst)
    return dst


# ------------------------------------------------------------------------- no command runs from a file
def _with_shell(run: Path, tmp: Path, **data) -> dict[str, Path]:
    """Rewrite ``run/config.yaml`` as a stranger would: WebDataset paths that are shell commands, each
    creating its canary file before reading a shard. Returns the canaries."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    canaries = {k: tmp / f"CANARY-{k}" for k in ("train_path", "val_path")}
    cfg["data"].update(format="webdataset", **{k: f"pipe:touch {c}; cat {tmp}/shard.tar" for k, c in canaries.items()})
    cfg["data"].update(data)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return canaries


@pytest.mark.slow
def test_a_run_folders_config_runs_no_shell_command(finished, tmp_path, capsys):
    """A handed-over run's config.yaml with `pipe:touch CANARY; cat shard.tar` paths ran both commands three
    times under `vitscale eval RUN/config.yaml checkpoint.path=RUN` (the command every run prints under
    "Next:"). Now every command that loads it refuses in one line naming the key; nothing runs."""
    run = _copy(finished, tmp_path)
    canaries = _with_shell(run, tmp_path)
    commands = {
        "eval": ["eval", str(run / "config.yaml"), f"checkpoint.path={run}"],
        "train": ["train", str(run / "config.yaml"), "train.max_steps=4", f"train.output_dir={tmp_path / 'resumed'}"],
        "train (its own folder)": ["train", str(run / "config.yaml"), f"train.output_dir={run}"],
        "export": ["export", str(run), "--out", str(tmp_path / "onnx")],
        "label-tokens": ["label-tokens", str(run / "config.yaml"), f"teacher.checkpoint={run}", str(tmp_path / "labels")],
    }
    for name, argv in commands.items():
        rc = main(argv)
        err = _err_lines(capsys)
        assert rc == 2 and len(err) == 1, (name, err)
        assert f"{run / 'config.yaml'}: data.train_path='pipe:touch" in err[0] and "runs a shell command" in err[0], err
        assert "--allow-shell-from-config" in err[0]
        assert not any(c.exists() for c in canaries.values()), name
    # a resume with a config of one's own only compares with the stored config.yaml: refused, nothing run
    assert main(["train", "digits_vit", "train.max_steps=2", "checkpoint.every=2", f"train.output_dir={run}", *TINY]) == 2
    assert "data.train_path" in capsys.readouterr().err and not any(c.exists() for c in canaries.values())
    with pytest.raises(ConfigError, match="data.train_path=.* runs a shell command"):
        vitscale.load_run(run)
    assert main(["report", str(run)]) == 0  # the report shows the config; it reads no data
    assert "pipe:touch" in (run / "report.html").read_text()
    assert not any(c.exists() for c in canaries.values())
    # the payload is live: opting in (the flag, or the value typed on the command line) runs it
    main(["eval", str(run / "config.yaml"), f"checkpoint.path={run}", "--allow-shell-from-config"])
    assert canaries["train_path"].exists()
    canaries["train_path"].unlink()
    typed = tmp_path / "CANARY-typed"
    main(["eval", str(run / "config.yaml"), f"checkpoint.path={run}", f"data.train_path=pipe:touch {typed}; cat x.tar",
          f"data.val_path=pipe:touch {typed}; cat x.tar"])  # fmt: skip
    assert typed.exists() and not canaries["train_path"].exists()  # the file's own commands still never ran
    capsys.readouterr()
    # a run trained on pipe: paths offers the commands that load its config.yaml with the flag they need
    from vitscale.train.summary import print_end

    print_end(json.loads((run / "summary.json").read_text()), "human", run, report=False, tensorboard=False, names=())
    printed = capsys.readouterr().out
    assert f"vitscale eval {run / 'config.yaml'} checkpoint.path={run} --allow-shell-from-config" in printed
    assert f"vitscale export {run} --format onnx --allow-shell-from-config" in printed
    print_end(json.loads((finished / "summary.json").read_text()), "human", finished, report=False, tensorboard=False, names=())
    assert "--allow-shell-from-config" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "where, key",
    [
        ({"train_path": "/data/a.tar::pipe:touch {c}; true"}, "data.train_path"),  # a second spec joined with ::
        ({"train_path": "{pi,xx}pe:touch {c}; true"}, "data.train_path"),  # a brace pattern that expands to pipe:
        ({"evals": [{"kind": "classification", "data": {"format": "webdataset", "val_path": "pipe:touch {c}; true"}}]},
         "evals[0].data.val_path"),  # an evaluator's own data
    ],
)
def test_every_shell_command_in_a_config_file_is_refused(tmp_path, capsys, where, key):
    canary = tmp_path / "CANARY"
    cfg = {"model": {"name": "vit_debug"}, "data": {"format": "webdataset", "train_path": str(tmp_path / "x.tar")}}
    for k, v in where.items():
        v = yaml.safe_load(yaml.safe_dump(v).replace("{c}", str(canary)))
        cfg.setdefault("data", {}).update({k: v}) if k != "evals" else cfg.update(evals=v)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    rc = main(["train", str(tmp_path / "c.yaml"), f"train.output_dir={tmp_path / 'run'}", *TINY])
    err = _err_lines(capsys)
    assert rc == 2 and len(err) == 1 and f": {key}=" in err[0] and "runs a shell command" in err[0], err
    assert not canary.exists() and not (tmp_path / "run").exists()


# ------------------------------------------------------------------------- no setting silently ignored
@pytest.mark.parametrize(
    "overrides, message",
    [
        # the README's demo config pointed at a user's own images: trained on the built-in digits, exit 0
        (["data.train_path=/does/not/exist"],
         "data.train_path is read by data.format=images / imagefolder / webdataset / csv / parquet, not by data.format=digits"),
        (["data.val_path=/data/val"], "data.val_path is read by data.format=images / imagefolder / webdataset / csv / parquet, "
                                      "not by data.format=digits"),
        (["data.format=synthetic", "data.train_path=/data/train"], "data.train_path is read by data.format=images / imagefolder"),
        (["data.format=webdataset", "data.train_path=/data/x.tar", "data.val_split=0.2"],
         "data.val_split is read by data.format=imagefolder / synthetic, not by data.format=webdataset"),
        (["data.webdataset_mode=stream"], "data.webdataset_mode is read by data.format=webdataset, not by data.format=digits"),
    ],
)
def test_a_data_key_the_format_does_not_read_is_refused(tmp_path, capsys, overrides, message):
    run = tmp_path / "run"
    rc = main(["train", "digits_vit", *overrides, f"train.output_dir={run}", *TINY, "train.max_steps=1"])
    err = _err_lines(capsys)
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"vitscale train: {message}"), err
    assert "set data.format to" in err[0] and not run.exists()


def test_an_evaluators_other_format_drops_the_fields_it_does_not_read(tmp_path):
    """An `evals:` entry switching to another format keeps none of the run's settings that format never
    reads (an image folder's held-out fraction is no WebDataset setting), and refuses one it sets."""
    from vitscale.config import replace_fields
    from vitscale.data import data_config

    run_data = data_config(format="imagefolder", train_path=str(tmp_path), val_split=0.25)
    entry = replace_fields(run_data, {"format": "webdataset", "val_path": str(tmp_path / "v.tar")}, "evals.data.")
    assert (entry.format, entry.train_path, entry.val_path) == ("webdataset", str(tmp_path), str(tmp_path / "v.tar"))
    assert type(entry).__name__ == "WebDatasetData" and not hasattr(entry, "val_split")
    with pytest.raises(ConfigError, match=r"^evals.data.val_split is read by evals.data.format=imagefolder / synthetic"):
        replace_fields(run_data, {"format": "webdataset", "val_split": 0.5}, "evals.data.")


# ------------------------------------------------------------------------- off-node copies kept
def _vitscale(capsys, *argv: str) -> subprocess.CompletedProcess:
    """``vitscale ARGV`` through the CLI's entry point in this process (its environment set by the test)."""
    capsys.readouterr()
    rc = main(list(argv))
    return subprocess.CompletedProcess(argv, rc, "", capsys.readouterr().err)


def _bucket(fs, url: str) -> dict[str, bytes]:
    root = url[len("s3://"):]
    return {p[len(root):]: fs.cat_file(p) for p in fs.find(root)}


@pytest.mark.slow
def test_a_second_run_never_overwrites_anothers_remote_copies(s3_server, tmp_path, monkeypatch, capsys):
    """Two runs with one checkpoint.remote both exited 0 and only the second's files survived there."""
    pytest.importorskip("s3fs")
    _, env = s3_server
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir("shared-ckpts")
    url = "s3://shared-ckpts/team/run"
    argv = ["train", "digits_vit", "train.max_steps=2", "checkpoint.every=2", *TINY]
    a, b = tmp_path / "a", tmp_path / "b"
    p = _vitscale(capsys, *argv, f"train.output_dir={a}", f"checkpoint.remote={url}")
    assert p.returncode == 0, p.stderr[-2000:]
    fs.invalidate_cache()
    before = _bucket(fs, url)
    assert json.loads(before["/run-id.json"]) == json.loads((a / "run-id.json").read_text())
    assert "/checkpoints/step_00000002/checkpoint.json" in before and before["/config.yaml"] == (a / "config.yaml").read_bytes()

    # another run of its own (trained here first), then pointed at the same location: one line, nothing written
    p = _vitscale(capsys, *argv, f"train.output_dir={b}", "train.seed=1")
    assert p.returncode == 0, p.stderr[-2000:]
    p = _vitscale(capsys, *argv, f"train.output_dir={b}", "train.seed=1", "train.max_steps=4", "checkpoint.allow_changes=train.max_steps",
                  f"checkpoint.remote={url}")  # fmt: skip
    err = [line for line in p.stderr.splitlines() if line.startswith("vitscale ")]
    assert p.returncode == 1 and len(err) == 1, p.stderr[-2000:]
    assert err[0].startswith(f"vitscale train: checkpoint.remote={url} holds the files of another run (run-id.json: ")
    assert "set a checkpoint.remote of this run's own" in err[0] and "Traceback" not in p.stderr
    fs.invalidate_cache()
    assert _bucket(fs, url) == before

    # a new folder with another config: the location's run is restored there, and the same-run check refuses it
    c = tmp_path / "c"
    p = _vitscale(capsys, *argv, f"train.output_dir={c}", "train.seed=1", f"checkpoint.remote={url}")
    assert p.returncode == 2 and "train.seed: 0 -> 1" in p.stderr, p.stderr[-2000:]
    fs.invalidate_cache()
    assert _bucket(fs, url) == before

    # two runs started at once (both passed start-up before either uploaded): the later upload writes nothing
    from vitscale.checkpoint.remote import RemoteMirror

    d = tmp_path / "d"
    shutil.copytree(b, d)
    (d / "run-id.json").unlink()
    s3fs.S3FileSystem.clear_instance_cache()  # another test's file system (another server) may be cached here
    mirror = RemoteMirror(url, d, keep=2)
    mirror.upload(d / "checkpoints" / "step_00000004")
    mirror.wait()
    assert mirror.failed and "holds the files of another run" in mirror.failed
    fs.invalidate_cache()
    assert _bucket(fs, url) == before


# ------------------------------------------------------------------------- every name a run writes: no link followed
@pytest.mark.slow
@pytest.mark.parametrize("name", ["model.safetensors.tmp", ".config.yaml.tmp", ".summary.json.tmp", ".metrics.jsonl.tmp",
                                  ".classnames.txt.tmp", ".trackers.json.tmp"])  # fmt: skip
def test_no_name_a_run_writes_is_followed(finished, tmp_path, capsys, name):
    """A link planted at a temporary name a run writes (`model.safetensors.tmp`, `.trackers.json.tmp` were
    written through) is refused in one line; the file it points at is untouched."""
    run = _copy(finished, tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("someone else's file\n")
    (run / name).symlink_to(outside)
    argv = ["train", "digits_vit", "train.max_steps=3", "checkpoint.allow_changes=train.max_steps", f"train.output_dir={run}", *TINY]
    if name == ".trackers.json.tmp":  # MLflow in a process of its own (it ends its runs at exit), on a file store
        pytest.importorskip("mlflow")
        env = {"MLFLOW_TRACKING_URI": (tmp_path / "mlruns").as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true"}
        p = subprocess.run([sys.executable, "-m", "vitscale", *argv, "log.mlflow=true"], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path, env={**ENV, **env})  # fmt: skip
        rc, err = p.returncode, [line for line in p.stderr.splitlines() if line.startswith("vitscale ")]
    else:
        rc = main(argv)
        err = [line for line in _err_lines(capsys) if line.startswith("vitscale ")]
    assert rc == 1 and len(err) == 1 and f"{run / name} is a symbolic link (to {outside}): nothing inside a run folder" in err[0], err
    assert outside.read_text() == "someone else's file\n"
    assert not (run / "run.lock").exists()


def test_the_hang_report_is_not_written_through_a_link(tmp_path):
    """`hang-rank0.txt` linked elsewhere was written through by the watchdog; now it says so and exits 124."""
    outside = tmp_path / "outside.txt"
    outside.write_text("someone else's file\n")
    (tmp_path / "hang-rank0.txt").symlink_to(outside)
    code = ("import time; from pathlib import Path; from vitscale.train.watchdog import Watchdog\n"
            f"with Watchdog(0.5, Path({str(tmp_path)!r}), 0):\n    time.sleep(30)\n")  # fmt: skip
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=ENV)
    assert p.returncode == 124, p.stderr[-2000:]
    assert f"watchdog could not write {tmp_path / 'hang-rank0.txt'}: {tmp_path / 'hang-rank0.txt'} is a symbolic link" in p.stderr
    assert outside.read_text() == "someone else's file\n"


def test_an_export_in_the_run_folder_writes_through_no_link(finished, tmp_path, capsys):
    """`vitscale export RUN` writes into RUN/export/<format>: a linked `export/` is refused in one line, and a
    link at a file's name there is replaced by the file (written in a new folder, then renamed), never
    written through."""
    pytest.importorskip("onnxruntime")
    run = _copy(finished, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (run / "export").symlink_to(outside)
    assert main(["export", str(run)]) == 1
    err = [line for line in _err_lines(capsys) if line.startswith("vitscale ")]
    assert len(err) == 1 and f"{run / 'export'} is a symbolic link (to {outside})" in err[0], err
    assert list(outside.iterdir()) == []
    (run / "export").unlink()
    (run / "export" / "onnx").mkdir(parents=True)
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"someone else's file")
    for name in ("image.onnx", "export.json"):
        (run / "export" / "onnx" / name).symlink_to(victim)
    assert main(["export", str(run)]) == 0
    assert victim.read_bytes() == b"someone else's file"
    files = {p.name for p in (run / "export" / "onnx").iterdir()}
    assert {"image.onnx", "export.json"} <= files and not any(p.is_symlink() for p in (run / "export" / "onnx").iterdir())
    assert not any(n.startswith(".") for n in files)  # no staging folder or temporary file left
