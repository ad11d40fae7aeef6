"""Attacks on runs, round three (docs/trust.md, "Attacks tried"): a run folder handed over by someone
else (its config.yaml holding shell commands, its names linked elsewhere), a setting the chosen data
format never reads, two runs mirrored to one ``checkpoint.remote``. Each input is built here and run
through the CLI (``vitscale.cli.main``) a user runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

import vitscale
from vitscale.cli import main
from vitscale.errors import ConfigError

TINY = ["model.num_layers=1", "model.hidden_size=16", "train.batch_size=16", "data.num_workers=0", "log.flops=false",
        "eval.every=0", "log.progress=none", "log.report=false"]  # fmt: skip


def _err_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A real run folder: a checkpoint at step 2, model.safetensors, config.yaml, metrics, summary."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", "digits_vit", "train.max_steps=2", "checkpoint.every=2", f"train.output_dir={run}", *TINY]) == 0
    return run


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
         "data.train_path is read by data.format=imagefolder / webdataset / csv / parquet, not by data.format=digits"),
        (["data.val_path=/data/val"], "data.val_path is read by data.format=imagefolder / webdataset / csv / parquet, "
                                      "not by data.format=digits"),
        (["data.format=synthetic", "data.train_path=/data/train"], "data.train_path is read by data.format=imagefolder"),
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
    from vitscale.data import DataConfig

    run_data = DataConfig(format="imagefolder", train_path=str(tmp_path), val_split=0.25)
    entry = replace_fields(run_data, {"format": "webdataset", "val_path": str(tmp_path / "v.tar")}, "evals.data.")
    assert (entry.format, entry.val_split, entry.train_path, entry.val_path) == ("webdataset", 0.0, str(tmp_path), str(tmp_path / "v.tar"))
    with pytest.raises(ConfigError, match=r"^evals.data.val_split is read by data.format=imagefolder / synthetic"):
        replace_fields(run_data, {"format": "webdataset", "val_split": 0.5}, "evals.data.")
