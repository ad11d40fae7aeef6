"""A stage of a DINO pretraining through the CLI, as DINOv3's high-resolution stage starts from the
previous one: ``checkpoint.init_from`` the previous run with ``checkpoint.init_parts`` keeps its heads,
its teacher and its centres bit for bit (the Gram teacher starting as the kept teacher's backbone),
the optimizer and the step counter starting afresh, at a mixture of crop sizes; a stage whose
checkpoint lacks a part it keeps is refused in one line, exit 2, before any file is written."""

from __future__ import annotations

import json

import pytest
import torch

from vitscale.checkpoint import read_weights
from vitscale.cli import main

TINY = ["model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=1", "model.num_attention_heads=2",
        "dino.local_crops_number=1", "dino.head_n_prototypes=64", "dino.head_bottleneck_dim=16", "dino.head_hidden_dim=32",
        "dino.ibot_separate_head=false", "dino.centering=softmax", "train.batch_size=16", "evals=[]",
        "log.progress=plain", "log.flops=false", "log.tensorboard=false", "log.report=false"]  # fmt: skip
# the stage: the previous stage's crops at a mixture of two sizes (DINOv3's pairs, scaled to 32 px digits)
MIXTURE = ["dino.global_crops_sizes=[32,16]", "dino.local_crops_sizes=[16,8]", "dino.global_local_crop_pairs_ratios=[0.7,0.3]"]
# nothing moves in the stage's one step: no learning rate, a teacher momentum of 1, the softmax centre's momentum 1
FROZEN = ["optim.lr=0", "dino.momentum_teacher=1", "dino.final_momentum_teacher=1", "dino.center_momentum=1"]


def _parts(run, step):
    sd = read_weights(run / "checkpoints" / f"step_{step:08d}", "task", prefix="task.")
    return sd


@pytest.mark.slow
def test_a_stage_keeps_the_previous_stages_heads_teacher_and_centres(tmp_path, capsys):
    first = tmp_path / "first"
    assert main(["train", "digits_dino", *TINY, "train.max_steps=2", f"train.output_dir={first}"]) == 0
    before = _parts(first, 2)
    assert {"student.head.last_v", "teacher.head.last_v", "teacher.backbone.pos_embed", "centres.cls"} <= before.keys()
    stage = tmp_path / "stage"
    keep = "checkpoint.init_parts=[student,teacher,centres]"
    gram = ["dino.gram_loss_weight=1", "dino.gram_rep_update=false", "dino.gram_teacher_crops_sizes=[48,24]",
            "dino.gram_teacher_no_distortions=true", "dino.gram_loss_weight_schedule=[1.5,1.5,1.5,0,0]",
            "dino.local_loss_weight_schedule=[0.5,0.5,0.5,0,0]"]  # DINOv3's stage: the Gram teacher's own crops, 1.5x
    args = [*TINY, *MIXTURE, *FROZEN, *gram, "train.max_steps=1",
            f"checkpoint.init_from={first}", keep, f"train.output_dir={stage}"]  # fmt: skip
    assert main(["train", "digits_dino", *args]) == 0
    log = (stage / "train.log").read_text()
    assert f"checkpoint.init_parts: teacher (29 tensors) from {first}" in log
    assert "the Gram teacher starts as the kept teacher's backbone" in log
    assert "the Gram teacher on crops of its own (48/24 px, undistorted" in log
    after = _parts(stage, 1)
    for k, v in before.items():  # every kept tensor, bit for bit (nothing moved in the one step)
        assert torch.equal(after[k], v), k
    for k, v in after.items():
        if k.startswith("gram_teacher."):
            assert torch.equal(v, before[f"teacher.backbone.{k[len('gram_teacher.'):]}"]), k
    state = json.loads((stage / "checkpoints" / "step_00000001" / "trainer_state.json").read_text())
    assert state["step"] == 1  # the step counter started afresh (the previous stage ended at 2)
    optim = read_weights(stage / "checkpoints" / "step_00000001", "optim", prefix="optim.")
    steps = {float(v) for k, v in optim.items() if k.endswith(".step")}
    assert steps == {1.0}, steps  # AdamW's moments afresh: one update, not the previous stage's 2 + 1
    # DINOv3's way: the student too starts as the previous stage's teacher (backbone and heads)
    dv3 = tmp_path / "dv3"
    assert main(["train", "digits_dino", *args[:-1], "dino.student_from_teacher=true", f"train.output_dir={dv3}"]) == 0
    got, model = _parts(dv3, 1), read_weights(dv3 / "checkpoints" / "step_00000001")
    assert all(torch.equal(got[f"student.head.{k}"], before[f"teacher.head.{k}"]) for k in ("last_v", "mlp.0.weight"))
    assert all(torch.equal(v, before[f"teacher.backbone.{k}"]) for k, v in model.items())
    assert not torch.equal(before["student.head.mlp.0.weight"], before["teacher.head.mlp.0.weight"])  # the two differed
    # without init_parts the stage builds its heads afresh: the previous stage's trained heads are not there
    fresh = tmp_path / "fresh"
    assert main(["train", "digits_dino", *[a for a in args if a != keep], f"train.output_dir={fresh}"]) == 0
    assert not torch.equal(_parts(fresh, 1)["student.head.mlp.0.weight"], before["student.head.mlp.0.weight"])

    # a stage whose checkpoint lacks what it keeps: one line, exit 2, nothing written
    capsys.readouterr()
    cases = {
        "a head it never had": (["dino.ibot_separate_head=true", keep],
                                "lacks 8 tensors of the student this run keeps (student.ibot_head.last_v"),
        "a Gram teacher it never had": (["checkpoint.init_parts=[gram_teacher]"], "lacks 21 tensors of the gram_teacher"),
        "heads of another size": (["dino.head_n_prototypes=128", keep], "holds student.head.last_v as 64x16, this run's student has 128x16"),
        "no checkpoint": ([keep, f"checkpoint.init_from={first / 'model.safetensors'}"], "is none (no checkpoint at"),
        "a part the task has not": (["checkpoint.init_parts=[heads]"], "train.task=dino has no part 'heads' to keep"),
        "the student from no teacher": (["checkpoint.init_parts=[student]", "dino.student_from_teacher=true"],
                                        "dino.student_from_teacher=true starts the student from the previous stage's teacher"),
    }
    for name, (extra, text) in cases.items():
        out = tmp_path / "refused"
        rc = main(["train", "digits_dino", *args[:-2], f"checkpoint.init_from={first}", *extra, f"train.output_dir={out}"])
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert rc == 2 and len(err) == 1 and text in err[0], (name, err)
        assert not out.exists(), name
