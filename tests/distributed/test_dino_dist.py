"""DINO on 2 gloo processes (``torchrun -m vitscale train digits_dino``, FSDP2: the teacher sharded as the
student, every head its own unit, the centre and the Sinkhorn-Knopp sums all-reduced; and tensor
parallelism, ``parallel.tp=2``: the heads' MLPs column / row parallel, the prototypes split over the
ranks, the teacher split alike): the one-process curves within 2e-4, and a run resumed from its step-2 checkpoint on 2 ranks continues on the
uninterrupted curve (student, teacher, centre, temperature and momentum schedules, keyed crops and masks)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from _launch import free_port, needs_cpu_fsdp
from helpers import assert_curves_close, read_metrics

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

# KoLeo is off: DINOv2 computes it on each rank's own images (dinov2/train/ssl_meta_arch.py), so its value
# depends on the split of the batch over the ranks; everything else is a function of the global batch.
ARGS = [
    "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=1", "model.num_attention_heads=2",
    "dino.local_crops_number=1", "dino.head_n_prototypes=64", "dino.head_bottleneck_dim=16", "dino.head_hidden_dim=32",
    "dino.ibot_separate_head=true", "dino.koleo_loss_weight=0", "dino.freeze_last_layer_epochs=0.02",
    "train.batch_size=16", "train.max_steps=4", "train.log_every=1", "schedule.warmup_steps=1", "eval.every=0",
    "eval.probe_l2=[1e-3]", "checkpoint.every=2", "checkpoint.keep=5", "log.progress=none", "log.report=false", "log.tensorboard=false",
    "log.flops=false",
    # DINOv3's Gram anchoring, its teacher refreshed after step 3; per image (a batch-level Gram matrix, like
    # KoLeo, depends on the split of the batch over the ranks)
    "dino.gram_loss_weight=1.0", "dino.gram_img_level=true", "dino.gram_update_frequency=3",
]  # fmt: skip
CURVES = ("loss", "train_dino_loss", "train_ibot_loss", "train_gram_loss", "train_rankme", "train_teacher_entropy")
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def torchrun(out, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                             str(free_port()), "-m", "vitscale", "train", "digits_dino", *ARGS, *extra,
                             f"train.output_dir={out}"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def finish(p: subprocess.Popen) -> None:
    log, _ = p.communicate(timeout=300)
    assert p.returncode == 0, log[-4000:]


def curve(rows, key):
    return {r["step"]: r[key] for r in rows if key in r}


@needs_cpu_fsdp
def test_dino_on_two_ranks_fsdp_and_tp_follows_one_process_and_resumes_on_its_curve(tmp_path):
    centring = ["dino.centering=softmax"]  # the running centres: state all-reduced, checkpointed and resumed
    two = torchrun(tmp_path / "two", *centring)
    one = subprocess.run([sys.executable, "-m", "vitscale", "train", "digits_dino", *ARGS, *centring,
                          f"train.output_dir={tmp_path / 'one'}"], env=ENV, capture_output=True, text=True, timeout=300)  # fmt: skip
    finish(two)
    assert one.returncode == 0, one.stderr[-3000:]
    ref, got = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    for key in CURVES:
        assert_curves_close(curve(got, key), curve(ref, key), range(1, 5), f"{key} (2 ranks)", 2e-4)
    losses = [r["loss"] for r in ref if "loss" in r]
    assert abs(losses[-1] - losses[0]) > 1e-3  # the curve moves: the agreement is not trivial
    assert got[-1]["knn_top1"] == ref[-1]["knn_top1"]

    # tensor parallelism on the same 2 ranks (one data-parallel rank): the same curves
    # the TP and resumed runs compare training curves only: no end-of-run evaluations (the k-NN was compared above)
    tp = torchrun(tmp_path / "tp", *centring, "parallel.tp=2", "parallel.dp_shard=1", "evals=[]")
    finish(tp)
    split = read_metrics(tmp_path / "tp")
    for key in CURVES:
        assert_curves_close(curve(split, key), curve(ref, key), range(1, 5), f"{key} (tp=2)", 2e-4)

    # on 2 ranks again, from the step-2 checkpoint of the 2-rank run
    part = tmp_path / "part"
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "two" / "checkpoints" / "step_00000002", part / "checkpoints" / "step_00000002")
    (part / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in got if r["step"] <= 2 and "loss" in r))
    finish(torchrun(part, *centring, "evals=[]"))
    again = read_metrics(part)
    for key in (*CURVES, "train_teacher_temp"):
        assert curve(again, key) == curve(got, key), key


@needs_cpu_fsdp
def test_a_stage_on_two_ranks_keeps_the_previous_stages_parts_bit_for_bit(tmp_path):
    """``checkpoint.init_parts`` under torchrun: a one-process run's student heads, teacher and centres read
    into a 2-rank FSDP2 stage (each part sharded as the run lays it out), the Gram teacher starting as the
    kept teacher's backbone, on crops of its own; nothing moves in the stage's one step (no learning rate,
    momenta 1), so its checkpoint holds every kept tensor as the previous run wrote it."""
    from vitscale.checkpoint import read_weights

    centring = ["dino.centering=softmax"]
    first = tmp_path / "first"
    p = subprocess.run([sys.executable, "-m", "vitscale", "train", "digits_dino", *ARGS, *centring, "train.max_steps=2",
                        "evals=[]", f"train.output_dir={first}"], env=ENV, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    frozen = ["optim.lr=0", "dino.momentum_teacher=1", "dino.final_momentum_teacher=1", "dino.center_momentum=1"]
    stage = tmp_path / "stage"
    finish(torchrun(stage, *centring, *frozen, "train.max_steps=1", "evals=[]", "dino.gram_rep_update=false",
                    "dino.gram_teacher_crops_size=48", f"checkpoint.init_from={first}",
                    "checkpoint.init_parts=[student,teacher,centres]"))  # fmt: skip
    before = read_weights(first / "checkpoints" / "step_00000002", "task", prefix="task.")
    after = read_weights(stage / "checkpoints" / "step_00000001", "task", prefix="task.")
    kept = [k for k in before if not k.startswith("gram_teacher.")]
    assert {"student.head.last_v", "student.ibot_head.last_v", "teacher.backbone.pos_embed", "centres.cls"} <= set(kept)
    for k in kept:
        assert torch.equal(after[k], before[k]), k
    gram = [k for k in after if k.startswith("gram_teacher.")]
    assert gram and all(torch.equal(after[k], before[f"teacher.backbone.{k[len('gram_teacher.'):]}"]) for k in gram)
    model_before, model_after = read_weights(first / "checkpoints" / "step_00000002"), read_weights(stage / "checkpoints" / "step_00000001")
    assert model_after.keys() == model_before.keys() and all(torch.equal(model_after[k], model_before[k]) for k in model_before)
