"""The trainer's evaluation component: the run's evaluations (``evals:``, else its task's defaults)
built once at the start — loaders and label files read, so a bad entry fails before training — and
run when due, on the model, on its EMA (metrics ``<name>_<key>_ema``) and on the weight sets the
training module has evaluated beside it (DINO's teacher: ``<name>_<key>_teacher``). ``vitscale eval`` builds the
same evaluations for a checkpoint (:mod:`vitscale.train.evaluate`)."""

from __future__ import annotations

from typing import Any

from torch import nn

from vitscale.config import eval_entries
from vitscale.eval.evaluator import EvalContext
from vitscale.eval.runner import Evaluations
from vitscale.run import Run
from vitscale.run.evaldata import RunEvalData
from vitscale.tasks import Task


def eval_context(run: Run, task: Task, autocast) -> EvalContext:
    """What every evaluation of ``run`` reads beside its own entry: the run's evaluation data, device,
    data-parallel group, class names and seed, and ``task``'s tokenizer and text fitting, under ``autocast``."""
    cfg = run.cfg
    return EvalContext(
        data=RunEvalData(run), device=run.device, autocast=autocast, group=run.dims.dp_group(),
        class_names=list(run.class_names), seed=cfg.train.seed, cpu_threads=cfg.train.cpu_threads,
        tokenizer=task.tokenizer, fit_text=task.fit_context, task=task,
    )  # fmt: skip


def select_evaluations(evals: tuple | None, task: Task, cfg, context: EvalContext, *, training: bool = True) -> Evaluations:
    """``evals`` (the config's ``evals:`` or the entries a command gives), else ``task``'s default
    evaluations for ``cfg`` — in a ``training`` run dropped when it has no validation data (it then
    reports training metrics only); ``vitscale eval`` refuses instead; ``evals=[]``: none."""
    implicit = evals is None and training
    if evals is None:
        evals = eval_entries(task.default_evals(cfg), f"{task.name} default evaluations")
    return Evaluations(list(evals), context, implicit=implicit)


class EvalSchedule:
    """When the trainer evaluates what: every entry at its period (``every``) and all at the end.
    :meth:`build` builds it from the ``evals`` group and the run's evaluation context."""

    def __init__(self, evaluations: Evaluations):
        self.evaluations = evaluations

    @classmethod
    def build(cls, evals: tuple | None, *, task: Task, cfg, context: EvalContext) -> EvalSchedule:
        """The evaluations ``evals`` (``evals:``; None: ``task``'s defaults for ``cfg``) in ``context``."""
        return cls(select_evaluations(evals, task, cfg, context))

    @property
    def names(self) -> list[str]:
        return self.evaluations.names

    def due(self, step: int, last: bool) -> list:
        return self.evaluations.due(step, last)

    def run(self, model: nn.Module, ema, due: list, others: dict[str, nn.Module] | None = None) -> dict[str, Any]:
        """The metrics of the evaluators ``due`` on the model (and on the EMA weights, suffix ``_ema``; on
        each of ``others``, a training module's evaluated weight sets such as DINO's teacher, suffix
        ``_<name>``: :meth:`vitscale.tasks.module.TrainModule.evaluated`)."""
        res = self.evaluations.run(model, due)
        if ema is not None:
            res.update(self.evaluations.run(ema.module, due, suffix="_ema"))
        for name, other in (others or {}).items():
            res.update(self.evaluations.run(other, due, suffix=f"_{name}"))
        return res


__all__ = ["EvalSchedule", "eval_context", "select_evaluations"]
