"""Evaluate trained weights: the config's run (:func:`vitscale.run.assemble`) with the weights of a
checkpoint, through the run's evaluations (``evals:``, else its task's defaults on the val split), or
a probe on frozen features (``eval.probe``) (``vitscale eval``). Under torchrun the model takes the
``parallel.*`` layout (FSDP2, TP) and each data-parallel rank evaluates its shard of the split; the
results are those of one process (every rank returns them)."""

from __future__ import annotations

import sys

from vitscale.checkpoint import load_model_weights, read_weights
from vitscale.config import Config
from vitscale.eval.probe import probe_entry
from vitscale.run import assemble
from vitscale.tasks import get_task

from .evaluation import eval_context, select_evaluations
from .fastpath import autocast_factory


def evaluate_checkpoint(cfg: Config, path, *, ema: bool = False) -> dict:
    """Load the weights at ``path`` (DCP checkpoint, run folder or .safetensors; the EMA weights with
    ``ema``) into the config's model and evaluate them."""
    run = assemble(cfg, "eval")
    if cfg.eval.probe != "none":  # the probe reads the backbone's features, never the head: a backbone-only file
        # (no head.*: a num_classes=0 export) or another library's file (timm, transformers) is read as
        # checkpoint.init_from reads it, the classifier left as initialised
        from vitscale.interop.pretrained import load_pretrained

        report = load_pretrained(run.model, str(path), setting="checkpoint.path", format_key="checkpoint.init_format",
                                 weights="ema" if ema else "model")[2]  # fmt: skip
    else:
        report = load_model_weights(run.model, read_weights(path, "ema" if ema else "model"), strict=True, source=path)
    autocast = autocast_factory(run.device, run.precision.autocast)
    task = get_task(run.task).for_evaluation(run.cfg, run.model, run.num_classes, run.dims.dp_group(), run.class_names)
    task.device, task.autocast = run.device, autocast
    # a linear / few-shot probe on frozen features instead of the head; else evals:, else the task's defaults
    entries = (probe_entry(cfg.eval),) if cfg.eval.probe != "none" else cfg.evals
    for note in task.read_for_evaluation(run, path, entries):  # the task's own parts (feature distillation's heads)
        if run.dims.is_main:
            print(f"note: {note}", file=sys.stderr)
    res = select_evaluations(entries, task, cfg, eval_context(run, task, autocast), training=False).run(run.model)
    layout = {"layout": run.dims.describe()} if run.dims.distributed else {}
    return {"checkpoint": str(path), "ema": ema, **layout, **res, **({"load": report} if any(report.values()) else {})}


__all__ = ["evaluate_checkpoint"]
