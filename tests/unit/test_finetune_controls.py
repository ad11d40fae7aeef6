"""Fine-tuning controls on real models and real optimizer steps: ``optim.layer_decay`` scales each
layer's update by BEiT's factor, ``model.freeze`` keeps parameters where they are (weights compared
before and after a step); DeiT's distillation losses and the teacher's input adapter against their
formulas; a new ``model.name`` on the command line drops the YAML's model overrides and says so."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import vitscale
from vitscale.config import load_config
from vitscale.config.schema import OptimConfig
from vitscale.errors import ConfigError
from vitscale.tasks.distill import Distillation, Teacher
from vitscale.tasks.distill_config import DistillConfig
from vitscale.train.finetune import freeze, group_lines
from vitscale.train.optim import build_optimizer


def _step(model, opt, seed=0):
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    y = torch.arange(4) % model.num_classes
    F.cross_entropy(model(x), y).backward()
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    return before, grads


def test_layer_decay_and_freeze_change_which_parameters_move():
    torch.manual_seed(0)
    model = vitscale.create_model("vit_debug")  # L = 2 blocks
    lines = freeze(model, ("blocks.0.attn.*",))
    assert lines == ["model.freeze: 4 tensors (16.6K of 81.2K parameters) frozen"]
    decay, lr = 0.5, 0.1
    cfg = OptimConfig(name="sgd", lr=lr, momentum=0.0, weight_decay=0.0, layer_decay=decay)
    opt = build_optimizer(model, cfg, lr)
    before, grads = _step(model, opt)
    # BEiT / timm: the embeddings decay^(L+1), block i decay^(L-i), the final norm and head decay^0
    layer = {"cls_token": 3, "pos_embed": 3, "patch_embed": 3, "blocks.0": 2, "blocks.1": 1, "norm": 0, "head": 0}
    for name, p in model.named_parameters():
        if name.startswith("blocks.0.attn."):  # frozen: no gradient, not in the optimizer, not moved
            assert not p.requires_grad and grads[name] is None and torch.equal(p, before[name]), name
            assert all(p is not q for g in opt.param_groups for q in g["params"])
            continue
        k = next(v for prefix, v in layer.items() if name == prefix or name.startswith(prefix + "."))
        # SGD without momentum or decay: each parameter moved by exactly lr x decay^k x its gradient
        torch.testing.assert_close(p.detach(), before[name] - lr * decay**k * grads[name], rtol=0, atol=1e-7, msg=name)
        assert not torch.equal(p, before[name]), name
    shown = group_lines(model, opt, decay, lr)
    assert shown[0].startswith("optim.layer_decay=0.5") and shown[1].startswith("  k=3 lr x0.125: cls_token, patch_embed, pos_embed")
    assert shown[-1].startswith("  k=0 lr x1: head, norm")


def test_clip_layer_decay_is_per_tower():
    model = vitscale.create_model("clip_debug")
    opt = build_optimizer(model, OptimConfig(layer_decay=0.5), 1.0)
    scale = {id(p): g["lr_scale"] for g in opt.param_groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert scale[id(named["visual.patch_embed.proj.weight"])] == 0.125  # 2 image blocks: 0.5^3
    assert scale[id(named["text.token_embedding.weight"])] == 0.125
    assert scale[id(named["visual.blocks.1.mlp.fc1.weight"])] == 0.5
    assert scale[id(named["text.blocks.0.attn.qkv_per_head.weight"])] == 0.25
    assert scale[id(named["logit_scale"])] == scale[id(named["image_proj.weight"])] == 1.0


def test_freeze_errors_are_one_line():
    model = vitscale.create_model("vit_debug")
    with pytest.raises(ConfigError) as e:
        freeze(model, ("blocks.9.*",))
    assert "model.freeze: 'blocks.9.*' matches no parameter of the model (its parameters: cls_token, pos_embed" in str(e.value)
    freeze(model, ("*",))
    with pytest.raises(ConfigError, match="nothing to train: every parameter is frozen"):
        build_optimizer(model, OptimConfig(), 1e-3)
    volo = vitscale.create_model("volo_debug")
    with pytest.raises(ConfigError, match="optim.layer_decay: family volo declares no layers"):
        build_optimizer(volo, OptimConfig(layer_decay=0.7), 1e-3)


# ----------------------------------------------------------------------------- distillation
def _teacher(model, s_mean=0.5, s_std=0.5, t_mean=0.0, t_std=1.0, size=None):
    scale = torch.full((3,), s_std / t_std)
    shift = torch.full((3,), (s_mean - t_mean) / t_std)
    import contextlib

    return Teacher(model, scale=scale, shift=shift, size=size, interpolation="bicubic", autocast=contextlib.nullcontext,
                   device=torch.device("cpu"))  # fmt: skip


def test_teacher_sees_its_own_normalisation_and_size():
    seen = {}

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen["x"] = x
            return x.mean(dim=(2, 3))

    t = _teacher(Probe(), s_mean=0.5, s_std=0.5, t_mean=0.25, t_std=2.0, size=(16, 16))
    pixels = torch.rand(2, 3, 32, 32)
    t((pixels - 0.5) / 0.5)
    want = F.interpolate((pixels - 0.25) / 2.0, size=(16, 16), mode="bicubic", antialias=True, align_corners=False)
    torch.testing.assert_close(seen["x"], want, rtol=1e-5, atol=1e-6)
    assert not any(p.requires_grad for p in t.model.parameters()) and not t.model.training
    assert t.timer.take() > 0 and t.timer.take() == 0  # the forward's time, then afresh


@pytest.mark.parametrize("kind", ["hard", "soft"])
def test_deit_losses(kind):
    torch.manual_seed(0)
    student = vitscale.create_model("vit_debug", distill_token=True)
    teacher = vitscale.create_model("vit_debug")
    dc = DistillConfig(teacher="x", kind=kind, alpha=0.3, tau=2.0)
    d = Distillation(_teacher(teacher, 0.0, 1.0, 0.0, 1.0), dc, [])
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([1, 2, 3, 4])
    import contextlib

    base = lambda logits, t: F.cross_entropy(logits, t)  # noqa: E731
    loss, metrics = d.classification_loss(student, x, y, y, base, contextlib.nullcontext)
    cls, dst = student(x, distill=True)
    with torch.no_grad():
        t = teacher.eval()(x)
    if kind == "hard":
        kd = F.cross_entropy(dst, t.argmax(-1))
    else:  # DeiT: KL at temperature tau, x tau^2, summed over the batch and classes / number of logits
        p_t = F.softmax(t / 2.0, -1)
        kd = (p_t * (p_t.log() - F.log_softmax(dst / 2.0, -1))).sum() * 4.0 / dst.numel()
    torch.testing.assert_close(loss, 0.7 * F.cross_entropy(cls, y) + 0.3 * kd, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(metrics["train_distill_loss"], kd.detach(), rtol=1e-5, atol=1e-6)
    loss.backward()
    assert student.head_dist.weight.grad.abs().sum() > 0 and student.head.weight.grad.abs().sum() > 0


# ----------------------------------------------------------------------------- model.name
def test_a_new_model_name_drops_the_yamls_model_overrides():
    notes: list[str] = []
    cfg = load_config("digits_vit", ["model.name=vit_s16", "model.img_h=32", "model.img_w=32"], notes=notes)
    assert cfg.model.name == "vit_s16" and cfg.model.overrides == {"img_h": 32, "img_w": 32}
    assert len(notes) == 1 and "model.name=vit_s16 replaces digits_vit's vit_debug: its model overrides (patch_dim=4, " in notes[0]
    assert "kept those given here: img_h, img_w" in notes[0]
    same: list[str] = []
    cfg = load_config("digits_vit", ["model.name=vit_debug", "model.hidden_size=128"], notes=same)
    assert not same and cfg.model.overrides["patch_dim"] == 4 and cfg.model.overrides["hidden_size"] == 128


def test_distillation_settings_are_checked_up_front(tmp_path):
    from vitscale.distributed.parallel_dims import ParallelDims
    from vitscale.errors import CheckError, ConfigError
    from vitscale.run.assemble import resolve_run_model
    from vitscale.run.checks import check_run as check

    dims = ParallelDims(device=torch.device("cpu"))

    def check_run(cfg, dims, purpose):  # the run's checks, of the model as vitscale.run.assemble resolves it
        check(cfg, dims, purpose, resolve_run_model(cfg))
    # a task without distillation has no distill group: refused as the config loads
    with pytest.raises(ConfigError, match=re.escape("distill is a group of train.task=classification / contrastive / feature_distill, "
                                                    "not of train.task=token_labeling (this run's)")):
        load_config("digits_vit", ["train.task=token_labeling", "distill.teacher=t.pth"])
    # a group checks its own fields as it is built: the config does not load
    for config, overrides, message in (
        ("digits_vit", ["optim.layer_decay=0"], "optim.layer_decay=0.0 must be in (0, 1]"),
        ("digits_vit", ["distill.teacher=t.pth", "distill.alpha=1.5"], "distill.alpha=1.5 must be in [0, 1]"),
        ("digits_vit", ["distill.teacher=t.pth", "distill.tau=0"], "distill.tau=0.0 must be"),
        ("digits_clip", ["clip.lock_image_unlocked_groups=-1"], "clip.lock_image_unlocked_groups=-1 must be at least 0"),
        ("digits_vit", ["train.task=token_labeling", "token_label.mix_token_prob=2"], "token_label.mix_token_prob=2.0 must be in [0, 1]"),
        ("digits_vit", ["train.task=token_labeling", "teacher.batch_size=0"], "teacher.batch_size=0 must be at least 1"),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(config, overrides)
    # no teacher: not read, yet out of its range all the same (issue 49: every number has a range, checked as it loads)
    with pytest.raises(ConfigError, match=re.escape("distill.alpha=1.5 is out of range: use 0.0 to 1.0")):
        load_config("digits_vit", ["distill.alpha=1.5"])
    # what needs more than one group: the run's checks, the task's (Task.check) among them
    with pytest.raises(CheckError, match=re.escape("train.task=token_labeling needs token_label.path")):
        check_run(load_config("digits_vit", ["train.task=token_labeling"]), dims, "train")
    clip = load_config("digits_vit", ["train.task=token_labeling", "token_label.path=labels", "model.name=clip_debug"])
    with pytest.raises(CheckError, match=re.escape("needs a model with per-token class logits (a ViT or VOLO): clip_debug")):
        check_run(clip, dims, "train")
    with pytest.raises(CheckError, match=re.escape("token_label.path=labels holds no token labels")):
        check_run(load_config("digits_vit", ["train.task=token_labeling", "token_label.path=labels"]), dims, "train")
    (tmp_path / "token_labels.json").write_text("{}")  # a label folder (its contents are read when the run starts)
    check_run(load_config("digits_vit", ["train.task=token_labeling", f"token_label.path={tmp_path}"]), dims, "train")
    check_run(load_config("digits_vit", ["train.task=token_labeling"]), dims, "eval")  # evaluates as a classifier
