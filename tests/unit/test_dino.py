"""DINOv2's pieces (vitscale.tasks.dino_*): each loss and target against its formula in float64, the
schedules against the reference's arrays, the keyed crops and masks, the head's weight norm, the
teacher signals and their warnings, and the config's one-line refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vitscale.data import data_config
from vitscale.data.views import ViewTransform
from vitscale.tasks.dino_config import DinoConfig
from vitscale.tasks.dino_crops import dino_views
from vitscale.tasks.dino_head import DinoHead
from vitscale.tasks.dino_loss import (
    dino_loss,
    ibot_loss,
    koleo_loss,
    momentum_at,
    sinkhorn_knopp,
    softmax_centered,
    teacher_temp_at,
    update_center,
)
from vitscale.tasks.health import Alarm, TeacherWatch, teacher_signals


def _logits(b=12, k=7, seed=0):
    return torch.randn(b, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 0.5


def test_sinkhorn_knopp_is_the_alternating_normalisation_in_float64():
    x = _logits()
    b, k, temp = x.shape[0], x.shape[1], 0.1
    q = np.exp(x.numpy() / temp).T  # (K, B)
    q = q / q.sum()
    for _ in range(3):
        q = q / q.sum(axis=1, keepdims=True) / k
        q = q / q.sum(axis=0, keepdims=True) / b
    want = (q * b).T
    got = sinkhorn_knopp(x.float(), temp)
    assert np.allclose(got.double().numpy(), want, rtol=1e-4, atol=1e-6)
    assert torch.allclose(got.sum(dim=1), torch.ones(b), atol=1e-5)  # each row an assignment
    # with a row count: the iBOT variant normalises its columns by that count
    got_n = sinkhorn_knopp(x.float(), temp, count=torch.tensor(float(b)))
    assert torch.allclose(got_n, got)


def test_softmax_centring_and_the_running_centre_in_float64():
    x, centre = _logits(), torch.linspace(-0.2, 0.2, 7)[None]
    want = np.exp((x.numpy() - centre.double().numpy()) / 0.04)
    want /= want.sum(axis=1, keepdims=True)
    assert np.allclose(softmax_centered(x.float(), centre, 0.04).double().numpy(), want, atol=1e-5)
    c = centre.clone()
    update_center(c, x.float(), 0.9)
    assert np.allclose(c.double().numpy(), 0.9 * centre.double().numpy() + 0.1 * x.numpy().mean(axis=0), atol=1e-6)
    c3 = torch.zeros(1, 7)  # iBOT's patch rows, any leading shape
    update_center(c3, x.float().reshape(3, 4, 7), 0.5)
    assert np.allclose(c3.double().numpy(), 0.5 * x.numpy().mean(axis=0), atol=1e-6)


def test_dino_loss_pairs_each_student_crop_with_the_other_teacher_crops():
    b, k, st = 5, 6, 0.1
    g = [_logits(b, k, s) for s in (1, 2)]
    loc = [_logits(b, k, s) for s in (3, 4, 5)]
    t = [torch.softmax(_logits(b, k, s) / 0.05, dim=-1) for s in (6, 7)]

    def ce(tt, ss):
        ls = ss.numpy() / st
        ls = ls - np.log(np.exp(ls).sum(axis=1, keepdims=True))
        return float(-(tt.numpy() * ls).sum(axis=1).mean())

    want = (ce(t[1], g[0]) + ce(t[0], g[1]) + sum(ce(tt, s) for s in loc for tt in t)) / (2 + 2 * 3)
    got = dino_loss([x.float() for x in g], [x.float() for x in loc], [x.float() for x in t], st)
    assert abs(float(got) - want) < 1e-5


@pytest.mark.parametrize("n_local", [0, 1, 4])
def test_dino_loss_divides_as_dinov2_at_any_local_crop_count(n_local):
    # dinov2/train/ssl_meta_arch.py lines 147-148 at b8931f7: n_global_crops_loss_terms + max(n_local * n_g, 1)
    b, k, st = 4, 5, 0.1
    g = [_logits(b, k, s) for s in (1, 2)]
    loc = [_logits(b, k, 10 + s) for s in range(n_local)]
    t = [torch.softmax(_logits(b, k, s) / 0.05, dim=-1) for s in (6, 7)]

    def ce(tt, ss):
        ls = ss.numpy() / st
        ls = ls - np.log(np.exp(ls).sum(axis=1, keepdims=True))
        return float(-(tt.numpy() * ls).sum(axis=1).mean())

    terms = (2 - 1) * 2 + max(n_local * 2, 1)
    want = (ce(t[1], g[0]) + ce(t[0], g[1]) + sum(ce(tt, s) for s in loc for tt in t)) / terms
    got = dino_loss([x.float() for x in g], [x.float() for x in loc], [x.float() for x in t], st)
    assert abs(float(got) - want) < 1e-5
    if n_local == 0:  # the old count (2 pairs) would give 1.5x this
        assert abs(float(got) * 3 / 2 - (ce(t[1], g[0]) + ce(t[0], g[1])) / 2) < 1e-5


def test_koleo_is_minus_the_mean_log_distance_to_the_nearest_other_row():
    x = _logits(9, 5, 3)
    xn = x.numpy() / np.linalg.norm(x.numpy(), axis=1, keepdims=True)
    d = np.linalg.norm(xn[:, None] - xn[None], axis=-1) + np.eye(9) * 1e9
    nn_ = d.argmin(axis=1)
    want = -np.mean(np.log(np.linalg.norm(xn - xn[nn_] + 1e-8, axis=1) + 1e-8))
    assert abs(float(koleo_loss(x.float())) - want) < 1e-5


def test_ibot_loss_weights_each_crops_masked_patches_by_their_count():
    masks = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    m = int(masks.sum())
    s, t = _logits(m, 6, 8), torch.softmax(_logits(m, 6, 9) / 0.05, dim=-1)
    w = (1 / masks.sum(-1).clamp(min=1).float())[:, None].expand_as(masks)[masks]
    ls = s.numpy() / 0.1
    ls = ls - np.log(np.exp(ls).sum(axis=1, keepdims=True))
    per = -(t.numpy() * ls).sum(axis=1)  # rows: crop 0 (2), crop 2 (3)
    want = (per[:2].mean() + per[2:].mean()) / 3  # the mean over the crops, unmasked crops counted
    assert abs(float(ibot_loss(s.float(), t.float(), w, 3, 0.1)) - want) < 1e-5


def test_schedules_are_the_references_arrays():
    warm = 7
    lin = np.linspace(0.04, 0.07, warm)
    assert [teacher_temp_at(i, 0.04, 0.07, warm) for i in range(warm + 3)] == pytest.approx([*lin, 0.07, 0.07, 0.07])
    total = 50
    cos = 1.0 + 0.5 * (0.992 - 1.0) * (1 + np.cos(np.pi * np.arange(total) / total))
    assert [momentum_at(i, 0.992, 1.0, total) for i in range(total + 1)] == pytest.approx([*cos, 1.0])
    assert momentum_at(0, 0.992, 1.0, total) == pytest.approx(0.992)


def _views(dc, image, index=3, epoch=0):
    """The views of one in-memory image as the loader's workers cut them (vitscale.data.views)."""
    tf = ViewTransform(data_config(format="digits"), (24, 24), 3, 0, dino_views(dc, 4))
    return tf.tensor_train(image, epoch, index).image


def test_the_crops_flip_jitter_blur_and_solarise_with_the_configured_probabilities():
    """``dino.hflip`` 1 against 0, every other augmentation off: the same boxes (the draws do not depend
    on the probabilities), mirrored; the colour jitter, blur and solarisation at probability 1 change them."""
    off = dict(global_crops_size=16, local_crops_size=8, local_crops_number=1, color_jitter=0.0,
               gaussian_blur=[0.0, 0.0, 0.0], solarization=0.0)  # fmt: skip
    x = (torch.rand(1, 24, 24, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8).expand(3, -1, -1)
    v0, v1 = _views(DinoConfig(**off, hflip=0.0), x), _views(DinoConfig(**off, hflip=1.0), x)
    for key in ("global", "local"):
        for a, b in zip(v0.crops[key], v1.crops[key], strict=True):
            assert torch.equal(b, a.flip(-1))
    g0 = torch.stack(v0.crops["global"]).float()
    assert not torch.equal(g0[0], g0[1])  # the two global crops of a sample differ
    for key, p in (("color_jitter", 1.0), ("gaussian_blur", [1.0, 1.0, 1.0]), ("solarization", 1.0)):
        g = torch.stack(_views(DinoConfig(**{**off, key: p}, hflip=0.0), x).crops["global"]).float()
        assert (g - g0).abs().max() > 2, key
    assert torch.equal(_views(DinoConfig(**off), x).crops["global"][0], _views(DinoConfig(**off), x).crops["global"][0])
    assert not torch.equal(_views(DinoConfig(**off), x, epoch=1).crops["global"][0], v0.crops["global"][0])


def test_head_prototypes_are_weight_normalised():
    head = DinoHead(16, 10, nlayers=3, hidden_dim=32, bottleneck_dim=8)
    with torch.no_grad():
        head.last_g.copy_(torch.arange(1, 11, dtype=torch.float32)[:, None])
    z = torch.randn(4, 16)
    h = torch.nn.functional.normalize(head.mlp(z), dim=-1)
    w = head.last_v / head.last_v.norm(dim=1, keepdim=True) * head.last_g
    assert torch.allclose(head(z), h @ w.t(), atol=1e-6)
    assert torch.allclose(w.norm(dim=1), head.last_g[:, 0])


def test_teacher_signals_in_float64_and_one_warning_per_crossing():
    p = torch.softmax(_logits(10, 8, 4) / 0.1, dim=-1)
    pn = p.numpy()
    ent = float(np.mean(-(pn * np.log(pn)).sum(axis=1)))
    pbar = pn.mean(axis=0)
    kl = float(np.sum(pbar * np.log(pbar * 8)))
    got = teacher_signals(p.float())
    assert got == pytest.approx((ent, kl), abs=1e-5)
    w = TeacherWatch()  # a line once a signal has stayed past its threshold at HOLD = 3 log steps in a row
    w.keep(torch.full((4, 8), 1 / 8))  # every target uniform: entropy log K
    vals, lines = w.read(3)
    assert vals["train_teacher_entropy"] == pytest.approx(math.log(8)) and lines == []  # one log step: no line yet
    assert w.read(4)[1] == []
    lines = w.read(5)[1]  # the third in a row: one line
    assert len(lines) == 1 and lines[0].startswith("warning: step 5: the teacher's entropy is 2.079 nats, above 0.9 x log K")
    assert "since step 3" in lines[0]
    assert w.read(6)[1] == []  # still high: no second line
    onehot = torch.zeros(4, 8)
    onehot[:, 2] = 1  # every target on one prototype: KL log K (and the entropy back to 0)
    w.keep(onehot)
    assert w.read(7)[1] == [] and w.read(8)[1] == []
    vals, lines = w.read(9)
    assert vals["train_teacher_kl_uniform"] == pytest.approx(math.log(8)) and len(lines) == 1 and "KL" in lines[0]
    w.keep(p.float())  # neither past its threshold: both alarms reset
    assert w.read(10)[1] == []
    w.keep(torch.full((4, 8), 1 / 8))  # a second excursion of the entropy: one line again once it holds
    assert w.read(11)[1] == [] and w.read(12)[1] == [] and len(w.read(13)[1]) == 1


@pytest.mark.parametrize("kw, msg", [
    ({"ibot_mask_ratio_min_max": [0.0, 0.5]}, "ibot_mask_ratio_min_max=[0.0, 0.5] must be [min, max] within (0, 1)"),
    ({"ibot_mask_ratio_min_max": [0.1, 1.0]}, "within (0, 1)"),
    ({"centering": "mean"}, "centering='mean': choose one of softmax, sinkhorn_knopp"),
    ({"local_crops_scale": [0.5, 0.2]}, "local_crops_scale=[0.5, 0.2] must be [min, max]"),
    ({"gaussian_blur": [1.0, 0.1]}, "gaussian_blur=[1.0, 0.1] must be 3 probabilities"),
    ({"hflip": 1.5}, "hflip=1.5 must be probabilities within [0, 1]"),
    ({"gram_loss_weight": -1.0}, "gram_loss_weight=-1.0 must be a finite number >= 0"),
    ({"gram_update_frequency": 0}, "gram_update_frequency=0 must be >= 1"),
    ({"gram_it_first_update": -3}, "gram_it_first_update=-3 must be >= 0"),
    ({"gram_max_updates": -1}, "gram_max_updates=-1 must be >= 0, or null"),
    ({"gram_tokens_used": "some"}, "gram_tokens_used='some': choose one of all, masked, unmasked"),
    ({"gram_tokens_used": "masked", "gram_img_level": True}, "selects patches across the batch: set gram_img_level=false"),
    ({"gram_remove_neg": True, "gram_remove_only_teacher_neg": True}, "are exclusive"),
    ({"gram_loss_weight": 1.0, "gram_ema_teacher": True}, "gram_ema_teacher=true uses the EMA teacher itself"),
])  # fmt: skip
def test_bad_dino_settings_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        DinoConfig(**kw)


def test_the_teacher_follows_the_student_by_its_momentum_and_the_prototypes_wait(tmp_path):
    """Two optimizer steps of a tiny digits_dino trainer: the prototypes get no update in the frozen
    first step (their groups at learning rate 0, as DINOv2's ``last_layer_lr_schedule``: AdamW's weight
    decay does not move them either), then do; the teacher is the student's copy until the first
    optimizer update, then ``m0 t + (1 - m0) s`` of the student after it (the training module's
    ``after_update``), then ``m1 t + (1 - m1) s`` after the second."""
    from vitscale.config import load_config
    from vitscale.train.trainer import Trainer

    cfg = load_config("digits_dino", ["data.num_workers=0", "log.flops=false", "checkpoint.every=0", "eval.every=0",
                                      "log.progress=none", "log.report=false", "model.hidden_size=32",
                                      "model.ffn_hidden_size=64", "model.num_layers=1", "model.num_attention_heads=2",
                                      "dino.local_crops_number=1", "dino.head_n_prototypes=32", "dino.head_hidden_dim=32",
                                      "dino.head_bottleneck_dim=16", "train.batch_size=16", "optim.weight_decay=0.04",
                                      "dino.freeze_last_layer_epochs=0.011", "train.max_steps=10",
                                      f"train.output_dir={tmp_path / 'run'}"])  # fmt: skip
    t = Trainer(cfg)
    task = t.task
    assert task.freeze_steps == 1 and task.total == 10
    head, teacher = task.student.head, task.teacher

    def snap(params):
        return [p.detach().clone() for p in params]

    v0, mlp0 = snap(head.last_layer_parameters()), snap(head.mlp.parameters())
    backbone0 = snap(t.model.parameters())
    assert all(a.equal(b) for a, b in zip(backbone0, teacher["backbone"].parameters(), strict=True))
    batches = t._batches()
    t_before = snap(a for a, _ in task.ema_pairs)
    t.step += 1
    t.train_step(batches)  # iteration 0: prototypes frozen; then the teacher moves
    lrs = {g["name"]: g["lr"] for g in t.optimizer.param_groups}
    assert lrs["decay.prototypes"] == 0.0 and lrs["decay"] > 0
    assert all(a.equal(b) for a, b in zip(v0, head.last_layer_parameters(), strict=True))
    assert not all(a.equal(b) for a, b in zip(mlp0, head.mlp.parameters(), strict=True))
    m0 = momentum_at(0, cfg.dino.momentum_teacher, cfg.dino.final_momentum_teacher, 10)
    for (got, s), old in zip(task.ema_pairs, t_before, strict=True):
        assert torch.allclose(got, m0 * old + (1 - m0) * s, atol=1e-6)
    t_before = snap(a for a, _ in task.ema_pairs)
    t.step += 1
    t.train_step(batches)  # iteration 1: the prototypes train, then the teacher moves again
    m1 = momentum_at(1, cfg.dino.momentum_teacher, cfg.dino.final_momentum_teacher, 10)
    for (got, s), old in zip(task.ema_pairs, t_before, strict=True):
        assert torch.allclose(got, m1 * old + (1 - m1) * s, atol=1e-6)
    assert not all(a.equal(b) for a, b in zip(v0, head.last_layer_parameters(), strict=True))


def test_weight_decay_follows_dinov2s_cosine(tmp_path):
    """``dino.weight_decay_end``: before each update the decaying groups get DINOv2's ``wd_schedule[it]``
    (``CosineScheduler(base_value=weight_decay, final_value=weight_decay_end, total_iters)`` of
    facebookresearch/dinov2 ``dinov2/utils/utils.py``, no warm-up: ``final + (base - final)(1 + cos(pi i /
    total)) / 2`` over ``i = arange(total)``), the groups without decay keep 0; a setting without a start
    is refused in one line."""
    from vitscale.config import load_config
    from vitscale.errors import ConfigError
    from vitscale.train.trainer import Trainer

    args = ["data.num_workers=0", "log.flops=false", "checkpoint.every=0", "eval.every=0", "log.progress=none",
            "log.report=false", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=1",
            "model.num_attention_heads=2", "dino.local_crops_number=0", "dino.head_n_prototypes=32",
            "dino.head_hidden_dim=32", "dino.head_bottleneck_dim=16", "train.batch_size=16", "train.max_steps=7",
            "dino.weight_decay_end=0.4"]  # fmt: skip
    t = Trainer(load_config("digits_dino", [*args, "optim.weight_decay=0.04", f"train.output_dir={tmp_path / 'a'}"]))
    total = 7
    i = np.arange(total)
    reference = 0.4 + 0.5 * (0.04 - 0.4) * (1 + np.cos(np.pi * i / len(i)))  # dinov2's wd_schedule.schedule
    got = []
    for step in range(1, total + 1):
        t.schedule.apply(step)  # the run's schedule, with what the training module schedules itself
        decays = {g["name"]: g["weight_decay"] for g in t.optimizer.param_groups}
        assert decays["no_decay"] == 0.0
        got.append(decays["decay"])
    np.testing.assert_allclose(got, reference, rtol=1e-12)
    with pytest.raises(ConfigError, match=r"^dino.weight_decay_end=0.4 needs a start: set optim.weight_decay > 0"):
        Trainer(load_config("digits_dino", [*args, "optim.weight_decay=0", f"train.output_dir={tmp_path / 'b'}"]))


def test_a_head_tensor_parallelism_cannot_split_is_refused_in_one_line_before_the_run():
    """``parallel.tp=2`` splits the prototypes and the heads' hidden units over the ranks: a prototype
    count (or head width) it does not divide is refused by the run's up-front checks (before any data
    is read or model built), naming the keys and the fix; sizes it divides are accepted."""
    from vitscale.config import load_config
    from vitscale.distributed.parallel_dims import ParallelDims
    from vitscale.errors import CheckError
    from vitscale.run.assemble import resolve_run_model
    from vitscale.run.checks import check_run

    tp2 = ParallelDims(tp=2, world_size=2)
    cfg = load_config("digits_dino", ["parallel.tp=2", "model.num_attention_heads=2", "dino.head_n_prototypes=1023",
                                      "dino.head_hidden_dim=255"])  # fmt: skip
    model = resolve_run_model(cfg)
    with pytest.raises(CheckError) as e:
        check_run(cfg, tp2, "train", model)
    assert str(e.value) == ("parallel.tp=2 does not split the DINO / iBOT heads: dino.head_n_prototypes=1023 is not "
                            "divisible by 2 (tp that divide it: 1, 3, 11, 31, 33, ...); dino.head_hidden_dim=255 is not "
                            "divisible by 2 (tp that divide it: 1, 3, 5, 15, 17, 51, ...); set the head sizes to "
                            "multiples of parallel.tp")  # fmt: skip
    one_layer = load_config("digits_dino", ["parallel.tp=2", "model.num_attention_heads=2", "dino.head_nlayers=1",
                                            "dino.head_hidden_dim=255"])  # fmt: skip
    check_run(one_layer, tp2, "train", model)  # a one-layer head has no hidden units to split
    check_run(load_config("digits_dino", ["parallel.tp=2", "model.num_attention_heads=2"]), tp2, "train", model)
    check_run(cfg, ParallelDims(dp_shard=2, world_size=2), "train", model)  # FSDP2: accepted


def test_an_alarm_holds_over_a_share_of_the_run():
    """In a run of 1,200 steps logged every step, a signal past its threshold for 37 steps (digits_dino's
    random teacher, seed 2) is no alarm; one past it for 60 steps (5% of the run) is, once; logged every
    25 steps, the fourth log step in a row past it (75 steps) is the first over 60."""
    alarm = Alarm()
    alarm.for_run(1200)
    assert alarm.min_span == 60
    said = [s for s in range(1, 200) if alarm(s, 12 <= s <= 49)]
    assert said == []  # 12..49: 37 steps
    said = [(s, alarm.since) for s in range(1, 300) if alarm(s, 100 <= s <= 250)]
    assert said == [(160, 100)]  # once, 60 steps after the first
    coarse = Alarm()
    coarse.for_run(1200)
    assert [s for s in range(25, 1201, 25) if coarse(s, 25 <= s <= 50)] == []  # digits_dino at log_every 25
    assert [s for s in range(25, 1201, 25) if coarse(s, s >= 400)] == [475]  # 400, 425, 450: 50 steps; 475: 75
    short = Alarm()
    short.for_run(4)  # 5% of 4 steps: 1 step; the three log steps in a row decide
    assert [s for s in range(1, 5) if short(s, True)] == [3]


def test_a_frozen_backbone_lets_the_heads_warm_up_and_the_patch_embedding_learns_slower(tmp_path):
    """``dino.freeze_backbone_steps``: the student's backbone gets learning rate 0 (no AdamW step, no
    decay) while the heads train; then it trains, its patch embedding at ``dino.patch_embed_lr_mult`` of
    the rate (DINOv2's 0.2, ``dinov2/utils/param_groups.py`` lines 83-84). A freeze as long as the run
    is refused in one line before anything is built."""
    from vitscale.config import load_config
    from vitscale.errors import ConfigError
    from vitscale.train.trainer import Trainer

    args = ["data.num_workers=0", "log.flops=false", "checkpoint.every=0", "eval.every=0", "log.progress=none",
            "log.report=false", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=1",
            "model.num_attention_heads=2", "dino.local_crops_number=0", "dino.head_n_prototypes=32",
            "dino.head_hidden_dim=32", "dino.head_bottleneck_dim=16", "train.batch_size=16", "train.max_steps=4",
            "schedule.name=constant", "schedule.warmup_steps=0", "dino.freeze_last_layer_epochs=0"]  # fmt: skip
    t = Trainer(load_config("digits_dino", [*args, "dino.freeze_backbone_steps=1", f"train.output_dir={tmp_path / 'a'}"]))
    body = [p.detach().clone() for p in t.model.parameters()]
    head = [p.detach().clone() for p in t.task.student.head.mlp.parameters()]
    batches = t._batches()
    t.step += 1
    t.train_step(batches)
    lrs = {g["name"]: g["lr"] for g in t.optimizer.param_groups}
    assert lrs["decay"] == 0.0 and lrs["no_decay.patch_embed"] == 0.0 and lrs["decay.heads"] > 0
    assert all(a.equal(b) for a, b in zip(body, t.model.parameters(), strict=True))
    assert not all(a.equal(b) for a, b in zip(head, t.task.student.head.mlp.parameters(), strict=True))
    t.step += 1
    t.train_step(batches)
    lrs = {g["name"]: g["lr"] for g in t.optimizer.param_groups}
    assert lrs["decay.patch_embed"] == pytest.approx(0.2 * lrs["decay"]) and lrs["decay"] > 0
    assert not all(a.equal(b) for a, b in zip(body, t.model.parameters(), strict=True))
    with pytest.raises(ConfigError, match=r"^dino.freeze_backbone_steps=4 freezes the backbone for the whole 4-step run"):
        Trainer(load_config("digits_dino", [*args, "dino.freeze_backbone_steps=4", f"train.output_dir={tmp_path / 'b'}"]))
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("logged, said", [((1, 2), [2]), ((1, 7), [7]), ((1,), []), ((1, 4, 7), [7]), ((1, 7, 8), [8])])
def test_a_run_under_three_log_steps_warns_at_its_last(logged, said):
    """A run logged fewer than HOLD times (its first and last step: train.max_steps=2, or log_every above
    the run's length) warns at its last step when the signal was past it at every log step; one log step
    alone never does (a first step cannot tell a random start from a collapse)."""
    alarm = Alarm()
    alarm.for_run(logged[-1])
    assert [s for s in logged if alarm(s, True)] == said
    back = Alarm()  # past at the last step only: no line
    back.for_run(2)
    assert [s for s in (1, 2) if back(s, s == 2)] == []
    w = TeacherWatch()  # the same through the teacher's signals: a 2-step run of a uniform teacher
    w.for_run(2)
    w.keep(torch.full((4, 8), 1 / 8))
    assert w.read(1)[1] == [] and w.read(2)[1][0].startswith("warning: step 2: the teacher's entropy is 2.079 nats")
