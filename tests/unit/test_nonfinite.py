"""Non-finite steps are not applied, on either way of skipping them (``vitscale/train/nonfinite.py``):
fused optimizers skip on the device (``found_inf``), foreach ones by the host's reading of the flag.
A run that meets a NaN batch between two good ones ends exactly where the run without that batch
ends: the same weights, optimizer state (Adam's step count too) and EMA, bit for bit. And nothing
non-finite is written into a checkpoint or an export, or read from one."""

from __future__ import annotations

import pytest
import torch

from vitscale.checkpoint import (
    Checkpointer,
    NonFiniteWeights,
    export_safetensors,
    read_weights,
    write_weights,
)
from vitscale.config import load_config
from vitscale.train.nonfinite import NonFiniteError
from vitscale.train.trainer import Trainer

FAST = ["data.num_workers=0", "log.flops=false", "checkpoint.every=0", "eval.every=0", "log.progress=none",
        "train.device=cpu", "model.num_layers=1", "train.batch_size=8", "train.ema_decay=0.9",
        "schedule.name=constant", "schedule.warmup_steps=0", "train.grad_clip=1.0"]  # fmt: skip


def _trainer(tmp_path, name: str, *extra: str) -> Trainer:
    return Trainer(load_config("digits_vit", [*FAST, f"train.output_dir={tmp_path / name}", *extra]))


def _poisoned(batch: dict) -> dict:
    bad = dict(batch)
    bad["image"] = torch.full_like(batch["image"], float("nan"))  # a NaN input: loss and gradients NaN
    return bad


def _snapshot(t: Trainer) -> dict:
    opt = {f"{i}.{k}": v.clone() for i, p in enumerate(t.model.parameters()) for k, v in t.optimizer.state[p].items()}
    return {
        "model": {k: v.clone() for k, v in t.model.state_dict().items()},
        "ema": {k: v.clone() for k, v in t.ema.module.state_dict().items()},
        "optim": opt,
    }


def _same(a: dict, b: dict) -> None:
    for group in ("model", "ema", "optim"):
        assert a[group].keys() == b[group].keys(), group
        for k in a[group]:
            assert torch.equal(a[group][k], b[group][k]), f"{group} {k}"


@pytest.mark.parametrize("optim", [["optim.fused=fused"], ["optim.fused=foreach"],
                                   ["optim.name=sgd", "optim.fused=fused"], ["optim.name=sgd", "optim.fused=foreach"]])  # fmt: skip
def test_a_nonfinite_step_leaves_no_trace(tmp_path, optim):
    with_bad, without = _trainer(tmp_path, "a", *optim), _trainer(tmp_path, "b", *optim)
    assert with_bad.skip_on_device == without.skip_on_device == ("optim.fused=fused" in optim)
    loader = with_bad._batches()
    good1, good2 = next(loader), next(loader)
    # the first step is the skipped one: fused SGD's first step would otherwise leave its momentum unset
    with_bad.step = 1
    loss, _, grad_norm = with_bad.train_step(iter([_poisoned(good1)]))
    assert not torch.isfinite(loss) and not torch.isfinite(grad_norm)
    for t, first in ((with_bad, 2), (without, 1)):  # the same two good batches after it
        for step, batch in enumerate((good1, good2), start=first):
            t.step = step
            t.train_step(iter([batch]))
    _same(_snapshot(with_bad), _snapshot(without))
    assert with_bad.guard.check(3, None) == 1 and without.guard.check(2, None) == 0
    if "optim.name=sgd" not in optim:  # Adam's step count: 2 updates, not 3
        assert all(int(s["step"]) == 2 for s in with_bad.optimizer.state.values())
    with_bad.close()
    without.close()


@pytest.mark.parametrize("fused", ["foreach", "fused"])
def test_the_budget_stops_the_run(tmp_path, fused):
    """foreach: the host reads the flag and checks the budget at the skipped step itself; fused (the
    default): the counts stay on the device and the log step checks them (here every step logs)."""

    def step(t, n, batch):
        t.step = n
        t.train_step(iter([batch]))
        if t.skip_on_device:
            t.guard.check(n, None)  # what LogStep.record does at a log step

    t = _trainer(tmp_path, "r", "train.max_consecutive_nonfinite=2", "train.max_nonfinite_steps=3", f"optim.fused={fused}")
    assert t.skip_on_device == (fused == "fused")
    good = next(t._batches())
    for n in (1, 2):
        step(t, n, _poisoned(good))
    step(t, 3, good)  # the run of bad steps ends; 2 in a row is within the budget
    step(t, 4, _poisoned(good))  # the third in total: still within 3
    with pytest.raises(NonFiniteError, match=r"stopped at step 5: .*4 in the run, more than train.max_nonfinite_steps=3"):
        step(t, 5, _poisoned(good))
    t.close()
    t = _trainer(tmp_path, "s", "train.max_consecutive_nonfinite=1", f"optim.fused={fused}")
    step(t, 1, _poisoned(good))
    with pytest.raises(NonFiniteError, match="2 in a row, more than train.max_consecutive_nonfinite=1"):
        step(t, 2, _poisoned(good))
    t.close()


def test_nothing_nonfinite_is_written_or_read(tmp_path):
    ok = {"w": torch.ones(3), "b": torch.zeros(2)}
    bad = {"w": torch.tensor([1.0, float("inf"), 0.0]), "b": torch.zeros(2)}
    ck = Checkpointer(tmp_path / "checkpoints", keep=2)
    ck.save(1, {"model": ok}, {"step": 1, "data": {}})
    with pytest.raises(NonFiniteWeights, match=r"not saving checkpoint .*step_00000002: non-finite values in model.w;"):
        ck.save(2, {"model": bad}, {"step": 2, "data": {}})
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_00000001"]  # nothing half-written

    with pytest.raises(NonFiniteWeights, match="not writing .*bad.safetensors: non-finite values in w"):
        write_weights(bad, tmp_path / "bad.safetensors")
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.bias[0] = float("nan")
    with pytest.raises(NonFiniteWeights, match="non-finite values in bias"):
        export_safetensors(model, tmp_path / "model.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]  # no export, no .tmp left

    from safetensors.torch import save_file

    save_file(bad, str(tmp_path / "other.safetensors"))  # someone else's file holding an infinity
    with pytest.raises(NonFiniteWeights, match="other.safetensors: non-finite values in w: these weights are not used"):
        read_weights(tmp_path / "other.safetensors")


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_clipping_folded_into_the_fused_kernels_is_the_in_place_clipping(tmp_path, name):
    """Fused kernels clip through their ``grad_scale`` (each gradient divided as the kernel reads it:
    ``clip_gradients(fold=True)`` in ``Trainer.train_step``) instead of the in-place multiply of
    ``torch.nn.utils.clip_grad_norm_`` before the step. Three trainer steps end on the weights,
    optimizer state and EMA of three steps clipped in place and then applied by the same fused
    kernel, with a clip that binds (0.01) and one that does not (1e3); the binding clip changes the
    weights (so the comparison sees clipping at all)."""
    from vitscale.train.nonfinite import apply_update, clip_gradients

    ends = {}
    for clip in (0.01, 1000.0):
        folded, in_place = (_trainer(tmp_path, f"{kind}{clip}", f"optim.name={name}", "optim.fused=fused",
                                     f"train.grad_clip={clip}") for kind in ("folded", "in_place"))  # fmt: skip
        assert folded.skip_on_device and in_place.skip_on_device
        loader = folded._batches()
        norms = {"folded": [], "in_place": []}
        for step, batch in enumerate([next(loader) for _ in range(3)], start=1):
            folded.step = in_place.step = step
            norms["folded"].append(float(folded.train_step(iter([batch]))[2]))
            t = in_place  # the same step, clipped in place first (the trainer's path before the fold)
            loss, _ = t.task.loss(t.model, t._to_device(batch), step - 1)
            loss.backward()
            params = [p for p in t.model.parameters() if p.grad is not None]
            norm, unscale = clip_gradients(params, clip, world=1, fold=False)  # the in-place branch
            assert unscale is None
            norms["in_place"].append(float(norm))
            t.schedule.apply(step)
            t.ema.update(t.model, apply_update(t.optimizer, t.guard.flag(loss.detach(), norm, 1), on_device=True))
            t.optimizer.zero_grad(set_to_none=True)
        assert norms["folded"] == pytest.approx(norms["in_place"], rel=1e-6)  # the norm before clipping, logged
        a, b = _snapshot(folded), _snapshot(in_place)
        for group in ("model", "ema", "optim"):
            for k in b[group]:
                torch.testing.assert_close(a[group][k], b[group][k], rtol=1e-5, atol=1e-7)
        ends[clip] = (a["model"], norms["folded"])
        folded.close()
        in_place.close()
    assert min(ends[0.01][1]) > 0.01  # the clip bound at every step ...
    clipped, free = ends[0.01][0], ends[1000.0][0]
    assert any(not torch.allclose(clipped[k], free[k], rtol=1e-3, atol=1e-5) for k in free)  # ... and changed the update
