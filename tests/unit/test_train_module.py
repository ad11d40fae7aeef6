"""A task's training module (``vitscale.tasks.module``): the groups it declares become the optimizer's,
what it schedules itself multiplies the run's schedule, a skipped step moves no EMA, and a run folder's
weight sets are asked of its task (none named by the layer that reads them)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vitscale import create_model
from vitscale.config.schema import OptimConfig, ScheduleConfig
from vitscale.distributed.utils import move_towards
from vitscale.tasks.module import Hyper, ParamGroup, TrainModule, trainable
from vitscale.train.optim import build_optimizer
from vitscale.train.schedules import Schedule


class Heads(TrainModule):
    """A backbone and a two-layer head whose last layer is scheduled apart (as DINO's prototypes)."""

    def __init__(self):
        backbone = create_model("vit_debug", num_classes=0)
        super().__init__(backbone, {"head": nn.Sequential(nn.Linear(backbone.num_features, 8), nn.Linear(8, 4))})

    def param_groups(self):
        first, last = trainable(self.parts["head"][0]), trainable(self.parts["head"][1])
        return [ParamGroup("", trainable(self.backbone), backbone=True), ParamGroup("head", first, lr_scale=0.5),
                ParamGroup("last", last, wd_scale=0.0, schedule="last")]  # fmt: skip

    def hyper(self, step):
        return Hyper(lr={"last": 0.0} if step <= 2 else {}, weight_decay=2.0 if step > 3 else 1.0)


def test_declared_groups_are_the_optimizers_and_the_module_schedules_its_own():
    module = Heads()
    opt = build_optimizer(module, OptimConfig(weight_decay=0.1), lr=1e-3)
    groups = {g["name"]: g for g in opt.param_groups}
    assert set(groups) == {"decay", "no_decay", "decay.head", "no_decay.head", "decay.last", "no_decay.last"}
    assert groups["decay.head"]["lr"] == pytest.approx(5e-4) and groups["decay.head"]["weight_decay"] == 0.1
    assert groups["decay.last"]["weight_decay"] == 0.0 and groups["decay.last"]["schedule"] == "last"
    # every trainable parameter in exactly one group
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in module.parameters() if p.requires_grad)
    sched = Schedule(opt, ScheduleConfig(name="constant", warmup_steps=0), 10, 0, 1e-3, hyper=module.hyper)
    sched.apply(1)
    assert groups["decay.last"]["lr"] == 0.0 and groups["decay"]["lr"] == pytest.approx(1e-3)
    sched.apply(3)
    assert groups["decay.last"]["lr"] == pytest.approx(1e-3) and groups["decay"]["weight_decay"] == 0.1
    sched.apply(4)
    assert groups["decay"]["weight_decay"] == pytest.approx(0.2) and groups["no_decay"]["weight_decay"] == 0.0


def test_an_ema_step_weighted_by_a_skipped_steps_flag_moves_nothing():
    target, source = [torch.zeros(3)], [torch.ones(3)]
    move_towards(target, source, 0.25, torch.tensor(0.0))
    assert target[0].eq(0).all()
    move_towards(target, source, 0.25, torch.tensor(1.0))
    assert torch.allclose(target[0], torch.full((3,), 0.25))
    move_towards(target, source, 0.5)
    assert torch.allclose(target[0], torch.full((3,), 0.625))


def test_a_weight_set_is_asked_of_the_runs_task(tmp_path):
    from vitscale.checkpoint.integrity import CheckpointError
    from vitscale.errors import ConfigError
    from vitscale.run.weight_sets import weight_set_prefix

    run = tmp_path / "run"
    (run / "checkpoints" / "step_00000002").mkdir(parents=True)
    (run / "checkpoints" / "step_00000002" / ".metadata").write_bytes(b"")  # what marks a DCP step folder
    with pytest.raises(CheckpointError, match="no checkpoint to read the teacher from"):
        weight_set_prefix(tmp_path, "teacher")
    (run / "config.yaml").write_text("train:\n  task: dino\n")
    assert weight_set_prefix(run, "model") is None and weight_set_prefix(run, "ema") is None
    assert weight_set_prefix(run, "teacher") == "task.teacher.backbone."
    assert weight_set_prefix(run / "checkpoints" / "step_00000002", "teacher") == "task.teacher.backbone."
    (run / "config.yaml").write_text("train:\n  task: mae\n")
    with pytest.raises(ConfigError, match=r"has no 'teacher' weights: its run's weight sets are model, ema$"):
        weight_set_prefix(run, "teacher")


def test_reading_any_runs_config_imports_no_training_code():
    """A task's module imports nothing of ``vitscale.train``: reading a run's config (``vitscale export``,
    ``vitscale eval`` of a DINO or MAE run folder) loads the task's config and module, not the trainer."""
    import subprocess
    import sys

    code = ("import sys\nfrom vitscale.config import load_config\n"
            "for name in ('digits_dino', 'digits_mae', 'digits_vit', 'digits_clip', 'digits_volo'):\n"
            "    load_config(name)\n"
            "import vitscale.tasks.dino, vitscale.tasks.mae\n"
            "print(sorted(m for m in sys.modules if m.startswith('vitscale.train')))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
