"""Build a registered model for a parallel layout: meta device -> parallelize -> ``to_empty`` -> initialise.

The one model builder of train, eval, label-tokens and the bench (through :func:`vitscale.run.assemble`)
and of the distributed tests. A 22B model never materialises whole on one rank: it is built on the
meta device, its family's plan goes through :func:`vitscale.distributed.parallelize.parallelize`,
and only this rank's shards are allocated (``to_empty``) and initialised
(:func:`vitscale.distributed.init.init_weights`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..distributed.config import ParallelConfig, PrecisionConfig
from ..distributed.init import init_weights
from ..distributed.parallel_dims import ParallelDims
from ..distributed.parallelize import parallelize
from ..models.registry import ResolvedModel, resolve_model


def build_model(
    model: str | ResolvedModel,
    dims: ParallelDims,
    *,
    overrides: dict[str, Any] | None = None,
    parallel: ParallelConfig | None = None,
    precision: PrecisionConfig | None = None,
    compile: bool = False,
    compile_mode: str = "default",
    compile_backend: str = "inductor",
    seed: int = 0,
    init: str | None = "auto",
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """Registered model ``model`` (a variant name, its config with ``overrides``; or a model resolved
    already, :class:`vitscale.models.registry.ResolvedModel`, e.g. :attr:`vitscale.run.Run.resolved`)
    on ``dims.device``, parallelized with ``parallel`` / ``precision`` / per-block ``compile`` (in
    ``compile_mode``, by ``compile_backend``), initialised from ``seed`` by ``init`` (``auto`` | ``reference`` | ``sharded``,
    see :mod:`vitscale.distributed.init`; None = left uninitialised, e.g. an EMA copy that is filled
    from the model)."""
    if isinstance(model, ResolvedModel):
        if overrides:
            raise TypeError("build_model: a resolved model carries its overrides; pass none beside it")
        resolved = model
    else:
        resolved = resolve_model(model, **(overrides or {}))
    def on_meta() -> nn.Module:  # the model without storage; the reference init builds a second one
        return resolved.create(device="meta", dtype=dtype)

    built = on_meta()
    parallelize(
        built, resolved.family.plan(), dims, parallel or ParallelConfig(), precision or PrecisionConfig(),
        compile, compile_mode, compile_backend,
    )  # fmt: skip
    built.to_empty(device=dims.device)
    if init is not None:
        init_weights(built, dims, seed, on_meta, init)
    return built


__all__ = ["build_model"]
