"""The trainer: one loop for every model family, task and parallel layout.

One call into the run layer, :func:`vitscale.run.assemble`, gives the finished run (the model
resolved, the checks, the run folder claimed, device, layout, data, the model on the meta device ->
its family's plan through the parallelize tail -> ``to_empty`` -> ``init_weights()`` under the run's
seed); the trainer builds its components from that run, each owning its config group
(``X.build(cfg.<group>, <named objects>)``, as torchtitan's ``config.X.build(...)``) — the checkpoint component (:mod:`.checkpointing`: ``checkpoint.init_from``
into the family's model, the run's state as DCP ``Stateful`` parts, resume, schedule), the task and
the training module it builds (:mod:`vitscale.tasks.module`: the backbone and the task's parts),
optimizer, schedule, EMA, the non-finite guard, the evaluations (:mod:`.evaluation`) and what the run
reports (:mod:`.reporting`: log steps, metrics, trackers, warnings, summary, report, the run's end,
built from the ``log`` group and named objects) — and holds the loop, which calls each with the step.
What stops or saves it (:mod:`.stopping`: signals, the watchdog, segments) is built from the
``checkpoint`` and ``train`` groups: it is entered
before the run is assembled. No component reads the trainer's state: each is handed what it uses. It never
branches on a model's name: the task (``train.task`` or the family's default) computes the loss.

Steps count from 1 (step N = the N-th optimizer update). The host syncs with the device only at log,
eval and checkpoint steps (and, for a non-fused optimizer, to skip a non-finite step:
:mod:`vitscale.train.nonfinite`). A resume restores model, optimizer, EMA, step, data position and
RNG, so the loss curve continues exactly; a finished run started again trains nothing and says so.
The run folder is locked while the trainer runs (:mod:`vitscale.run.folder`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from vitscale.config import Config
from vitscale.data.formats import validation_hint
from vitscale.distributed.compile import StaticShapes, check_graph_inputs, mark_step, uses_cudagraphs
from vitscale.distributed.float8 import precompute_float8_scales
from vitscale.run import assemble
from vitscale.tasks import get_task
from vitscale.tools.env import command_line

from .checkpointing import Checkpointing, RunCounters
from .ema import EMA
from .evaluation import EvalSchedule, eval_context
from .fastpath import autocast_factory, sdpa_backend
from .finetune import freeze, group_lines
from .logstep import StepCost, batch_shape, opening_lines
from .nonfinite import NonFiniteGuard, apply_update, clip_gradients, prepare_optimizer, skips_on_device
from .optim import build_optimizer, scaled_lr
from .reporting import Reporting, RunClock, print_run_end
from .runlog import RunLog
from .schedules import Schedule
from .stopping import Stopping


def _step_seed(seed: int, step: int, rank: int) -> int:
    x = (seed * 1_000_003 + step) * 1_000_033 + rank
    return (x ^ (x >> 31)) * 0x9E3779B97F4A7C15 & (2**63 - 1)


class Trainer:
    """The training loop of an assembled run. Its components are built from the run, in the order
    they depend on each other — the task, the optimizer and its schedule, the EMA, the run's state
    (resumed, or initialised from ``checkpoint.init_from``), the non-finite guard, the evaluations —
    and each is called with the step; :meth:`fit` runs the loop, :meth:`train_step` one update."""

    def __init__(self, cfg: Config, stopping: Stopping | None = None, runtime: Any = None):
        self.clock = RunClock()  # the run's clock starts: building, the loop, evaluations and export
        # signals (all ranks agreeing, within checkpoint.signal_deadline), the watchdog, segments
        self.stopping = stopping or Stopping.build(cfg.checkpoint, train=cfg.train, rank=int(os.environ.get("RANK", "0")))
        self.report: Reporting | None = None  # built when the loop starts (it opens metrics.jsonl)
        self.run = run = assemble(cfg)  # checks, the run folder's lock, data, model
        try:
            self._build(run, runtime)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the run folder (also done by :meth:`fit` when it ends, however it ends)."""
        if self.run.claim is not None:
            self.run.claim.release()

    def _build(self, run, runtime: Any = None) -> None:
        self.cfg = cfg = run.cfg  # resolved (train.compile filled in)
        tc = cfg.train
        self.device, self.loaders, self.model, self.out = run.device, run.loaders, run.model, Path(tc.output_dir)
        self.model.train()
        # train.compile_mode=reduce-overhead / max-autotune: the blocks replay CUDA graphs, whose inputs
        # keep their shapes (vitscale.distributed.compile; the setting was checked by vitscale.run.checks)
        self.static_shapes = StaticShapes() if tc.compile and uses_cudagraphs(tc.compile_mode) else None
        if self.static_shapes is not None:
            check_graph_inputs(self.model, self.device)
        torch.manual_seed(tc.seed + 1 + run.dims.dp_rank)  # dropout / drop-path streams

        # checkpoint.init_from into the family's model (unless the run resumes), then the task builds its
        # training module from it (its parts: a teacher, heads, a decoder; a distillation teacher; locks),
        # then model.freeze, before the optimizer
        self.counters = RunCounters(self.loaders.train, run.total_steps)
        self.checkpoints = Checkpointing.build(cfg.checkpoint, output_dir=tc.output_dir, counters=self.counters)
        self.notices = list(self.checkpoints.initialise(self.model))  # what checkpoint.init_from loaded, resampled, re-initialised
        self.autocast = autocast_factory(self.device, run.precision.autocast)
        self.task = get_task(run.task)(cfg, self.model, run.num_classes, run.dims.dp_group(), run.class_names)
        self.task.autocast, self.task.device, self.task.runtime = self.autocast, self.device, runtime
        self.module = self.task.build(run)
        self.notices += self.checkpoints.initialise_parts(self.module)  # checkpoint.init_parts: a stage keeps the previous one's
        self.notices += self.module.notices + freeze(self.model, cfg.model.freeze)

        # the optimizer and its learning-rate schedule (with what the module schedules itself)
        peak_lr = scaled_lr(cfg.optim, tc.batch_size)
        self.optimizer = build_optimizer(self.module, cfg.optim, peak_lr)
        self.notices += group_lines(self.model, self.optimizer, cfg.optim.layer_decay, peak_lr)
        self.schedule = Schedule.build(cfg.schedule, optimizer=self.optimizer, peak_lr=peak_lr, hyper=self.module.hyper,
                                       steps_per_epoch=run.steps_per_epoch, total_steps=run.total_steps)
        self.notices += [self.schedule.notice] if self.schedule.notice else []
        if self.loaders.val is None and not cfg.evals:
            self.notices.append(f"no validation data: this run reports training metrics only "
                                f"({validation_hint(cfg.data.format)})")  # fmt: skip
        self.ema = EMA.build(tc.ema_decay, model=self.model, new_model=run.new_model if run.dims.world_size > 1 else None)  # of the family's model

        # the run's state: resumed from the newest checkpoint
        self.checkpoints.track(self.module, self.optimizer, self.ema)
        prepare_optimizer(self.optimizer)
        self.skip_on_device = skips_on_device(self.optimizer)
        self._clip_ids: tuple[tuple[int, ...], torch.Tensor | None] | None = None  # train.grad_clip_scope's groups
        self.complete = self.checkpoints.restore()  # a finished run: nothing to train

        # a non-finite step is not applied (and a diverged run stops)
        self.guard = NonFiniteGuard.build(tc, device=self.device, counters=self.counters)
        if not self.complete:  # a finished run's config.yaml still describes its weights
            self.evals = EvalSchedule.build(cfg.evals, task=self.task, cfg=cfg, context=eval_context(run, self.task, self.autocast))  # loaders and label files read now
            if run.dims.is_main:  # the config of the checkpoints so far kept beside the new one on an accepted change
                run.claim.write_config(cfg, self.step if self.checkpoints.resumed_from else None)

    @property
    def step(self) -> int:
        return self.counters.step

    @step.setter
    def step(self, value: int) -> None:
        self.counters.step = value

    # ------------------------------------------------------------------------------------- loop
    def fit(self) -> dict[str, Any]:
        try:
            if self.complete:
                return Reporting.finished(self.cfg, self.checkpoints, self.run.dims.is_main)
            self.report = self._reporting()
            try:
                self.report.open(opening_lines(self.run, self.schedule, self.checkpoints) + self.notices)
                with sdpa_backend(self.cfg.train.sdpa), self.stopping, self.checkpoints:  # kernels as `vitscale bench`
                    return self._fit(self.report)
            finally:  # also when a step fails: the bar ends its line, TensorBoard flushes what it has
                self.report.close()
        finally:
            self.close()

    def _reporting(self) -> Reporting:
        """What the run reports, from its ``log`` group and the objects it reports on."""
        run, cfg = self.run, self.cfg
        from .summary import run_layout

        cost = StepCost.build(cfg.log, model=run.model, family=run.family, img_size=run.img_size, device=run.device,
                              autocast=run.precision.autocast)  # fmt: skip
        return Reporting.build(cfg.log, config=cfg, clock=self.clock, dims=run.dims, counters=self.counters,
                               schedule=self.schedule, guard=self.guard, task=self.task, cost=cost,
                               steps_per_epoch=run.steps_per_epoch, varying=run.loaders.sizes is not None,
                               eval_names=self.evals.names, layout=run_layout(run), model_overrides=run.model_overrides)  # fmt: skip

    def _fit(self, report: Reporting) -> dict[str, Any]:
        stopping, total = self.stopping, self.counters.total_steps
        batches = report.timed(self._batches())  # the data-wait share of the log line
        stopping.begin(self.step, segments=self.counters.segments, checkpoints=self.checkpoints)  # a segment of the run
        while self.step < total:
            self.step += 1
            loss, metrics, grad_norm = self.train_step(batches)
            report.step(self.step_shape)
            last = self.step == total
            due = self.evals.due(self.step, last)
            if report.due(self.step, last, bool(due)):
                rec = report.record(self.step, loss, metrics, grad_norm, self.checkpoints.last)  # the sync point
                results = self.evals.run(self.model, self.ema, due, self.module.evaluated()) if due else {}
                report.log(rec, results)  # evaluation time not in img/s
            stop = stopping.agreed()  # a signal on any rank: save and stop after this step
            if self.checkpoints.due(self.step, last) or stop:
                self.checkpoints.save(self.step, self.guard)
                report.restart()
            stopping.after_step(stop, last, self.step, self.checkpoints)  # a signal: the write waited for, then the exit
        return report.finish(self.checkpoints, self.guard, self.run.loaders)  # weights, summary, report

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
        n = self.cfg.train.grad_accum
        loss_sum = torch.zeros((), device=self.device)
        metric_sums: dict[str, torch.Tensor] = {}
        if self.static_shapes is not None:
            mark_step()  # the CUDA graphs' outputs of the last step may be overwritten from here on
        for micro in range(n):
            if self.run.dims.world_size > 1 and n > 1:  # every model is an FSDP2 module on several ranks
                self.module.set_requires_gradient_sync(micro == n - 1)  # reduce gradients on the last micro-step only
            loss, metrics = self.forward_backward(self._to_device(next(batches)), (self.step - 1) * n + micro)
            loss_sum += loss
            for k, v in metrics.items():
                metric_sums[k] = metric_sums.get(k, 0) + v
        loss = loss_sum / n
        grad_norm = self.optimizer_step(loss)
        return loss, {k: v / n for k, v in metric_sums.items()}, grad_norm

    def forward_backward(self, batch: dict, micro_step: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The task's loss of one micro-batch (``micro_step``: its number in the run), its gradients
        accumulated (scaled by ``1 / grad_accum``); returns the loss and the metrics, detached."""
        self.step_shape = batch_shape(batch)  # img/s and MFU count each step at its own size
        if self.static_shapes is not None:
            self.static_shapes.check(batch)
        self.counters.skipped += int(batch.get("skipped", 0))
        # Dropout / drop-path draw from a stream keyed by (seed, micro-step, data-parallel rank): a
        # resume continues exactly whatever else touched the global RNG (e.g. DataLoader iterators).
        torch.manual_seed(_step_seed(self.cfg.train.seed, micro_step, self.run.dims.dp_rank))
        loss, metrics = self.task.loss(self.model, batch, micro_step)
        (loss / self.cfg.train.grad_accum).backward()
        return loss.detach(), {k: v.detach() for k, v in metrics.items()}

    def optimizer_step(self, loss: torch.Tensor) -> torch.Tensor:
        """Clip the gradients (``train.grad_clip``), apply the update at this step's learning rate unless
        the loss or the gradient norm is non-finite on any rank (:mod:`vitscale.train.nonfinite`), and
        clear the gradients; returns the gradient norm (a device tensor)."""
        world, tc = self.run.dims.world_size, self.cfg.train
        params = [p for p in self.module.parameters() if p.grad is not None]
        max_norm = tc.grad_clip if tc.grad_clip > 0 else float("inf")
        # fused kernels clip as they read the gradients (grad_scale); else in place, as PyTorch does
        grad_norm, unscale = clip_gradients(params, max_norm, world=world, fold=self.skip_on_device,
                                            groups=self._clip_groups(params))  # fmt: skip
        ok = self.guard.flag(loss, grad_norm, world)  # a non-finite step on any rank is not applied
        self.schedule.apply(self.step)  # the LR, with the module's own schedules (DINOv2's weight decay)
        applied = apply_update(self.optimizer, ok, on_device=self.skip_on_device, grad_scale=unscale)
        if applied is False:  # the host did not apply it: stop once the budget is spent
            self.guard.check(self.step, self.checkpoints.last)
        elif self.ema is not None:  # the EMA follows the update (by the device flag: not at all on a skipped step)
            self.ema.update(self.model, None if applied is True else applied)
        # what follows the update in the training module (DINO's EMA teacher), by the same flag
        self.module.after_update(self.step, None if applied is True else torch.zeros(()) if applied is False else applied)
        precompute_float8_scales(self.model, self.run.float8)  # tensorwise fp8 + FSDP2: all scales in one all-reduce
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _clip_groups(self, params: list[torch.Tensor]) -> torch.Tensor | None:
        """A group number per parameter of ``params`` for ``train.grad_clip_scope`` (None: ``global``):
        each parameter its own (``parameter``), or the index of the training module's part that holds it
        (``part``: :meth:`~vitscale.tasks.module.TrainModule.clip_parts`; a parameter of none, its own)."""
        scope = self.cfg.train.grad_clip_scope
        if scope == "global" or self.cfg.train.grad_clip <= 0:
            return None
        ids = tuple(id(q) for q in params)
        if self._clip_ids is None or self._clip_ids[0] != ids:  # the same parameters every step: built once
            if scope == "parameter":
                groups = torch.arange(len(params))
            else:
                parts = self.module.clip_parts()
                part_of = {id(q): i for i, m in enumerate(parts) for q in m.parameters()}
                groups = torch.tensor([part_of.get(id(q), len(parts) + i) for i, q in enumerate(params)])
            self._clip_ids = (ids, groups.to(self.device))
        return self._clip_ids[1]

    def print_summary(self, summary: dict[str, Any], fmt: str = "human") -> None:
        """Print the end of the run on rank 0: ``human`` (what the run gave and where its outputs are),
        ``json`` (summary.json's contents) or ``none``."""
        print_run_end(self.cfg, summary, fmt, is_main=self.run.dims.is_main, reporting=self.report,
                      names=() if self.complete else tuple(self.evals.names))  # fmt: skip


def train(cfg: Config, *, summary: str = "human", notes: list[str] | tuple[str, ...] = (),
          runtime: Any = None) -> dict[str, Any]:
    """Train per ``cfg``; returns the summary (also written to ``<output_dir>/summary.json``).

    Rank 0 keeps what it prints in ``<output_dir>/train.log`` (``vitscale.train.runlog``) and ends
    with the summary in the form ``summary`` names: ``human``, ``json`` or ``none``. ``notes``: lines
    from loading the config, printed with the run's opening lines. ``runtime``: what a task's job hands
    each run it trains (:attr:`vitscale.tasks.base.Task.runtime`); one with a ``stop_group`` (a gloo
    process group over the whole job) has a signal's stop agreed over the job, so that its runs all stop
    after the same step."""
    job = get_task(cfg.train.task).job(cfg) if cfg.train.task else None
    if job is not None:  # a task whose config is several runs (feature_distill's distill.students)
        return job(cfg, train, summary=summary, notes=notes)  # each of its runs trained by this function
    rank = int(os.environ.get("RANK", "0"))  # the rank torchrun gave this process (0 without torchrun)
    out = Path(cfg.train.output_dir)
    with RunLog(out / "train.log", enabled=rank == 0, header=command_line()) as runlog, \
            Stopping.build(cfg.checkpoint, train=cfg.train, rank=rank,
                           agreement=getattr(runtime, "stop_group", None)) as stopping:  # start-up included
        trainer = Trainer(cfg, stopping, runtime)  # checks the settings and claims the run folder (or refuses: no file written)
        trainer.notices[:0] = list(notes)
        runlog.attach()
        result = trainer.fit()
        trainer.print_summary(result, summary)
    return result
