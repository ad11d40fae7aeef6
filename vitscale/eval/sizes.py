"""The ``sizes`` evaluator: classification accuracy at several image sizes or NaFlex sequence lengths,
one loader each (FixRes, arXiv 1906.06423: accuracy moves with the test resolution; NaFlex, SigLIP 2
arXiv 2502.14786: one model evaluated at several sequence lengths).

Metrics, under its default name ``sizes``: ``sizes_seq<N>_top1`` / ``_top5`` / ``_loss`` per sequence
length (``seq_lens``) or ``sizes_px<S>_top1`` ... per image side (``image_sizes``): percent in
summary.json, metrics.jsonl and report.html like every ``*_top1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config.data import MAX_SEQ_LEN
from ..config.ranges import MAX_IMAGE_SIDE
from ..errors import ConfigError
from .classification import ClassificationConfig, evaluate_classification
from .evaluator import Evaluator, register_evaluator


@dataclass
class SizesConfig(ClassificationConfig):
    """``kind: sizes``: top-1 / top-5 and loss of the model's classifier at each of several sizes."""

    RANGES: ClassVar[dict[str, tuple]] = {"seq_lens": (1, MAX_SEQ_LEN), "image_sizes": (1, MAX_IMAGE_SIDE)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    seq_lens: tuple[int, ...] = ()
    """NaFlex sequence lengths to evaluate at (a run with ``data.seq_lens``), e.g. ``[36, 64, 100]``;
    each is the evaluation's ``data.eval_seq_len``."""
    image_sizes: tuple[int, ...] = ()
    """Square image sides to evaluate at (a run with ``data.image_sizes``), e.g. ``[24, 32, 40]``; each
    is the evaluation's ``data.eval_image_size``."""


class SizesEvaluator(Evaluator):
    config = SizesConfig
    default_name = "sizes"

    def __init__(self, cfg: SizesConfig, ctx):
        super().__init__(cfg, ctx)
        if bool(cfg.seq_lens) == bool(cfg.image_sizes):
            raise ConfigError("evals: kind sizes needs seq_lens (NaFlex sequence lengths) or image_sizes (image sides): one of them")
        key, prefix, sizes = (("eval_seq_len", "seq", cfg.seq_lens) if cfg.seq_lens
                              else ("eval_image_size", "px", cfg.image_sizes))  # fmt: skip
        if key in cfg.data:
            raise ConfigError(f"evals: kind sizes sets data.{key} itself (one loader per size): leave it out of its data")
        self.loaders = {f"{prefix}{s}": ctx.data.loader({**cfg.data, key: int(s)}, cfg.split, cfg.batch_size) for s in sizes}

    def __call__(self, model):
        c, out = self.ctx, {}
        for name, loader in self.loaders.items():
            got = evaluate_classification(model, loader, c.device, autocast=c.autocast, loss=self.cfg.loss, group=c.group)
            out.update({f"{name}_{k}": v for k, v in got.items()})
        return out


register_evaluator("sizes", SizesEvaluator)
