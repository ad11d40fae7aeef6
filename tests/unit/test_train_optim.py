"""Optimizer groups, LR scaling, schedules, EMA and the classification losses."""

import math

import pytest
import torch
import torch.nn.functional as F

from vitscale.config import load_config
from vitscale.config.schema import ScheduleConfig
from vitscale.models import create_model
from vitscale.tasks.classification import classification_loss
from vitscale.train.ema import EMA
from vitscale.train.optim import build_optimizer, param_groups, scaled_lr
from vitscale.train.schedules import lr_factor


def _names(model, group):
    ids = {id(p) for p in group["params"]}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_weight_decay_groups_and_head_decay():
    model = create_model("vit_debug")
    groups = {g["name"]: g for g in param_groups(model, weight_decay=0.3, head_weight_decay=0.01)}
    assert groups["decay"]["weight_decay"] == 0.3 and groups["head"]["weight_decay"] == 0.01
    assert groups["no_decay"]["weight_decay"] == 0.0
    no_decay, decay, head = (_names(model, groups[k]) for k in ("no_decay", "decay", "head"))
    assert {"pos_embed", "cls_token", "norm.weight", "norm.bias", "blocks.0.attn.qkv_per_head.bias"} <= no_decay
    assert "blocks.0.attn.qkv_per_head.weight" in decay and "patch_embed.proj.weight" in decay
    assert head == {"head.weight"}  # the head's bias takes no decay
    assert not decay & no_decay and len(decay | no_decay | head) == len(list(model.parameters()))
    # head_weight_decay None = the body's decay
    g2 = {g["name"]: g for g in param_groups(model, 0.3, None)}
    assert g2["head"]["weight_decay"] == 0.3


@pytest.mark.parametrize("name, cls", [("adamw", torch.optim.AdamW), ("adam", torch.optim.Adam), ("sgd", torch.optim.SGD)])
def test_build_optimizer(name, cls):
    cfg = load_config(None, [f"optim.name={name}", "optim.momentum=0.8", "optim.betas=[0.9, 0.95]"]).optim
    opt = build_optimizer(create_model("vit_debug"), cfg, lr=0.1)
    assert isinstance(opt, cls)
    assert all(g["lr"] == 0.1 and g["initial_lr"] == 0.1 for g in opt.param_groups)
    if name == "sgd":
        assert opt.defaults["momentum"] == 0.8
    else:
        assert opt.defaults["betas"] == (0.9, 0.95)
    assert opt.defaults.get("foreach") or opt.defaults.get("fused")  # multi-tensor on CPU


def test_lr_scaling_rule():
    cfg = load_config(None, ["optim.lr=3e-3", "optim.lr_scale_batch=1024"]).optim
    assert scaled_lr(cfg, 4096) == pytest.approx(1.2e-2)
    cfg.lr_scale_batch = 0
    assert scaled_lr(cfg, 4096) == pytest.approx(3e-3)


def test_cosine_with_warmup():
    s = ScheduleConfig(name="cosine", min_lr=0.1)
    f = [lr_factor(s, t, total_steps=110, warmup_steps=10, peak_lr=1.0) for t in range(1, 111)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)  # linear warmup to the peak
    assert f[59] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f[-1] == pytest.approx(0.1)  # ends at min_lr
    assert all(a >= b for a, b in zip(f[9:], f[10:]))


def test_cosine_cooldown_holds_min_lr_as_timm():
    """timm's --cooldown-epochs (the VOLO code's 10): the cosine ends ``cooldown`` steps before the run,
    whose last steps stay at min_lr; ``cooldown_epochs`` converts by the epoch's length."""
    from vitscale.train.schedules import in_steps

    s = in_steps(ScheduleConfig(name="cosine", min_lr=0.1, cooldown_epochs=2.5), steps_per_epoch=4)
    assert s.cooldown_steps == 10
    f = [lr_factor(s, t, total_steps=110, warmup_steps=10, peak_lr=1.0) for t in range(1, 111)]
    assert f[9] == pytest.approx(1.0) and f[54] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # 90-step cosine
    assert f[99:] == [pytest.approx(0.1)] * 11 and f[98] > 0.1  # the cosine reaches min_lr at step 100 and stays
    assert in_steps(ScheduleConfig(cooldown_steps=3, cooldown_epochs=2.0), 4).cooldown_steps == 3  # steps win


def test_rsqrt_with_warmup_and_linear_cooldown():
    s = ScheduleConfig(name="rsqrt", rsqrt_timescale=100, cooldown_steps=50)
    f = lambda t: lr_factor(s, t, total_steps=1000, warmup_steps=10, peak_lr=1.0)  # noqa: E731
    assert f(5) == pytest.approx(0.5)
    assert f(10) == pytest.approx(1.0)
    assert f(410) == pytest.approx(math.sqrt(100 / 500))  # 400 steps after warmup
    assert f(950) == pytest.approx(math.sqrt(100 / 1040))  # cooldown starts after step 950
    assert f(975) == pytest.approx(math.sqrt(100 / 1065) * 0.5)
    assert f(1000) == 0.0


def test_constant_schedule():
    s = ScheduleConfig(name="constant", cooldown_steps=0)
    assert [lr_factor(s, t, 10, 2, 1.0) for t in (1, 2, 3, 10)] == [0.5, 1.0, 1.0, 1.0]


def test_a_cosine_warmup_is_dinov3s_rising_cosine_from_zero():
    """DINOv3's high-resolution stage (``schedules.lr`` start 0, peak 0, end E, cosine_epochs 10: a cosine from
    0 up to E, then E, dinov3/train/cosine_lr_scheduler.py lines 76-85) as warmup_shape=cosine of 10 steps."""
    import numpy as np

    s = ScheduleConfig(name="constant", warmup_steps=10, warmup_shape="cosine")
    got = [lr_factor(s, t, 30, 10, 1.0) for t in range(1, 31)]
    want = np.concatenate([(0 - 1) * (np.cos(np.linspace(0, np.pi, 10)) + 1) / 2 + 1, np.full(20, 1.0)])
    assert got == pytest.approx(want.tolist(), abs=1e-12) and got[0] == 0.0 and got[9] == 1.0
    assert lr_factor(ScheduleConfig(name="constant", warmup_shape="cosine"), 1, 30, 1, 1.0) == 1.0  # a 1-step warm-up


def test_ema_update():
    model = torch.nn.Linear(3, 2)
    ema = EMA(model, decay=0.9)
    before = ema.module.weight.clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model)
    torch.testing.assert_close(ema.module.weight, 0.9 * before + 0.1 * model.weight)
    assert not any(p.requires_grad for p in ema.module.parameters())


def test_classification_losses():
    torch.manual_seed(0)
    logits, labels = torch.randn(6, 5), torch.tensor([0, 1, 2, 3, 4, 0])
    ls = classification_loss(logits, labels, "softmax", 0.1)
    torch.testing.assert_close(ls, F.cross_entropy(logits, labels, label_smoothing=0.1))
    soft = torch.softmax(torch.randn(6, 5), -1)
    torch.testing.assert_close(classification_loss(logits, soft, "softmax", 0.0), -(soft * logits.log_softmax(-1)).sum(-1).mean())
    onehot = F.one_hot(labels, 5).float()
    expected = -(onehot * F.logsigmoid(logits) + (1 - onehot) * F.logsigmoid(-logits)).sum(-1).mean()
    torch.testing.assert_close(classification_loss(logits, labels, "sigmoid", 0.0), expected)
