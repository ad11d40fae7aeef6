"""Training-only parts of the model: modules a task adds to the model it trains (MAE's decoder; a
self-supervised head) so that they are trained by the run's optimizer, checkpointed and resumed with
the model, and yet are not part of the model the family builds — the exported weights
(``model.safetensors``) and the weights another run reads (``checkpoint.init_from``, ``vitscale eval``,
``vitscale export``) leave them out. They live under one submodule, ``model.task_parts``
(:data:`vitscale.checkpoint.weights.TASK_PARTS`), attached in :meth:`Task.setup`, before the optimizer
is built."""

from __future__ import annotations

from torch import nn

from vitscale.checkpoint.weights import TASK_PARTS


def attach_part(model: nn.Module, name: str, module: nn.Module) -> nn.Module:
    """Add ``module`` to ``model`` as ``task_parts.<name>`` (its parameters ``task_parts.<name>.*``);
    returns it as attached."""
    parts = getattr(model, TASK_PARTS, None)
    if parts is None:
        parts = nn.ModuleDict()
        model.add_module(TASK_PARTS, parts)
    parts[name] = module
    return parts[name]


__all__ = ["attach_part"]
