"""The trainer's logging component: which steps log, and the record of a log step — the one place the
loop reads values back from the device (the loss mean over ranks, the training metrics, the gradient
norm, the non-finite count). A step that does not log reads nothing back (docs/architecture.md; the
test ``tests/unit/test_train_no_sync.py``).

A record holds ``step``, ``loss``, ``lr``, ``img_per_s`` (images since the last record over the wall
time since it, evaluations and checkpoints excluded), ``grad_norm``, the task's metrics (``train_*``),
``tflops`` and ``mfu`` (from the model's forward FLOPs per image and the device's peak), ``epoch``
and, when steps were not applied, ``nonfinite_steps``.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from vitscale.tools.mfu import achieved_tflops, mfu_percent, peak_tflops


def reduce_mean(t: torch.Tensor, world: int) -> torch.Tensor:
    """The mean of ``t`` over the ranks (a copy; ``t`` itself on one rank)."""
    if world > 1 and dist.is_initialized():
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= world
    return t


def model_flops(family, model, img_size) -> float | None:
    """Forward FLOPs of one image as a training step runs it (the family's count: patch dropout's
    dropped patches cost nothing); None when it cannot say."""
    try:
        return float(family.forward_flops(model.cfg, img_size, training=True))
    except Exception:  # FLOPs are informative only
        return None


def device_peak(device: torch.device, autocast) -> float | None:
    """Peak TFLOP/s for MFU: the datasheet figure of the GPU, or on CPU a measured fp32 matmul peak
    with this run's thread count (a fraction of a second, then cached per CPU model and thread count
    in ``$VITSCALE_CACHE_DIR``, as ``vitscale bench`` does)."""
    try:
        dtype = torch.bfloat16 if device.type != "cpu" and autocast is not None else torch.float32
        return float(peak_tflops(device, dtype)[0])
    except Exception:  # MFU is informative only
        return None


def opening_lines(run, total_steps: int, peak_lr: float, warmup: int, step: int, resumed_from: str | None) -> list[str]:
    """What a run says before its first step: accepted config changes, fp8, where it resumed, the
    model, steps, device, batch layout and learning rate."""
    cfg, tc, claim = run.cfg, run.cfg.train, run.claim
    lines = []
    if claim is not None and claim.accepted:
        changed = ", ".join(f"{k}: {a} -> {b}" for k, a, b in claim.accepted)
        lines.append(f"resuming {tc.output_dir} with changes (checkpoint.allow_changes): {changed}")
    if run.float8.recipe != "none":
        lines.append(run.float8.summary())
    if resumed_from:
        lines.append(f"resumed from {resumed_from} at step {step}")
    n_params = sum(p.numel() for p in run.model.parameters())
    lines.append(f"training {cfg.model.name} ({n_params / 1e6:.2f}M params) for {total_steps} steps on {run.device}")
    lines.append(f"batch {tc.batch_size} ({run.micro_batch}/rank x {tc.grad_accum} accum x {run.dims.world_size} ranks), "
                 f"peak lr {peak_lr:.3e}, warmup {warmup} steps")  # fmt: skip
    return lines


class LogStep:
    """``due(step, last, evaluating)``: whether ``step`` logs (every ``train.log_every`` steps, the
    first and last, and with every evaluation); :meth:`record` builds its record."""

    def __init__(self, tc, *, world: int, steps_per_epoch: int, schedule, guard, flops_per_image: float | None,
                 peak: float | None, info):  # fmt: skip
        self.tc, self.world, self.steps_per_epoch = tc, world, steps_per_epoch
        self.schedule, self.guard, self.info = schedule, guard, info
        self.flops, self.peak = flops_per_image, (peak if flops_per_image else None)
        self.reported_nonfinite = guard.checked_total
        self.images, self.t_last = 0, time.perf_counter()

    def restart(self) -> None:
        """Start counting images and time afresh (after a record, an evaluation or a checkpoint)."""
        self.images, self.t_last = 0, time.perf_counter()

    def advance(self) -> None:
        self.images += self.tc.batch_size

    def due(self, step: int, last: bool, evaluating: bool) -> bool:
        return step % self.tc.log_every == 0 or last or evaluating or step == 1

    def record(self, step: int, loss: torch.Tensor, metrics: dict[str, torch.Tensor], grad_norm: torch.Tensor,
               last_checkpoint: str | None) -> dict[str, Any]:  # fmt: skip
        """The record of ``step`` (the sync point); stops a diverged run (:class:`NonFiniteError`)."""
        ips = self.images / max(time.perf_counter() - self.t_last, 1e-9)
        rec: dict[str, Any] = {"step": step, "loss": reduce_mean(loss, self.world).item(),
                               "lr": self.schedule.peak * self.schedule.factor(step), "img_per_s": ips,
                               "grad_norm": float(grad_norm.item())}  # fmt: skip
        for k, v in metrics.items():
            rec[k] = reduce_mean(v, self.world).item()
        if self.flops:
            rec["tflops"] = achieved_tflops(ips, self.flops, "train")
            if self.peak:
                rec["mfu"] = mfu_percent(rec["tflops"], self.peak)
        rec["epoch"] = step / self.steps_per_epoch
        nonfinite = self.guard.check(step, last_checkpoint)  # stops a diverged run
        if nonfinite:
            rec["nonfinite_steps"] = nonfinite
            if nonfinite > self.reported_nonfinite:
                self.info(f"step {step}: {nonfinite - self.reported_nonfinite} step(s) with a non-finite loss or "
                          f"gradient norm not applied since the last log ({nonfinite} in the run)")  # fmt: skip
            self.reported_nonfinite = nonfinite
        return rec


__all__ = ["LogStep", "device_peak", "model_flops", "opening_lines", "reduce_mean"]
