"""The command line as a user meets it: it starts without torch, reports a config error once (one line,
exit code 2, before a run folder is made), answers ``--lr 1e-3`` with the override to write, takes
overrides after options, and ``vitscale config`` reads the groups and fields from the schema."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from dataclasses import dataclass

import pytest

from vitscale.cli import main
from vitscale.config import Config


def _err_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["config", "--help"], ["eval", "--help"]])
def test_help_starts_without_torch(argv):
    """Only the command being run registers its options in full (``vitscale bench``'s import torch):
    ``vitscale --help`` and the training commands' help load no torch, numpy or PIL."""
    code = ("import sys\nfrom vitscale.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    assert e.code == 0, e.code\n"
            "print(sorted(m for m in ('torch', 'torchvision', 'numpy', 'PIL', 'yaml') if m in sys.modules))")  # fmt: skip
    res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    *help_text, loaded = res.stdout.strip().splitlines()
    assert loaded == "[]" and help_text[0].startswith("usage: vitscale"), res.stdout[-2000:]


def test_top_level_help_lists_every_command(capsys):
    from vitscale.cli import COMMANDS

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.split("COMMAND\n", 1)[1].split("\noptions:")[0].splitlines()
              if line.startswith("    ") and not line.startswith("     ")]  # fmt: skip
    assert listed == COMMANDS.names() == list(COMMANDS.builtin)


@pytest.mark.parametrize(
    "args, hint",
    [
        (["--lr", "1e-3"], "--lr 1e-3 is not an option: write optim.lr=1e-3"),
        (["--lr=1e-3"], "--lr=1e-3 is not an option: write optim.lr=1e-3"),
        (["train.max_steps=5", "--optim.weight-decay", "0.1"], "--optim.weight-decay 0.1 is not an option: write optim.weight_decay=0.1"),
        (["--max-steps", "5"], "--max-steps 5 is not an option: write train.max_steps=5"),
        (["--batch_size", "8"], "--batch_size 8 is not an option: write train.batch_size=8 (or eval.batch_size=8, teacher.batch_size=8)"),
        (["--hidden_size=128"], None),  # a field of the model's variant, not of the schema: argparse's own error
    ],
)  # fmt: skip
def test_an_option_that_names_a_config_field_gets_the_override_to_write(args, hint, tmp_path, capsys):
    argv = ["train", "digits_vit", f"train.output_dir={tmp_path / 'run'}", *args]
    if hint is None:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and "unrecognized arguments: --hidden_size=128" in capsys.readouterr().err
    else:
        assert main(argv) == 2
        assert _err_lines(capsys) == [f"vitscale train: {hint}"]
    assert not (tmp_path / "run").exists()


def test_the_hint_through_the_real_command_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "vitscale", "eval", "digits_vit", "--lr", "1e-3"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert res.returncode == 2 and res.stderr == "vitscale eval: --lr 1e-3 is not an option: write optim.lr=1e-3\n"


def test_overrides_may_follow_an_option(capsys):
    assert main(["train", "digits_vit", "--print-config", "train.max_steps=7", "optim.lr=0.003"]) == 0
    out = capsys.readouterr().out
    assert "  max_steps: 7\n" in out and "  lr: 0.003\n" in out


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.format=nope", "data.format: unknown data format 'nope' (choose one of csv, digits, digits_aspect, imagefolder, images, "
         "parquet, synthetic, webdataset; a plug-in's: load it with vitscale --import MODULE)"),
        ("train.task=clasification", "train.task: unknown task 'clasification'; did you mean 'classification'? (choose one of "
         "classification, contrastive, dino, feature_distill, mae, token_labeling; a plug-in's: load it with vitscale --import MODULE)"),
        ("data.interpolation=cubic", "data.interpolation: 'cubic' is not one of bilinear, bicubic"),
        ("token_label.cls_target=teacher", "token_label is a group of train.task=token_labeling, not of "
         "train.task=classification (this run's): set train.task to it, or remove token_label"),
        ("distill.teacher_weights=best", "distill.teacher_weights: 'best' is not one of model, ema"),
        ("data.randaugment=m9-n2", "data.randaugment (torchvision's RandAugment) is replaced by data.auto_augment with timm's "
         "strings: write data.auto_augment=rand-m9-n2 for 'm9-n2' (DeiT's and VOLO's: rand-m9-mstd0.5-inc1); docs/data.md"),
        ("data.auto_augment=rand-m9-x2", "data.auto_augment: unknown section 'x2' in 'rand-m9-x2' (this policy takes m, n, p, "
         "mstd, mmax, inc; e.g. rand-m9-mstd0.5-inc1, original, 3a, ta_wide or nemo (docs/data.md))"),
        ("data.color_jitter=[0.4,0.4]", "data.color_jitter=[0.4, 0.4]: give 1, 3 or 4 values (brightness, contrast, "
         "saturation[, hue]), e.g. 0.4 or [0.4,0.4,0.4,0.1]"),
        ("optim.lrr=1", "unknown config key 'optim.lrr'; did you mean 'optim.lr'?"),
    ],
)
def test_a_config_error_is_one_line_exit_code_2_and_no_run_folder(override, message, tmp_path, capsys):
    """Caught once, by the CLI (no command catches ConfigError itself); found before anything runs."""
    run = tmp_path / "run"
    assert main(["train", "digits_vit", override, f"train.output_dir={run}", "data.num_workers=0"]) == 2
    assert _err_lines(capsys) == [f"vitscale train: {message}"]
    assert not run.exists()


@pytest.mark.parametrize("command", [["eval", "digits_vit"], ["demo"], ["label-tokens", "digits_vit", "OUT"]])
def test_every_command_reports_a_config_error_the_same_way(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `vitscale demo` would train into ./runs/demo
    assert main([*command, "data.format=nope"]) == 2
    assert _err_lines(capsys) == [f"vitscale {command[0]}: data.format: unknown data format 'nope' (choose one of csv, digits, "
                                  "digits_aspect, imagefolder, images, parquet, synthetic, webdataset; a plug-in's: load it with "
                                  "vitscale --import MODULE)"]  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_the_real_command_line_exits_2_on_an_unknown_data_format(tmp_path):
    res = subprocess.run([sys.executable, "-m", "vitscale", "train", "digits_vit", "data.format=nope",
                          f"train.output_dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "data.format: unknown data format 'nope'" in res.stderr
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------ vitscale config
def test_config_lists_every_group_of_the_schema(capsys):
    assert main(["config"]) == 0
    out = capsys.readouterr().out.splitlines()
    listed = [line.split()[0] for line in out[1:-1]]
    schema = [f.name for f in dataclasses.fields(Config)]  # the root's groups, then the tasks' groups
    assert listed == [*schema, "distill", "clip", "token_label", "teacher", "mae", "dino"]
    assert "evals" in listed and "  evals        The run's evaluations" in "\n".join(out)
    assert "  optim        The optimizer." in out


def test_config_lists_a_tasks_group_and_every_evaluator(capsys):
    assert main(["config", "clip"]) == 0
    assert "clip.local_loss = false  (bool)\n" in capsys.readouterr().out
    assert main(["config", "evals"]) == 0
    out = capsys.readouterr().out
    kinds = [line.split()[1] for line in out.splitlines() if line.startswith("kind: ")]
    assert kinds == ["classification", "class_subset", "real", "zeroshot", "retrieval", "linear_probe", "fewshot", "knn", "sizes", "feature_distill"]
    assert "  every = 0  (int)\n    Evaluate every N training steps" in out
    assert "  shots = [1, 5, 10, 25]  (list of int)" in out  # a kind's own field


def test_config_group_shows_defaults_types_and_docstrings(capsys):
    assert main(["config", "optim"]) == 0
    out = capsys.readouterr().out
    assert "optim.lr = 0.001  (float)\n    Base learning rate (before the batch-size scaling rule).\n" in out
    assert "optim.name = adamw  (adamw | adam | sgd | lamb)\n" in out
    assert "optim.head_weight_decay = null  (float | None)\n" in out
    assert "optim.betas = [0.9, 0.999]  (2 values)\n" in out
    assert main(["config", "train"]) == 0
    out = capsys.readouterr().out
    assert "train.compile_mode = default  (default | reduce-overhead | max-autotune-no-cudagraphs | max-autotune)" in out
    assert "``" not in out  # docstrings read as plain text


def test_config_model_lists_the_variants_fields(capsys):
    assert main(["config", "model", "--model", "clip_debug"]) == 0
    out = capsys.readouterr().out
    assert "model.name = vit_debug  (str)" in out and "model.vision.num_layers = 2  (int)" in out


def test_config_data_lists_each_formats_own_fields(capsys):
    """``vitscale config data``: the fields every format has, then each format with the fields of its own
    (read from its options dataclass: a format's module adds them with no other change)."""
    assert main(["config", "data"]) == 0
    out = capsys.readouterr().out
    assert "data.train_path = null  (str | None)" in out and "data.options" not in out and "data.webdataset_mode = index" in out
    assert "\ndata.format=webdataset — WebDataset tar shards" in out
    assert "data.webdataset_mode = index  (index | stream)" in out and "data.label_key = cls  (str)" in out
    assert out.index("\ndata.format=csv") < out.index("data.csv_img_key = filepath") < out.index("\ndata.format=parquet")
    assert "data.image_column = image  (str)" in out and "\ndata.format=digits — " in out


def test_config_unknown_group_names_the_closest(capsys):
    assert main(["config", "optm"]) == 2
    (line,) = _err_lines(capsys)
    assert line.startswith("vitscale config: no config group 'optm'; did you mean 'optim'? the groups: model, data,")


@dataclass
class _ToyGroup:
    """A plug-in's config group."""

    width: int = 3
    """How wide the toy is."""


@dataclass
class _ToyConfig(Config):
    toy: _ToyGroup = dataclasses.field(default_factory=_ToyGroup)


def test_a_group_a_plugin_task_adds_is_listed_with_its_docstrings(monkeypatch, capsys):
    """Groups are read from the run config's fields: a group a plug-in task declares needs no edit here."""
    from vitscale.tasks import base

    class ToyTask(base.Task):
        name = "toy_task"
        config = _ToyConfig

    monkeypatch.setitem(base.TASKS.entries, "toy_task", ToyTask)  # registered for this test only
    assert main(["config"]) == 0
    assert "  toy          A plug-in's config group." in capsys.readouterr().out
    assert main(["config", "toy"]) == 0
    assert capsys.readouterr().out == "toy.width = 3  (int)\n    How wide the toy is.\n"
