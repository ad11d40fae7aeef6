"""Evaluate trained weights: the config's run (:func:`vitscale.run.assemble`) with the weights of a
checkpoint, on the config's val split, by the run's task or by a probe on frozen features
(``eval.probe``) (``vitscale eval``). Under torchrun the model takes the ``parallel.*`` layout (FSDP2,
TP) and each data-parallel rank evaluates its shard of the split; the results are those of one
process (every rank returns them)."""

from __future__ import annotations

from vitscale.checkpoint import load_model_weights, read_weights
from vitscale.config import Config
from vitscale.eval.probe import run_probe
from vitscale.run import assemble
from vitscale.tasks import get_task

from .fastpath import autocast_factory


def evaluate_checkpoint(cfg: Config, path, *, ema: bool = False) -> dict:
    """Load the weights at ``path`` (DCP checkpoint, run folder or .safetensors; the EMA weights with
    ``ema``) into the config's model and evaluate them on the config's val split."""
    run = assemble(cfg, "eval")
    if run.loaders.val is None:
        raise FileNotFoundError("the config has no validation data (set data.val_path or data.val_split)")
    report = load_model_weights(run.model, read_weights(path, "ema" if ema else "model"), strict=True, source=path)
    autocast = autocast_factory(run.device, run.precision.autocast)
    group = run.dims.dp_group()
    if cfg.eval.probe != "none":  # a linear / few-shot probe on frozen features instead of the head
        res = run_probe(run.cfg, run.model, run.loaders, run.device, autocast=autocast, group=group)
    else:
        task = get_task(run.task).for_evaluation(run.cfg, run.model, run.num_classes, group)
        task.device, task.autocast = run.device, autocast
        res = task.evaluate(run.model, run.loaders.val)
    layout = {"layout": run.dims.describe()} if run.dims.distributed else {}
    return {"checkpoint": str(path), "ema": ema, **layout, **res, **({"load": report} if any(report.values()) else {})}


__all__ = ["evaluate_checkpoint"]
