"""vitscale's LAMB (``optim.name=lamb``) takes the steps timm's ``Lamb`` takes (timm's port of apex
``FusedLAMB``, DeiT III's optimizer), on vitscale's parameter groups; the DeiT III BCE targets."""

import copy

import pytest
import torch
import torch.nn.functional as F
from timm.optim import Lamb as TimmLamb

import vitscale
from vitscale.config import load_config
from vitscale.config.schema import OptimConfig
from vitscale.tasks.classification import classification_loss
from vitscale.train.lamb import Lamb
from vitscale.train.optim import build_optimizer

TINY = dict(hidden_size=32, ffn_hidden_size=64, num_layers=2, num_attention_heads=2, patch_dim=4, img_h=8, img_w=8,
            num_channels=1, num_classes=10)  # fmt: skip


def _digits(n=32):
    from sklearn.datasets import load_digits  # here: scikit-learn's import is no cost of collecting the suite

    d = load_digits()
    x = torch.tensor(d.images[:n], dtype=torch.float32).unsqueeze(1) / 16.0  # real 8x8 digits
    return x, torch.tensor(d.target[:n])


def _pair(clip: float | None):
    """Five steps of vitscale's LAMB (clipping by torch's clip_grad_norm_, as the trainer's
    ``train.grad_clip``) and of timm's (its own ``max_grad_norm``) from the same weights, in float64:
    the key bias's gradient is rounding noise (softmax ignores a shift), which Adam-style steps would
    blow up to lr-sized differences in float32."""
    torch.manual_seed(0)
    a = vitscale.create_model("vit_debug", **TINY).double()
    b = vitscale.create_model("vit_debug", **TINY).double()
    b.load_state_dict(a.state_dict())
    cfg = OptimConfig(name="lamb", lr=1e-2, weight_decay=0.05, eps=1e-8)
    ours = build_optimizer(a, cfg, cfg.lr)
    assert isinstance(ours, Lamb) and [g["weight_decay"] for g in ours.param_groups] == [0.05, 0.0, 0.05]
    # the same groups (decay / no_decay / head) for timm's optimizer
    by_id = {id(p): n for n, p in a.named_parameters()}
    named_b = dict(b.named_parameters())
    groups = [{"params": [named_b[by_id[id(p)]] for p in g["params"]], "weight_decay": g["weight_decay"]} for g in ours.param_groups]
    theirs = TimmLamb(groups, lr=1e-2, eps=1e-8, max_grad_norm=clip)
    x, y = _digits()
    x = x.double()
    for _ in range(5):
        for model, opt in ((a, ours), (b, theirs)):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            if model is a and clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
    return a, b


def test_lamb_steps_equal_timm_lamb():
    a, b = _pair(None)
    moved = 0.0
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=name)  # float64, five steps
        torch.manual_seed(0)
        moved = max(moved, (p.float() - vitscale.create_model("vit_debug", **TINY).state_dict()[name]).abs().max().item())
    assert moved > 1e-3  # the weights moved: the agreement is not that of two idle optimizers


def test_lamb_with_grad_clip_equals_timm_max_grad_norm():
    """apex / timm clip the global gradient norm to 1.0 inside the optimizer; vitscale's recipe does it
    with ``train.grad_clip: 1.0``: the same steps (torch's clipping divides by norm + 1e-6)."""
    a, b = _pair(1.0)
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-8, msg=name)


def test_lamb_state_is_adams_and_resumes():
    """The state carries Adam's names (checkpoints treat it as Adam's): a copy of the optimizer loaded
    from the state dict takes the same next step."""
    x, y = _digits()
    models = [vitscale.create_model("vit_debug", **TINY) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [Lamb(m.parameters(), lr=1e-2, weight_decay=0.05) for m in models]
    F.cross_entropy(models[0](x), y).backward()
    opts[0].step()
    assert set(opts[0].state_dict()["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    models[1].load_state_dict(models[0].state_dict())
    opts[1].load_state_dict(copy.deepcopy(opts[0].state_dict()))  # a checkpoint holds copies
    for m, o in zip(models, opts, strict=True):
        o.zero_grad()
        F.cross_entropy(m(x), y).backward()
        o.step()
    for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(p, q)


def test_bce_targets_as_deit3():
    """DeiT III's ``--bce-loss``: mixed targets binarised at 0 (``targets.gt(0.0)``), then torch's
    ``BCEWithLogitsLoss()`` (the mean over images and classes)."""
    torch.manual_seed(0)
    logits = torch.randn(4, 10)
    soft = torch.zeros(4, 10)
    soft[torch.arange(4), torch.tensor([1, 2, 3, 4])] = 0.7
    soft[torch.arange(4), torch.tensor([5, 6, 7, 8])] = 0.3  # a mixup of two classes
    got = classification_loss(logits, soft, "sigmoid", 0.0, bce_sum=False, bce_target_thresh=0.0)
    want = torch.nn.BCEWithLogitsLoss()(logits, soft.gt(0.0).float())
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    summed = classification_loss(logits, soft, "sigmoid", 0.0)  # big_vision: summed over classes
    assert summed.item() == pytest.approx(torch.nn.BCEWithLogitsLoss(reduction="sum")(logits, soft).item() / 4, rel=1e-6)


def test_lamb_keys_checked(tmp_path, capsys):
    """Bad values are one-line refusals before anything runs, through the command line."""
    from vitscale.cli import main
    from vitscale.distributed.parallel_dims import ParallelDims
    from vitscale.errors import CheckError
    from vitscale.run.assemble import resolve_run_model
    from vitscale.run.checks import check_run

    rc = main(["train", "digits_vit", "optim.name=lamb", "train.bce_target_thresh=1.5", f"train.output_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == 2 and "train.bce_target_thresh=1.5 must be in [0, 1)" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "metrics.jsonl").exists()
    cfg = load_config("digits_vit", ["optim.name=lamb", "optim.fused=fused", f"train.output_dir={tmp_path}"])
    with pytest.raises(CheckError, match="one implementation"):
        check_run(cfg, ParallelDims(device=torch.device("cpu")), "train", resolve_run_model(cfg))
