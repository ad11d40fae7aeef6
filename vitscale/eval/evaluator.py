"""The evaluator seam: a run holds a list of evaluations (config key ``evals:``), each an entry naming a
registered evaluator (``kind``), the prefix of its metrics (``name``), its period (``every``) and its
own fields, its own data included. After big_vision's ``config.evals`` and ``evaluators/`` (a name ->
{type, data, log_steps}; the trainer imports the evaluator's module and calls it).

An evaluator is a module that holds its config (a dataclass deriving from :class:`EvaluatorConfig`,
a docstring under every field) and its class (deriving from :class:`Evaluator`) and registers both::

    @dataclass
    class MyEvalConfig(EvaluatorConfig):
        threshold: float = 0.5
        \"\"\"...\"\"\"

    class MyEval(Evaluator):
        config = MyEvalConfig
        default_name = "mine"

        def __init__(self, cfg, ctx):      # build what it needs once: its loaders, class lists
            super().__init__(cfg, ctx)
            self.loader = ctx.data.loader(cfg.data, cfg.split, cfg.batch_size)

        def __call__(self, model):         # metrics over the whole split, the same on every rank
            return {"top1": ...}

    register_evaluator("mine", MyEval)

``tests/integration/test_evals.py`` writes one in its test file alone and runs it through the CLI.
The evaluator's metrics are logged as ``<name>_<key>`` (``val`` + ``top1`` -> ``val_top1``; an empty
name: the keys as they are).
Every data-parallel rank runs the evaluator on its shard of the split (whole batches, padding
samples have index -1) and combines the counts over ``ctx.group``, so each rank returns the metrics
of the whole split.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from ..config.evals import EvaluatorConfig, check_entries, metric_prefix
from ..errors import EXIT_USAGE, UserError
from ..registry import EVALUATORS


class MissingSplit(UserError):
    """An evaluator's data has no such split (no validation data, say), or no labels where it reads
    them: the config must change (exit code 2, as a failed up-front check)."""

    exit_code = EXIT_USAGE


class EvalData(Protocol):
    """Loaders of an evaluator's data (``vitscale.run.evaldata``): the run's, or its own."""

    def loader(self, data: dict[str, Any], split: str, batch_size: int | None) -> Any:
        """This rank's shard of ``split`` of the run's data with ``data`` changed, in order, unaugmented."""

    def classes(self, data: dict[str, Any]) -> tuple[int, list[str]]:
        """(class count, class names) of the run's data with ``data`` changed."""


@dataclass
class EvalContext:
    """What every evaluator of a run shares."""

    data: EvalData
    """Loaders of the run's data, or of an evaluator's own."""
    device: torch.device
    """This rank's device."""
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    """The forward pass's autocast context (``precision.autocast``)."""
    group: Any = None
    """The data-parallel process group (None = the world) the evaluators combine their counts over."""
    class_names: list[str] = field(default_factory=list)
    """The class names of the run's data: the model's label space."""
    seed: int = 0
    """``train.seed`` (probes draw their keyed samples from it)."""
    cpu_threads: int = 0
    """``train.cpu_threads`` (probes fit on the CPU with it); 0 = PyTorch's default."""
    tokenizer: Any = None
    """The run's text tokenizer (image-text models), else None."""
    fit_text: Callable[[torch.Tensor], torch.Tensor] = lambda tokens: tokens
    """Cuts batch caption tokens to the text tower's context (image-text models)."""
    cache: dict = field(default_factory=dict)
    """Results shared by the evaluators of one round (image embeddings of a loader); emptied after it."""
    task: Any = None
    """The run's task (:class:`vitscale.tasks.base.Task`), built for training (its parts: feature
    distillation's teachers and heads, read by its own evaluator) or for ``vitscale eval``; None = none."""

    def cached(self, key: Any, compute: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]


class Evaluator:
    """``Evaluator(cfg, ctx)`` builds what it needs (its loaders); ``evaluator(model)`` returns metrics
    (numbers in percent for ratios; lists and strings are kept in metrics.jsonl but not plotted)."""

    config: type[EvaluatorConfig] = EvaluatorConfig
    default_name: str = ""

    def __init__(self, cfg: EvaluatorConfig, ctx: EvalContext):
        self.cfg, self.ctx = cfg, ctx

    @property
    def name(self) -> str:
        return self.default_name if self.cfg.name is None else self.cfg.name

    def __call__(self, model: nn.Module) -> dict[str, Any]:
        raise NotImplementedError


def register_evaluator(kind: str, cls: type[Evaluator]) -> None:
    """Make ``kind: <kind>`` an entry of ``evals:``."""
    EVALUATORS.register(kind, cls)


def evaluator_class(kind: Any) -> type[Evaluator]:
    """The evaluator of ``kind`` (ConfigError naming the closest kind otherwise)."""
    return EVALUATORS.get(kind)


__all__ = [
    "EvalContext", "EvalData", "Evaluator", "EvaluatorConfig", "MissingSplit", "check_entries", "EVALUATORS", "evaluator_class", "metric_prefix",
    "register_evaluator",
]  # fmt: skip
