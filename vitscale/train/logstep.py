"""The trainer's logging component: which steps log, and the record of a log step — the one place the
loop reads values back from the device (the loss mean over ranks, the training metrics, the gradient
norm, the non-finite count). A step that does not log reads nothing back (docs/architecture.md; the
test ``tests/unit/test_train_no_sync.py``).

A record holds ``step``, ``loss``, ``lr``, ``img_per_s`` (images since the last record over the wall
time since it, evaluations and checkpoints excluded), ``grad_norm``, the task's metrics (``train_*``)
and its log-step metrics (``Task.log_metrics``, e.g. ``train_rankme``), ``tflops`` and ``mfu`` (from
the model's forward FLOPs per image and the device's peak; with variable resolution each step counted
at its own size), the share of the step time the task's parts took
(``<part>_time_pct``, e.g. a distillation teacher's forward: ``Task.step_times``), ``epoch``, for a
variable-resolution run the logged step's ``img_size`` or ``seq_len``, ``data_wait`` (the percentage
of the wall time since the last record that the loop spent waiting for batches: near 0 when the
input pipeline keeps up), on a GPU ``mem_peak_gib`` (the most memory the allocator held since the
last record, :mod:`vitscale.tools.device_memory`: allocated, or reserved under CUDA graphs, whose pools
replays use without allocating; a host-side counter, no synchronisation) and, when steps were not applied,
``nonfinite_steps``.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
import torch.distributed as dist

from vitscale.distributed.compile import uses_cudagraphs
from vitscale.tools.device_memory import read_peak
from vitscale.tools.mfu import achieved_tflops, mfu_percent, peak_tflops
from vitscale.tools.units import count


def reduce_mean(t: torch.Tensor, world: int) -> torch.Tensor:
    """The mean of ``t`` over the ranks (a copy; ``t`` itself on one rank)."""
    if world > 1 and dist.is_initialized():
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= world
    return t


def model_flops(family, model, img_size) -> float | None:
    """Forward FLOPs of one image as a training step runs it (the family's count: patch dropout's
    dropped patches cost nothing); None when it cannot say. ``img_size``: (H, W), or ``("tokens", N)``
    for a NaFlex batch of N tokens a sequence, which costs what a 1 x N patch grid costs."""
    try:
        if img_size[0] == "tokens":
            p = model.cfg.patch_dim
            img_size = (p, img_size[1] * p)
        return float(family.forward_flops(model.cfg, img_size, training=True))
    except Exception:  # FLOPs are informative only
        return None


def batch_shape(batch: dict) -> tuple[int, tuple] | None:
    """(images in this rank's micro-batch, the size its FLOPs are counted at: (H, W), or ("tokens", N)
    for a NaFlex batch) of a batch with an ``image``; None for one without."""
    img = batch.get("image")
    if isinstance(img, dict):  # NaFlex: patches (B, N, P*P*C)
        B, N = img["patches"].shape[:2]
        return int(B), ("tokens", int(N))
    if isinstance(img, torch.Tensor) and img.ndim == 4:  # (B, C, H, W)
        return int(img.shape[0]), (int(img.shape[-2]), int(img.shape[-1]))
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


def opening_lines(run, schedule, checkpoints) -> list[str]:
    """What a run says before its first step: accepted config changes, fp8, where it resumed
    (``checkpoints``: the trainer's :class:`~vitscale.train.checkpointing.Checkpointing`), the model,
    steps, device, batch layout and learning rate (``schedule``: its peak and warmup)."""
    cfg, tc, claim = run.cfg, run.cfg.train, run.claim
    total_steps, step, resumed_from = checkpoints.counters.total_steps, checkpoints.counters.step, checkpoints.resumed_from
    peak_lr, warmup = schedule.peak, schedule.warmup
    lines = []
    if claim is not None and claim.accepted:
        changed = ", ".join(f"{k}: {a} -> {b}" for k, a, b in claim.accepted)
        lines.append(f"resuming {tc.output_dir} with changes (checkpoint.allow_changes): {changed}")
    if run.float8.recipe != "none":
        lines.append(run.float8.summary())
    if resumed_from:
        lines.append(f"resumed from {resumed_from} at step {step}")
    n_params = sum(p.numel() for p in run.model.parameters())
    trainable = sum(p.numel() for p in run.model.parameters() if p.requires_grad)
    lines.append(f"training {cfg.model.name} ({count(trainable)} / {count(n_params)} params trainable) for {total_steps} "
                 f"steps on {run.device}")  # fmt: skip
    lines.append(f"batch {tc.batch_size} ({run.micro_batch}/rank x {tc.grad_accum} accum x {run.dims.world_size} ranks), "
                 f"peak lr {peak_lr:.3e}, warmup {warmup} steps")  # fmt: skip
    sizes = run.loaders.sizes if run.loaders is not None else None
    if sizes is not None:
        from vitscale.data.sizes import eval_size

        unit = "tokens" if sizes.mode == "naflex" else "px"
        lines.append(f"variable resolution: {sizes.describe()}; evaluation at {eval_size(cfg.data)} {unit}")
        if tc.compile:
            lines.append(f"train.compile: each of the {len(sizes.sizes)} sizes compiles once (static shapes, kept in "
                         f"dynamo's cache): at most {len(sizes.sizes)} compiles per block, none per step")  # fmt: skip
    return lines


class StepCost:
    """What a step costs, for ``tflops`` and ``mfu``: ``flops`` (forward FLOPs of one image at the run's
    size, None when ``log.flops`` is off or the family cannot say), ``flops_at`` (size -> FLOPs per
    image, for variable resolution), ``peak`` (the device's peak TFLOP/s) and the ``device``."""

    def __init__(self, flops: float | None, flops_at, peak: float | None, device: torch.device | None):
        self.flops, self.flops_at, self.peak, self.device = flops, flops_at, peak, device

    @classmethod
    def build(cls, lc, *, model, family, img_size, device: torch.device, autocast) -> StepCost:
        """The cost of a step of ``model`` (of ``family``, at ``img_size``) on ``device`` with the
        ``autocast`` dtype, counted when the ``log`` group ``lc`` asks (``log.flops``)."""
        flops = model_flops(family, model, img_size) if lc.flops else None
        return cls(flops, functools.partial(model_flops, family, model), device_peak(device, autocast) if flops else None,
                   device)  # fmt: skip


class LogStep:
    """``due(step, last, evaluating)``: whether ``step`` logs (every ``train.log_every`` steps, the
    first and last, and with every evaluation); :meth:`record` builds its record. ``info``: where its
    notes go; ``warn``: where its warnings go (the task's, steps not applied; default ``info``), kept
    for the summary by :class:`vitscale.train.reporting.Reporting`, which builds it."""

    def __init__(self, tc, *, world: int, steps_per_epoch: int, schedule, guard, flops_per_image: float | None,
                 peak: float | None, info, warn=None, part_times=None, device: torch.device | None = None,
                 dp_size: int = 1, flops_at=None, varying: bool = False, task_metrics=None):  # fmt: skip
        self.tc, self.world, self.steps_per_epoch = tc, world, steps_per_epoch
        self.part_times = part_times  # the task's parts' seconds since the last record (Task.step_times)
        self.task_metrics = task_metrics  # the task's log-step metrics and warnings (Task.log_metrics)
        self.schedule, self.guard, self.info, self.warn = schedule, guard, info, warn or info
        self.flops, self.peak = flops_per_image, (peak if flops_per_image else None)
        # variable resolution: a step's images and FLOPs at its own size (flops_at: size -> FLOPs per image)
        self.dp_size, self.flops_at, self._flops_of = dp_size, flops_at, {}
        self.varying, self.last_size = varying, None  # varying: each record names its step's size
        self.reported_nonfinite = guard.checked_total
        self.cuda = device if device is not None and device.type == "cuda" else None
        self.cudagraphs = bool(tc.compile) and uses_cudagraphs(tc.compile_mode)  # mem_peak_gib counts their pools
        self.restart()

    def restart(self) -> None:
        """Start counting images and time afresh (after a record, an evaluation or a checkpoint)."""
        self.images, self.flop_sum, self.t_last, self.waited = 0, 0.0, time.perf_counter(), 0.0
        if self.part_times is not None:
            self.part_times()  # the task's timers start afresh too

    def timed(self, batches):
        """``batches``, counting the time spent waiting for each (the record's ``data_wait``)."""
        while True:
            t = time.perf_counter()
            batch = next(batches)
            self.waited += time.perf_counter() - t
            yield batch

    def advance(self, shape: tuple[int, tuple] | None = None) -> None:
        """Count a step: ``train.batch_size`` images at the run's size, or with ``shape`` (this rank's
        micro-batch images and their size, :func:`batch_shape`) the step's own batch and size."""
        if shape is None:
            images, flops = self.tc.batch_size, self.flops
        else:
            images = shape[0] * self.dp_size * self.tc.grad_accum
            self.last_size = shape[1]
            if self.flops and shape[1] not in self._flops_of and self.flops_at is not None:
                self._flops_of[shape[1]] = self.flops_at(shape[1])
            flops = self._flops_of.get(shape[1], self.flops)
        self.images += images
        self.flop_sum += images * (flops or 0.0)

    def due(self, step: int, last: bool, evaluating: bool) -> bool:
        return step % self.tc.log_every == 0 or last or evaluating or step == 1

    def record(self, step: int, loss: torch.Tensor, metrics: dict[str, torch.Tensor], grad_norm: torch.Tensor,
               last_checkpoint: str | None) -> dict[str, Any]:  # fmt: skip
        """The record of ``step`` (the sync point); stops a diverged run (:class:`NonFiniteError`)."""
        elapsed = max(time.perf_counter() - self.t_last, 1e-9)
        ips = self.images / elapsed
        rec: dict[str, Any] = {"step": step, "loss": reduce_mean(loss, self.world).item(),
                               "lr": self.schedule.peak * self.schedule.factor(step), "img_per_s": ips,
                               "grad_norm": float(grad_norm.item())}  # fmt: skip
        for k, v in metrics.items():
            rec[k] = reduce_mean(v, self.world).item()
        if self.task_metrics is not None:  # e.g. the embeddings' effective rank (an SVD: log steps only)
            values, lines = self.task_metrics(step)
            rec.update(values)
            for line in lines:
                self.warn(line)
        if self.flops and self.images:
            rec["tflops"] = achieved_tflops(ips, self.flop_sum / self.images, "train")  # each step at its own size
            if self.peak:
                rec["mfu"] = mfu_percent(rec["tflops"], self.peak)
        for part, seconds in (self.part_times() if self.part_times is not None else {}).items():
            rec[f"{part}_time_pct"] = 100.0 * seconds / elapsed  # e.g. the distillation teacher's share of the step time
        if self.varying and self.last_size is not None:  # the logged step's size: seq_len (NaFlex) or img_size
            kind, n = ("seq_len", self.last_size[1]) if self.last_size[0] == "tokens" else ("img_size", self.last_size[0])
            rec[kind] = n
        rec["epoch"] = step / self.steps_per_epoch
        rec["data_wait"] = 100.0 * min(self.waited / elapsed, 1.0)
        if self.cuda is not None:
            rec["mem_peak_gib"] = read_peak(self.cuda, self.cudagraphs) / 2**30
        nonfinite = self.guard.check(step, last_checkpoint)  # stops a diverged run
        if nonfinite:
            rec["nonfinite_steps"] = nonfinite
            if nonfinite > self.reported_nonfinite:
                self.warn(f"step {step}: {nonfinite - self.reported_nonfinite} step(s) with a non-finite loss or "
                          f"gradient norm not applied since the last log ({nonfinite} in the run)")  # fmt: skip
            self.reported_nonfinite = nonfinite
        return rec


__all__ = ["LogStep", "StepCost", "batch_shape", "device_peak", "model_flops", "opening_lines", "reduce_mean"]
