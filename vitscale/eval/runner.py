"""A run's evaluations: the evaluators of its ``evals:`` entries, built once, run when due, their
metrics under their prefixes (:mod:`vitscale.eval.evaluator`)."""

from __future__ import annotations

from typing import Any

from torch import nn

from .evaluator import EvalContext, Evaluator, EvaluatorConfig, MissingSplit, check_entries, evaluator_class


class Evaluations:
    """``entries``: the ``evals:`` entries (or the task's defaults). ``implicit``: the entries are the
    task's defaults, not the user's: one whose data lacks its split is dropped instead of refused
    (a run without validation data reports training metrics only)."""

    def __init__(self, entries: list[EvaluatorConfig], ctx: EvalContext, *, implicit: bool = False):
        check_entries(entries)
        self.ctx = ctx
        self.evaluators: list[Evaluator] = []
        for entry in entries:
            try:
                self.evaluators.append(evaluator_class(entry.kind)(entry, ctx))
            except MissingSplit:
                if not implicit:
                    raise

    @property
    def names(self) -> list[str]:
        """The metric prefixes, in entry order."""
        return [ev.name for ev in self.evaluators]

    def due(self, step: int, last: bool) -> list[Evaluator]:
        """The evaluators to run after ``step``: those whose period divides it, and all at the end."""
        return [ev for ev in self.evaluators if last or (ev.cfg.every > 0 and step % ev.cfg.every == 0)]

    def run(self, model: nn.Module, evaluators: list[Evaluator] | None = None, suffix: str = "") -> dict[str, Any]:
        """The metrics of ``evaluators`` (all by default) on ``model``, as ``<name>_<key><suffix>``."""
        out: dict[str, Any] = {}
        try:
            for ev in self.evaluators if evaluators is None else evaluators:
                for key, value in ev(model).items():
                    out[f"{ev.name}_{key}{suffix}" if ev.name else f"{key}{suffix}"] = value
        finally:
            self.ctx.cache.clear()  # embeddings of this model: not the next round's
        return out


__all__ = ["Evaluations"]
