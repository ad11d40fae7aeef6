"""The trainer: one loop for every model family, task and parallel layout.

:func:`vitscale.run.assemble` builds the run (device, layout, data, the model on the meta device ->
its family's plan through the parallelize tail -> ``to_empty`` -> ``init_weights()`` under the run's
seed); the trainer adds the optimizer, schedule, EMA, task and checkpointer and holds the loop. It
never branches on a model's name: the task (``train.task`` or the family's default) computes the
loss and the evaluation.

Steps count from 1 (step N = the N-th optimizer update). The host syncs with the device only at log,
eval and checkpoint steps (and, for a non-fused optimizer, to skip a non-finite step:
:mod:`vitscale.train.nonfinite`). A resume restores model, optimizer, EMA, step, data position and
RNG, so the loss curve continues exactly; a finished run started again trains nothing and says so.
The run folder is locked while the trainer runs (:mod:`vitscale.run.folder`).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from vitscale.checkpoint import Checkpointer, export_safetensors, load_model_weights, read_weights
from vitscale.config import Config, run_config_dict, save_config
from vitscale.distributed.compile import StaticShapes, check_graph_inputs, mark_step, uses_cudagraphs
from vitscale.distributed.float8 import precompute_float8_scales
from vitscale.distributed.utils import clip_grad_norm_
from vitscale.run import assemble
from vitscale.tasks import get_task
from vitscale.tools.env import command_line, environment
from vitscale.tools.mfu import achieved_tflops, mfu_percent, peak_tflops
from vitscale.tools.report import REPORT_NAME, try_write_report
from vitscale.tools.report.run import flatten
from vitscale.tools.units import UNITS

from .ema import EMA
from .fastpath import autocast_factory, sdpa_backend
from .metrics import MetricsLogger, strict_json
from .nonfinite import NonFiniteGuard, prepare_optimizer, skips_on_device
from .optim import build_optimizer, scaled_lr
from .runlog import RunLog
from .schedules import Schedule, fit_warmup, warmup_steps
from .summary import human_summary


def _reduce_mean(t: torch.Tensor, world: int) -> torch.Tensor:
    if world > 1 and dist.is_initialized():
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= world
    return t


def _step_seed(seed: int, step: int, rank: int) -> int:
    x = (seed * 1_000_003 + step) * 1_000_033 + rank
    x = (x ^ (x >> 31)) * 0x9E3779B97F4A7C15 & (2**63 - 1)
    return x


# ----------------------------------------------------------------------------------------- trainer
class Trainer:
    def __init__(self, cfg: Config):
        self._t_created = time.perf_counter()
        self.started_at = _now()
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
        self.device, self.pd, self.world = run.device, run.dims, run.dims.world_size
        self.is_main = self.pd.is_main
        self.out = Path(cfg.train.output_dir)
        tc = cfg.train
        self.micro_batch, self.img_size, self.loaders = run.micro_batch, run.img_size, run.loaders
        self.num_classes, self.model_overrides, self.family = run.num_classes, run.model_overrides, run.family
        self.model = model = run.model
        model.train()
        # train.compile_mode=reduce-overhead / max-autotune: the blocks replay CUDA graphs (its guards:
        # vitscale.distributed.compile; the run's setting was checked by vitscale.run.checks)
        self.cudagraphs = bool(tc.compile) and uses_cudagraphs(tc.compile_mode)
        self.static_shapes = StaticShapes()
        if self.cudagraphs:
            check_graph_inputs(model, self.device)
        torch.manual_seed(tc.seed + 1 + self.pd.dp_rank)  # dropout / drop-path streams

        # Optimization.
        self.peak_lr = scaled_lr(cfg.optim, tc.batch_size)
        self.optimizer = build_optimizer(model, cfg.optim, self.peak_lr)
        self.steps_per_epoch = max(len(self.loaders.train) // tc.grad_accum, 1)
        if tc.max_steps > 0:
            self.total_steps = tc.max_steps
        else:  # train.epochs > 0 (vitscale.run.checks)
            self.total_steps = max(int(math.ceil(tc.epochs * self.steps_per_epoch)), 1)
        warmup, notice = fit_warmup(warmup_steps(cfg.schedule, self.steps_per_epoch), self.total_steps)
        self.notices = [notice] if notice else []
        if self.loaders.val is None:
            self.notices.append("no validation data: this run reports training metrics only (set data.val_path, "
                                "or data.val_split to hold out part of the training data)")  # fmt: skip
        self.schedule = Schedule(self.optimizer, cfg.schedule, self.total_steps, warmup, self.peak_lr)
        self.ema = None
        if tc.ema_decay > 0:
            # FSDP modules cannot be deep-copied: a second model sharded the same way
            self.ema = EMA(model, tc.ema_decay, module=run.new_model() if self.world > 1 else None)
        self.autocast = autocast_factory(self.device, run.precision.autocast)
        self.task = get_task(run.task)(cfg, model, self.num_classes, run.dims.dp_group())
        self.task.autocast = self.autocast
        self.task.device = self.device
        self.checkpointer = Checkpointer(self.out / "checkpoints", keep=cfg.checkpoint.keep)
        self.step = 0
        self.skipped = 0
        self.complete = False
        self.last_checkpoint: str | None = None
        self.tensorboard = False  # whether fit() writes TensorBoard events
        self.written: dict[str, bool] = {}  # outputs this run wrote at its end ("weights", "report"): the summary lists only those
        self.flops_per_image = self._flops() if cfg.log.flops else None
        self.peak_tflops = self._peak() if self.flops_per_image else None
        prepare_optimizer(self.optimizer)
        self.skip_on_device = skips_on_device(self.optimizer)
        nonfinite_before = self._restore()
        self.guard = NonFiniteGuard(self.device, tc.max_nonfinite_steps, tc.max_consecutive_nonfinite, nonfinite_before)
        if self.is_main and not self.complete:  # a finished run's config.yaml still describes its weights
            self._write_config()

    def _write_config(self) -> None:
        path = self.out / "config.yaml"
        if self.resumed_from and self.run.claim is not None and self.run.claim.accepted and path.is_file():
            # the config the checkpoints so far were trained with, kept beside the new one
            path.replace(self.out / f"config.before_step_{self.step:08d}.yaml")
        save_config(self.cfg, path)

    # ------------------------------------------------------------------------------------- building
    def _flops(self) -> float | None:
        try:
            return float(self.model.flops(self.img_size))
        except Exception:  # FLOPs are informative only
            return None

    def _peak(self) -> float | None:
        """Peak TFLOP/s for MFU: the datasheet figure of the GPU, or on CPU a measured fp32 matmul
        peak with this run's thread count (a fraction of a second, then cached per CPU model and
        thread count in ``$VITSCALE_CACHE_DIR``, as ``vitscale bench`` does)."""
        try:
            if self.device.type == "cpu":
                return float(peak_tflops(self.device, torch.float32)[0])
            dtype = torch.bfloat16 if self.run.precision.autocast is not None else torch.float32
            return float(peak_tflops(self.device, dtype)[0])
        except Exception:  # MFU is informative only
            return None

    def state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        state = {
            "model": get_model_state_dict(self.model),
            "optim": get_optimizer_state_dict(self.model, self.optimizer),
        }
        if self.ema is not None:
            state["ema"] = get_model_state_dict(self.ema.module)
        return state

    def _restore(self) -> int:
        """Resume from the newest intact checkpoint, or initialise from ``checkpoint.init_from``.
        Returns the non-finite steps the run had so far."""
        cfg = self.cfg
        latest = self.checkpointer.latest() if cfg.checkpoint.resume else None
        if latest is not None:
            from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

            self.resumed_from = self.last_checkpoint = str(latest)
            step = int(latest.name.rsplit("_", 1)[1])
            if step >= self.total_steps:  # a finished run: nothing to load, nothing to train
                self.step, self.complete = step, True
                return 0
            state = self.state()
            ts = self.checkpointer.load(latest, state)
            set_model_state_dict(self.model, state["model"])
            set_optimizer_state_dict(self.model, self.optimizer, state["optim"])
            if self.ema is not None and "ema" in state:
                set_model_state_dict(self.ema.module, state["ema"])
            self.step = int(ts["step"])
            self.skipped = int(ts.get("skipped", 0))
            self.loaders.train.load_state_dict(ts["data"])
            return int(ts.get("nonfinite_steps", 0))
        self.resumed_from = None
        if cfg.checkpoint.init_from:
            sd = read_weights(cfg.checkpoint.init_from, "model")
            report = load_model_weights(self.model, sd, source=f"checkpoint.init_from={cfg.checkpoint.init_from}")
            if self.ema is not None:
                self.ema.module.load_state_dict(self.model.state_dict())
            self.init_report = report
        return 0

    # ------------------------------------------------------------------------------------- loop
    def _batches(self):
        loader = self.loaders.train
        while True:  # the loader moves on to the next epoch by itself at the end of one
            yield from loader

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
        cfg = self.cfg.train
        model, n = self.model, cfg.grad_accum
        loss_sum = torch.zeros((), device=self.device)
        metric_sums: dict[str, torch.Tensor] = {}
        if self.cudagraphs:
            mark_step()  # the CUDA graphs' outputs of the last step may be overwritten from here on
        for micro in range(n):
            if self.world > 1 and n > 1:  # every model is an FSDP2 module on several ranks
                model.set_requires_gradient_sync(micro == n - 1)  # reduce gradients on the last micro-step only
            batch = self._to_device(next(batches))
            if self.cudagraphs:
                self.static_shapes.check(batch)
            self.skipped += int(batch.get("skipped", 0))
            # Dropout / drop-path draw from a stream keyed by (seed, micro-step, data-parallel rank): a
            # resume continues exactly whatever else touched the global RNG (e.g. DataLoader iterators).
            torch.manual_seed(_step_seed(cfg.seed, (self.step - 1) * n + micro, self.pd.dp_rank))
            loss, metrics = self.task.loss(model, batch, (self.step - 1) * n + micro)
            (loss / n).backward()
            loss_sum += loss.detach()
            for k, v in metrics.items():
                metric_sums[k] = metric_sums.get(k, 0) + v.detach()
        params = [p for p in model.parameters() if p.grad is not None]
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        if self.world > 1:  # DTensors on several meshes (FSDP x TP): per-mesh reductions
            grad_norm = clip_grad_norm_(params, max_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)  # foreach on CPU / CUDA
        loss = loss_sum / n
        # A step with a non-finite loss or gradient norm on any rank is not applied (nonfinite.py).
        ok = self.guard.flag(loss, grad_norm, self.world)
        self.schedule.apply(self.step)
        if self.skip_on_device:  # fused kernels skip on the device: no host sync
            self.optimizer.found_inf = 1.0 - ok
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf
            if self.ema is not None:
                self.ema.update(model, ok)
        elif bool(ok):  # the host decides (free on the CPU; one sync per step on a GPU)
            self.optimizer.step()
            if self.ema is not None:
                self.ema.update(model)
        else:
            self.guard.check(self.step, self.last_checkpoint)  # stop as soon as the budget is spent
        precompute_float8_scales(model, self.run.float8)  # tensorwise fp8 + FSDP2: all scales in one all-reduce
        self.optimizer.zero_grad(set_to_none=True)
        return loss, {k: v / n for k, v in metric_sums.items()}, grad_norm

    def evaluate(self) -> dict[str, float]:
        if self.loaders.val is None:
            return {}
        res = self.task.evaluate(self.model, self.loaders.val)
        if self.ema is not None:
            res.update({f"{k}_ema": v for k, v in self.task.evaluate(self.ema.module, self.loaders.val).items()})
        return res

    def save_checkpoint(self) -> None:
        nonfinite = self.guard.check(self.step, self.last_checkpoint)  # a diverged run saves nothing more
        ts = {"step": self.step, "data": self.loaders.train.state_dict(), "skipped": self.skipped,
              "nonfinite_steps": nonfinite, "total_steps": self.total_steps}  # fmt: skip
        self.last_checkpoint = str(self.checkpointer.save(self.step, self.state(), ts))

    def fit(self) -> dict[str, Any]:
        try:
            if self.complete:
                return self._finished()
            return self._fit_logged()
        finally:
            self.close()

    def _finished(self) -> dict[str, Any]:
        """A finished run started again with the same config: say so (the end-of-run summary that
        :func:`train` prints next says where its outputs are)."""
        summary: dict[str, Any] = {}
        try:
            summary = json.loads((self.out / "summary.json").read_text())
        except (OSError, ValueError):
            pass
        summary = {**(summary if isinstance(summary, dict) else {}), "complete": True, "output_dir": str(self.out),
                   "steps": self.step, "steps_this_run": 0, "resumed_from": self.resumed_from}  # fmt: skip
        if self.is_main:
            key = "train.max_steps" if self.cfg.train.max_steps > 0 else "train.epochs"
            print(
                f"{self.out} is a finished run (step {self.step} of {self.total_steps}; newest checkpoint "
                f"{Path(self.resumed_from).name}): nothing to train. To train it longer, raise {key} and add checkpoint.allow_changes={key}; to start over, set another "
                f"train.output_dir",
                flush=True,
            )
        return summary

    def _fit_logged(self) -> dict[str, Any]:
        cfg = self.cfg
        tc = cfg.train
        if self.run.claim is not None and self.run.claim.accepted:
            changed = ", ".join(f"{k}: {a} -> {b}" for k, a, b in self.run.claim.accepted)
            print(f"resuming {self.out} with changes (checkpoint.allow_changes): {changed}", flush=True)
        log = MetricsLogger(
            self.out, enabled=self.is_main, total_steps=self.total_steps, start_step=self.step,
            progress=cfg.log.progress, tensorboard=cfg.log.tensorboard,
        )  # fmt: skip
        self.tensorboard = log.tb is not None
        if self.run.float8.recipe != "none":
            log.info(self.run.float8.summary())
        if self.resumed_from:
            log.info(f"resumed from {self.resumed_from} at step {self.step}")
        n_params = sum(p.numel() for p in self.model.parameters())
        log.info(f"training {cfg.model.name} ({n_params / 1e6:.2f}M params) for {self.total_steps} steps on {self.device}")
        log.info(f"batch {tc.batch_size} ({self.micro_batch}/rank x {tc.grad_accum} accum x {self.world} ranks), "
                 f"peak lr {self.peak_lr:.3e}, warmup {self.schedule.warmup} steps")  # fmt: skip
        for notice in self.notices:
            log.info(notice)
        try:
            with sdpa_backend(cfg.train.sdpa):  # the attention kernels of the fast path, as `vitscale bench`
                return self._fit(log)
        finally:  # also when a step fails: the bar ends its line, TensorBoard flushes what it has
            log.close()

    def _fit(self, log: MetricsLogger) -> dict[str, Any]:
        cfg = self.cfg
        tc = cfg.train
        batches = self._batches()
        start_step = self.step
        t_start = t_last = time.perf_counter()
        images_since = 0
        last_eval: dict[str, float] = {}
        reported_nonfinite = self.guard.checked_total
        while self.step < self.total_steps:
            self.step += 1
            loss, metrics, grad_norm = self.train_step(batches)
            images_since += tc.batch_size
            log.advance()
            is_last = self.step == self.total_steps
            do_eval = is_last or (cfg.eval.every > 0 and self.step % cfg.eval.every == 0)
            if self.step % tc.log_every == 0 or is_last or do_eval or self.step == 1:
                loss_g = _reduce_mean(loss, self.world)  # global mean over ranks (the sync point)
                now = time.perf_counter()
                ips = images_since / max(now - t_last, 1e-9)
                rec: dict[str, Any] = {"step": self.step, "loss": loss_g.item(), "lr": self.schedule.peak * self.schedule.factor(self.step),
                                       "img_per_s": ips, "grad_norm": float(grad_norm.item())}  # fmt: skip
                for k, v in metrics.items():
                    rec[k] = _reduce_mean(v, self.world).item()
                if self.flops_per_image:
                    rec["tflops"] = achieved_tflops(ips, self.flops_per_image, "train")
                    if self.peak_tflops:
                        rec["mfu"] = mfu_percent(rec["tflops"], self.peak_tflops)
                rec["epoch"] = self.step / self.steps_per_epoch
                nonfinite = self.guard.check(self.step, self.last_checkpoint)  # stops a diverged run
                if nonfinite:
                    rec["nonfinite_steps"] = nonfinite
                    if nonfinite > reported_nonfinite:
                        log.info(f"step {self.step}: {nonfinite - reported_nonfinite} step(s) with a non-finite loss or "
                                 f"gradient norm not applied since the last log ({nonfinite} in the run)")  # fmt: skip
                    reported_nonfinite = nonfinite
                if do_eval:
                    last_eval = self.evaluate()
                    rec.update(last_eval)
                log.log(rec)
                if do_eval and not is_last and self.is_main and cfg.log.report:  # keep report.html current
                    try_write_report(self.out)
                images_since = 0
                t_last = time.perf_counter()  # eval time is not counted in img/s
            if (cfg.checkpoint.every > 0 and self.step % cfg.checkpoint.every == 0) or is_last:
                self.save_checkpoint()
                t_last = time.perf_counter()
        wall = time.perf_counter() - t_start
        self.guard.require_progress(self.step, self.step - start_step, self.last_checkpoint)  # never exit 0 untrained
        skipped = torch.tensor(float(self.skipped), device=self.device)
        if self.world > 1 and dist.is_initialized():
            dist.all_reduce(skipped)
        if cfg.checkpoint.export_safetensors:
            meta = {"model": cfg.model.name, "overrides": json.dumps(self.model_overrides), "step": str(self.step)}
            export_safetensors(self.model, self.out / "model.safetensors", meta)
            if self.ema is not None:
                export_safetensors(self.ema.module, self.out / "model_ema.safetensors", meta)
        self.written["weights"] = bool(cfg.checkpoint.export_safetensors)
        steps_run = self.step - start_step
        summary = {
            "model": cfg.model.name,
            "steps": self.step,
            "steps_this_run": steps_run,
            "wall_time_s": wall,
            "img_per_s": steps_run * tc.batch_size / max(wall, 1e-9),
            "skipped_files": int(skipped.item()),
            "nonfinite_steps": self.guard.checked_total,
            **{k: v for k, v in last_eval.items()},
        }
        if self.resumed_from:
            summary["resumed_from"] = self.resumed_from
        summary["total_time_s"] = time.perf_counter() - self._t_created  # building, loop, evaluations, export
        summary["started_at"], summary["finished_at"] = self.started_at, _now()
        summary["units"] = UNITS
        summary["env"] = environment(self.device, self.layout())
        if self.is_main:
            with open(self.out / "summary.json", "w") as f:
                json.dump(strict_json(summary), f, indent=1, allow_nan=False)
            if self.skipped:
                log.info(f"skipped {self.skipped} undecodable files (see the warnings above)")
            log.log_hparams(flatten(run_config_dict(cfg)), {k: v for k, v in last_eval.items()})
            self.written["report"] = bool(cfg.log.report) and try_write_report(self.out) is not None
        return summary

    def layout(self) -> dict[str, Any]:
        """The parallel layout of this run, for summary.json."""
        pd = self.pd
        out: dict[str, Any] = {"world_size": pd.world_size, "dp_replicate": pd.dp_replicate, "dp_shard": pd.dp_shard,
                               "tp": pd.tp, "micro_batch_per_rank": self.micro_batch, "grad_accum": self.cfg.train.grad_accum}  # fmt: skip
        if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun
            out["launcher"] = "torchrun"
            out["local_world_size"] = int(os.environ.get("LOCAL_WORLD_SIZE", pd.world_size))
        return out

    def print_summary(self, summary: dict[str, Any], fmt: str = "human") -> None:
        """Print the end of the run on rank 0: ``human`` (what the run gave and where its outputs are),
        ``json`` (summary.json's contents) or ``none``."""
        if not self.is_main or fmt == "none":
            return
        if fmt == "json":
            print(json.dumps(summary, indent=1), flush=True)
            return
        # what this run wrote at its end; a finished run started again: what its folder holds
        weights = self.out / "model.safetensors"
        weights = weights if self.written.get("weights", weights.is_file()) else None
        report = self.written.get("report", self.cfg.log.report and (self.out / REPORT_NAME).is_file())
        print(human_summary(summary, self.out, config=self.out / "config.yaml", report=report,
                            tensorboard=self.tensorboard, weights=weights), flush=True)  # fmt: skip


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def train(cfg: Config, *, summary: str = "human") -> dict[str, Any]:
    """Train per ``cfg``; returns the summary (also written to ``<output_dir>/summary.json``).

    Rank 0 keeps what it prints in ``<output_dir>/train.log`` (``vitscale.train.runlog``) and ends
    with the summary in the form ``summary`` names: ``human``, ``json`` or ``none``."""
    main = int(os.environ.get("RANK", "0")) == 0  # the rank torchrun gave this process (0 without torchrun)
    with RunLog(Path(cfg.train.output_dir) / "train.log", enabled=main, header=command_line()) as runlog:
        trainer = Trainer(cfg)  # checks the settings and claims the run folder (or refuses: no file written)
        runlog.attach()
        result = trainer.fit()
        trainer.print_summary(result, summary)
    return result
