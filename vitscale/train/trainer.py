"""The trainer: one loop for every model family, task and parallel layout.

:func:`vitscale.run.assemble` builds the run (device, layout, data, the model on the meta device ->
its family's plan through the parallelize tail -> ``to_empty`` -> ``init_weights()`` under the run's
seed); the trainer declares its components — optimizer, schedule, EMA, task, the checkpoint
component (:mod:`.checkpointing`: the run's state as DCP ``Stateful`` parts, resume, schedule), the
evaluations (:mod:`.evaluation`) and the log step (:mod:`.logstep`) — and holds the loop. It never
branches on a model's name: the task (``train.task`` or the family's default) computes the loss.

Steps count from 1 (step N = the N-th optimizer update). The host syncs with the device only at log,
eval and checkpoint steps (and, for a non-fused optimizer, to skip a non-finite step:
:mod:`vitscale.train.nonfinite`). A resume restores model, optimizer, EMA, step, data position and
RNG, so the loss curve continues exactly; a finished run started again trains nothing and says so.
The run folder is locked while the trainer runs (:mod:`vitscale.run.folder`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from vitscale.config import Config
from vitscale.distributed.compile import StaticShapes, check_graph_inputs, mark_step, uses_cudagraphs
from vitscale.distributed.float8 import precompute_float8_scales
from vitscale.run import assemble
from vitscale.run.folder import write_config
from vitscale.tasks import get_task
from vitscale.tools.env import command_line
from vitscale.tools.report import try_write_report

from .checkpointing import Checkpointing, RunCounters
from .ema import EMA
from .evaluation import EvalSchedule
from .fastpath import autocast_factory, sdpa_backend
from .finetune import freeze, group_lines
from .finish import finish_run
from .logstep import LogStep, batch_shape, device_peak, model_flops, opening_lines
from .metrics import MetricsLogger
from .nonfinite import NonFiniteGuard, apply_update, clip_gradients, prepare_optimizer, skips_on_device
from .optim import build_optimizer, scaled_lr
from .preemption import Preemption
from .runlog import RunLog
from .schedules import Schedule, fit_warmup, run_length, warmup_steps
from .summary import finished_run, now, print_end
from .watchdog import Watchdog


def _step_seed(seed: int, step: int, rank: int) -> int:
    x = (seed * 1_000_003 + step) * 1_000_033 + rank
    return (x ^ (x >> 31)) * 0x9E3779B97F4A7C15 & (2**63 - 1)


class Trainer:
    def __init__(self, cfg: Config, preemption: Preemption | None = None, watchdog: Watchdog | None = None):
        self._t_created, self.started_at = time.perf_counter(), now()
        self._watchdog = watchdog  # armed by train() before start-up, else made in _build
        self.preemption = preemption or Preemption(cfg.checkpoint.save_on_signal)  # save on a signal, all ranks agreeing
        self.run = run = assemble(cfg)  # checks, the run folder's lock, data, model
        try:
            self._build(run)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the run folder (also done by :meth:`fit` when it ends, however it ends)."""
        if self.run.claim is not None:
            self.run.claim.release()

    def _build(self, run) -> None:
        self.cfg = cfg = run.cfg  # resolved (train.compile filled in)
        tc = cfg.train
        self.device, self.pd, self.world, self.is_main = run.device, run.dims, run.dims.world_size, run.dims.is_main
        self.out, self.loaders, self.model = Path(tc.output_dir), run.loaders, run.model
        self.model.train()
        # train.compile_mode=reduce-overhead / max-autotune: the blocks replay CUDA graphs (its guards:
        # vitscale.distributed.compile; the run's setting was checked by vitscale.run.checks)
        self.cudagraphs, self.static_shapes = bool(tc.compile) and uses_cudagraphs(tc.compile_mode), StaticShapes()
        if self.cudagraphs:
            check_graph_inputs(self.model, self.device)
        torch.manual_seed(tc.seed + 1 + self.pd.dp_rank)  # dropout / drop-path streams
        self.peak_lr = scaled_lr(cfg.optim, tc.batch_size)
        self.autocast = autocast_factory(self.device, run.precision.autocast)
        self.task = get_task(run.task)(cfg, self.model, run.num_classes, run.dims.dp_group(), run.class_names)
        self.task.autocast, self.task.device = self.autocast, self.device
        # the task's components (a distillation teacher) and locks, then model.freeze: before the optimizer
        self.notices = self.task.setup(run) + freeze(self.model, cfg.model.freeze)
        self.optimizer = build_optimizer(self.model, cfg.optim, self.peak_lr)
        self.notices += group_lines(self.model, self.optimizer, cfg.optim.layer_decay, self.peak_lr)
        self.steps_per_epoch, total = run_length(tc, len(self.loaders.train))
        warmup, notice = fit_warmup(warmup_steps(cfg.schedule, self.steps_per_epoch), total)
        self.notices += [notice] if notice else []
        if self.loaders.val is None and not cfg.evals:
            from vitscale.data.formats import validation_hint

            self.notices.append(f"no validation data: this run reports training metrics only "
                                f"({validation_hint(cfg.data.format)})")  # fmt: skip
        self.schedule = Schedule(self.optimizer, cfg.schedule, total, warmup, self.peak_lr)
        # FSDP modules cannot be deep-copied: a second model sharded the same way
        self.ema = EMA(self.model, tc.ema_decay, module=run.new_model() if self.world > 1 else None) if tc.ema_decay > 0 else None
        self.counters = RunCounters(self.loaders.train, total)
        self.checkpoints = Checkpointing(self.out / "checkpoints", cfg.checkpoint, self.model, self.optimizer, self.ema, self.counters)
        prepare_optimizer(self.optimizer)
        self.skip_on_device = skips_on_device(self.optimizer)
        self.complete = self.checkpoints.restore(self.model, self.ema)
        self.notices += self.checkpoints.init_lines  # what checkpoint.init_from loaded, resampled, re-initialised
        self.init_report = self.checkpoints.init_report
        # no step within train.hang_timeout: stacks, exit 124
        self.watchdog = self._watchdog or Watchdog(tc.hang_timeout, self.out, run.dims.rank)
        self.guard = NonFiniteGuard(self.device, tc.max_nonfinite_steps, tc.max_consecutive_nonfinite, self.counters.nonfinite_steps)
        self.tensorboard = False  # whether fit() writes TensorBoard events
        self.written: dict[str, bool] = {}  # outputs this run wrote at its end ("weights", "report"): the summary lists only those
        if not self.complete:  # a finished run's config.yaml still describes its weights
            self.evals = EvalSchedule(run, self.task, self.autocast)  # loaders and label files read now
            self.flops_per_image = model_flops(run.family, self.model, run.img_size) if cfg.log.flops else None
            self.peak_tflops = device_peak(self.device, run.precision.autocast) if self.flops_per_image else None
            if self.is_main:  # the config of the checkpoints so far kept beside the new one on an accepted change
                accepted = self.checkpoints.resumed_from and run.claim is not None and run.claim.accepted
                write_config(cfg, self.out, before_step=self.step if accepted else None)

    @property
    def step(self) -> int:
        return self.counters.step

    @step.setter
    def step(self, value: int) -> None:
        self.counters.step = value

    # ------------------------------------------------------------------------------------- loop
    def _batches(self):
        while True:  # the loader moves on to the next epoch by itself at the end of one
            yield from self.loaders.train

    def _to_device(self, batch: dict) -> dict:
        """The batch on the device, plus ``"host"``: the loader's own CPU tensors. A task that reads
        host-side data by a batch value (token-label rows by sample index) takes it from there: a
        device copy read back (``.cpu()``, ``.item()``) would make the host wait for the GPU."""
        if "host" in batch:  # the loader moved it already (vitscale.data.loader: normalised on the device)
            return batch
        out = {k: (v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
        out["host"] = batch
        return out

    def train_step(self, batches) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """One optimizer update (``grad_accum`` micro-batches). Returns device tensors, no sync."""
        tc, model, n = self.cfg.train, self.model, self.cfg.train.grad_accum
        loss_sum = torch.zeros((), device=self.device)
        metric_sums: dict[str, torch.Tensor] = {}
        if self.cudagraphs:
            mark_step()  # the CUDA graphs' outputs of the last step may be overwritten from here on
        for micro in range(n):
            if self.world > 1 and n > 1:  # every model is an FSDP2 module on several ranks
                model.set_requires_gradient_sync(micro == n - 1)  # reduce gradients on the last micro-step only
            batch = self._to_device(next(batches))
            self.step_shape = batch_shape(batch)  # img/s and MFU count each step at its own size
            if self.cudagraphs:
                self.static_shapes.check(batch)
            self.counters.skipped += int(batch.get("skipped", 0))
            # Dropout / drop-path draw from a stream keyed by (seed, micro-step, data-parallel rank): a
            # resume continues exactly whatever else touched the global RNG (e.g. DataLoader iterators).
            torch.manual_seed(_step_seed(tc.seed, (self.step - 1) * n + micro, self.pd.dp_rank))
            loss, metrics = self.task.loss(model, batch, (self.step - 1) * n + micro)
            (loss / n).backward()
            loss_sum += loss.detach()
            for k, v in metrics.items():
                metric_sums[k] = metric_sums.get(k, 0) + v.detach()
        params = [p for p in model.parameters() if p.grad is not None]
        max_norm = tc.grad_clip if tc.grad_clip > 0 else float("inf")
        # fused kernels clip as they read the gradients (grad_scale); else in place, as PyTorch does
        grad_norm, unscale = clip_gradients(params, max_norm, world=self.world, fold=self.skip_on_device)
        loss = loss_sum / n
        ok = self.guard.flag(loss, grad_norm, self.world)  # a non-finite step on any rank is not applied
        self.schedule.apply(self.step)
        apply_update(self.optimizer, ok, on_device=self.skip_on_device, ema=self.ema, model=model, grad_scale=unscale,
                     on_skip=lambda: self.guard.check(self.step, self.checkpoints.last))  # stop once the budget is spent
        precompute_float8_scales(model, self.run.float8)  # tensorwise fp8 + FSDP2: all scales in one all-reduce
        self.optimizer.zero_grad(set_to_none=True)
        return loss, {k: v / n for k, v in metric_sums.items()}, grad_norm

    def fit(self) -> dict[str, Any]:
        try:
            if self.complete:
                key = "train.max_steps" if self.cfg.train.max_steps > 0 else "train.epochs"
                return finished_run(self.out, self.step, self.counters.total_steps, self.checkpoints.resumed_from, key, self.is_main)
            log = MetricsLogger(self.out, enabled=self.is_main, total_steps=self.counters.total_steps, start_step=self.step, config=self.cfg,
                                progress=self.cfg.log.progress, tensorboard=self.cfg.log.tensorboard, eval_names=tuple(self.evals.names))  # fmt: skip
            try:
                self.tensorboard = log.tb is not None
                for line in opening_lines(self.run, self.counters.total_steps, self.peak_lr, self.schedule.warmup, self.step,
                                          self.checkpoints.resumed_from) + self.notices:  # fmt: skip
                    log.info(line)
                with sdpa_backend(self.cfg.train.sdpa), self.preemption, self.watchdog, self.checkpoints:  # kernels as `vitscale bench`
                    return self._fit(log)
            finally:  # also when a step fails: the bar ends its line, TensorBoard flushes what it has
                log.close()
        finally:
            self.close()

    def _fit(self, log: MetricsLogger) -> dict[str, Any]:
        cfg, start_step, t_start, last_eval = self.cfg, self.counters.segments.start(self.step), time.perf_counter(), {}
        logstep = LogStep(cfg.train, world=self.world, steps_per_epoch=self.steps_per_epoch, schedule=self.schedule, guard=self.guard,
                          flops_per_image=self.flops_per_image, peak=self.peak_tflops, info=log.info,
                          part_times=self.task.step_times, task_metrics=self.task.log_metrics, device=self.device, dp_size=self.pd.dp_size,
                          flops_at=lambda size: model_flops(self.run.family, self.model, size),
                          varying=self.loaders.sizes is not None)  # fmt: skip
        batches = logstep.timed(self._batches())  # the data-wait share of the log line
        while self.step < self.counters.total_steps:
            self.step += 1
            loss, metrics, grad_norm = self.train_step(batches)
            logstep.advance(self.step_shape)
            log.advance()
            last = self.step == self.counters.total_steps
            due = self.evals.due(self.step, last)
            if logstep.due(self.step, last, bool(due)):
                rec = logstep.record(self.step, loss, metrics, grad_norm, self.checkpoints.last)  # the sync point
                results = self.evals.run(self.model, self.ema, due) if due else {}
                last_eval.update(results)
                log.log({**rec, **results})
                if due and not last and self.is_main and cfg.log.report:  # keep report.html current
                    try_write_report(self.out)
                logstep.restart()  # evaluation time is not counted in img/s
            stop = self.preemption.agreed(self.counters.segments)  # a signal on any rank: save and stop after this step
            if self.checkpoints.due(self.step, last) or stop:
                self.checkpoints.save(self.step, self.guard)
                logstep.restart()
            self.preemption.stop(stop, last, self.step, self.checkpoints, self.pd.rank)  # waits for the write, then exits
            self.watchdog.beat(self.step)
        return finish_run(self, log, start_step, time.perf_counter() - t_start, last_eval)  # summary, weights, report

    def print_summary(self, summary: dict[str, Any], fmt: str = "human") -> None:
        """Print the end of the run on rank 0: ``human`` (what the run gave and where its outputs are),
        ``json`` (summary.json's contents) or ``none``."""
        if self.is_main:
            names = () if self.complete else tuple(self.evals.names)
            # what this run wrote at its end; a finished run started again: what its folder holds
            print_end(summary, fmt, self.out, report=self.written.get("report", self.cfg.log.report), tensorboard=self.tensorboard,
                      names=names, weights=self.written.get("weights"))  # fmt: skip


def train(cfg: Config, *, summary: str = "human", notes: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Train per ``cfg``; returns the summary (also written to ``<output_dir>/summary.json``).

    Rank 0 keeps what it prints in ``<output_dir>/train.log`` (``vitscale.train.runlog``) and ends
    with the summary in the form ``summary`` names: ``human``, ``json`` or ``none``. ``notes``: lines
    from loading the config, printed with the run's opening lines."""
    main = int(os.environ.get("RANK", "0")) == 0  # the rank torchrun gave this process (0 without torchrun)
    rank = int(os.environ.get("RANK", "0"))
    with RunLog(Path(cfg.train.output_dir) / "train.log", enabled=main, header=command_line()) as runlog, \
            Preemption(cfg.checkpoint.save_on_signal) as preemption, \
            Watchdog(cfg.train.hang_timeout, Path(cfg.train.output_dir), rank) as watchdog:  # start-up included
        trainer = Trainer(cfg, preemption, watchdog)  # checks the settings and claims the run folder (or refuses: no file written)
        trainer.notices[:0] = list(notes)
        runlog.attach()
        result = trainer.fit()
        trainer.print_summary(result, summary)
    return result
