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
import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
from torch import nn

from ..errors import ConfigError, UserError


class MissingSplit(UserError):
    """An evaluator's data has no such split (no validation data, say)."""


@dataclass
class EvaluatorConfig:
    """One entry of ``evals:``: which evaluator, the prefix of its metrics, when, and on what data."""

    kind: str = ""
    """The registered evaluator: classification | class_subset | real | zeroshot | retrieval |
    linear_probe | fewshot | knn | sizes (or one a plug-in registers)."""
    name: str | None = None
    """Prefix of its metrics: ``val`` logs ``val_top1``; None = the evaluator's default (classification:
    ``val``, zeroshot: ``zeroshot``, ...); "" = its metric names as they are."""
    every: int = 0
    """Evaluate every N training steps and at the end; 0 = at the end only."""
    data: dict[str, Any] = field(default_factory=dict)
    """Its own data: ``data.*`` settings that differ from the run's, e.g. ``{format: imagefolder,
    val_path: /data/imagenetv2}``; {} = the run's own data."""
    split: Literal["train", "val"] = "val"
    """The split of that data it evaluates on, read in order and unaugmented."""
    batch_size: int | None = None
    """Images per rank per batch; None = ``eval.batch_size``."""

    def __post_init__(self):
        if self.every < 0:
            raise ValueError(f"every={self.every} must be >= 0 (evaluate every N steps; 0 = at the end only)")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1 (None = eval.batch_size)")

    @staticmethod
    def kind_config(kind: Any) -> type[EvaluatorConfig]:
        """The config class of the evaluator ``kind`` (the config loader builds an entry as this)."""
        return evaluator_class(kind).config


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


_EVALUATORS: dict[str, type[Evaluator]] = {}
# Built-in evaluators, imported on first use of their kind.
_MODULES = {
    "classification": "vitscale.eval.classification",
    "class_subset": "vitscale.eval.subset",
    "real": "vitscale.eval.real",
    "zeroshot": "vitscale.eval.zeroshot",
    "retrieval": "vitscale.eval.retrieval",
    "linear_probe": "vitscale.eval.probe",
    "fewshot": "vitscale.eval.probe",
    "knn": "vitscale.eval.knn",
    "sizes": "vitscale.eval.sizes",
}


def metric_prefix(entry: EvaluatorConfig) -> str:
    """The prefix of an entry's metrics: its ``name``, else its evaluator's default name."""
    return evaluator_class(entry.kind).default_name if entry.name is None else entry.name


def check_entries(entries, key: str = "evals") -> None:
    """:class:`ConfigError` when two entries would log their metrics under the same prefix."""
    seen: dict[str, int] = {}
    for i, e in enumerate(entries):
        prefix = metric_prefix(e)
        if prefix in seen:
            raise ConfigError(
                f"{key}[{i}] ({e.kind}) and {key}[{seen[prefix]}] both log their metrics as {prefix or '(no prefix)'}_*: "
                f"give each its own name, e.g. name: {e.kind}{i}"
            )
        seen[prefix] = i


def register_evaluator(kind: str, cls: type[Evaluator]) -> None:
    """Make ``kind: <kind>`` an entry of ``evals:``."""
    _EVALUATORS[kind] = cls


def evaluator_kinds() -> list[str]:
    """Every evaluator kind: the built-in ones and those registered so far."""
    return sorted(set(_EVALUATORS) | set(_MODULES))


def evaluator_class(kind: Any) -> type[Evaluator]:
    if kind not in _EVALUATORS and kind in _MODULES:
        importlib.import_module(_MODULES[kind])
    if kind not in _EVALUATORS:
        known = evaluator_kinds()
        close = difflib.get_close_matches(str(kind), known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"kind: {kind!r} is not an evaluator; {hint}choose one of {', '.join(known)}")
    return _EVALUATORS[kind]


__all__ = [
    "EvalContext", "EvalData", "Evaluator", "EvaluatorConfig", "MissingSplit", "check_entries", "evaluator_class", "evaluator_kinds", "metric_prefix",
    "register_evaluator",
]  # fmt: skip
