"""The base of an ``evals:`` entry's config: each evaluator declares a subclass beside it
(``vitscale/eval/*.py``) and the config loader builds an entry as the class of its ``kind``
(:meth:`EvaluatorConfig.kind_config`), looked up in ``vitscale.registry.EVALUATORS``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ..errors import ConfigError
from ..registry import EVALUATORS

ProbeFeatures = Literal["pooled", "class_token", "class_token_patch_mean"]
"""What a linear probe reads (``eval.probe_features``, a ``linear_probe`` entry's ``features``): the
pre-logits representation, or DINOv2's linear-evaluation features (``vitscale.eval.probe.read_features``)."""


@dataclass
class EvaluatorConfig:
    """One entry of ``evals:``: which evaluator, the prefix of its metrics, when, and on what data."""

    RANGES: ClassVar[dict[str, tuple]] = {"every": (0, 1 << 30), "batch_size": (1, 1 << 20)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    KIND: ClassVar[str] = "kind"
    """The field whose value chooses the class (the config loader's kind mechanism)."""

    kind: str = ""
    """An evaluator registered in ``vitscale.registry.EVALUATORS`` (a plug-in's too; an unknown name's
    one-line error lists them)."""
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
    def kind_config(kind: Any, key: str = "kind") -> type[EvaluatorConfig]:
        """The config class of the evaluator ``kind`` (the config loader builds an entry as this)."""
        return EVALUATORS.get(kind, key=key).config

    @staticmethod
    def kinds() -> list[tuple[str, type[EvaluatorConfig]]]:
        """``(kind, its config class)`` of every known evaluator."""
        return [(kind, cls.config) for kind, cls in EVALUATORS.items()]


def metric_prefix(entry: EvaluatorConfig) -> str:
    """The prefix of an entry's metrics: its ``name``, else its evaluator's default name."""
    return EVALUATORS.get(entry.kind).default_name if entry.name is None else entry.name


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


__all__ = ["EvaluatorConfig", "ProbeFeatures", "check_entries", "metric_prefix"]
