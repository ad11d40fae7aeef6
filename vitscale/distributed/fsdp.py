"""FSDP2 (``fully_shard``) helpers: per-block and root sharding with a MixedPrecisionPolicy.

One code path covers every data-parallel layout, because FSDP2 takes a 1-D mesh (FSDP) or a 2-D
``(replicate, shard)`` mesh (HSDP):

- ``dp_shard > 1``                 -> FSDP over ``dp_shard`` (params, grads, optimizer state sharded:
                                      NeMo's "distributed optimizer" / ZeRO-3).
- ``dp_replicate > 1, dp_shard > 1`` -> HSDP: sharded inside a group, replicated across groups.
- ``dp_replicate > 1, dp_shard == 1`` -> plain data parallel: HSDP with a shard group of one, i.e.
                                      parameters whole on every rank and gradients all-reduced.
  Chosen over ``torch.distributed._composable.replicate`` (DDP) because it is the same code path
  and the same DTensor state-dict format as FSDP (so checkpoints reshard between DP, FSDP and TP
  without special cases), composes with TP on a 2-D mesh, applies the same MixedPrecisionPolicy,
  and runs on gloo as well as NCCL (covered by tests/distributed).
- ``tp > 1`` alone                 -> still wrapped (shard group of one) so that every parameter is a
                                      DTensor (one optimizer code path) and bf16 O2 applies.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from .config import PrecisionConfig

try:  # torch >= 2.6 exports FSDP2 here
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
except ImportError:  # pragma: no cover - torch < 2.6
    from torch.distributed._composable.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
}  # fmt: skip


def to_dtype(value, default: torch.dtype | None = None) -> torch.dtype | None:
    """``"bf16"`` / ``"float32"`` / a torch.dtype / None (-> ``default``) -> torch.dtype."""
    if value is None or value == "auto":
        return default
    if isinstance(value, torch.dtype):
        return value
    try:
        return _DTYPES[str(value).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {value!r}: use one of {sorted(_DTYPES)}") from None


@dataclass(frozen=True)
class Precision:
    """The numerics of a run on its device (a resolved :class:`PrecisionConfig`)."""

    param_dtype: torch.dtype
    """Compute dtype of the parameters FSDP2 all-gathers (its MixedPrecisionPolicy)."""
    reduce_dtype: torch.dtype
    """Dtype of the gradient reduction."""
    autocast: torch.dtype | None
    """Dtype of ``torch.autocast`` around the forward pass; None = no autocast."""


_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}


def resolve_precision(precision: PrecisionConfig, device: torch.device | str) -> Precision:
    """``precision`` on ``device``: bf16 compute and bf16 autocast on GPU, fp32 and no autocast on CPU,
    unless set; gradients reduced in fp32 unless set."""
    cuda = torch.device(device).type == "cuda"
    param = to_dtype(precision.param_dtype, torch.bfloat16 if cuda else torch.float32)
    reduce = to_dtype(precision.reduce_dtype, torch.float32)
    mode = precision.autocast
    if mode == "auto":
        mode = "bf16" if cuda else "none"
    if mode not in _AUTOCAST:
        raise ValueError(f"precision.autocast must be auto, bf16, fp16 or none, got {mode!r}")
    return Precision(param, reduce, _AUTOCAST[mode])


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``dtype`` (fp32 master weights, as in mixed-precision training), or
    nothing for None (a resolved ``precision.autocast``: :func:`vitscale.distributed.fsdp.resolve_precision`)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def autocast_factory(device: torch.device, dtype: torch.dtype | None) -> Callable[[], contextlib.AbstractContextManager]:
    """A zero-argument factory of :func:`autocast` contexts (what tasks call around their forward)."""
    if dtype is None:
        return contextlib.nullcontext
    return functools.partial(autocast, device, dtype)


def mixed_precision_policy(param_dtype: torch.dtype, reduce_dtype: torch.dtype = torch.float32):
    """bf16 compute on an all-gathered bf16 copy, fp32 master weights kept sharded, fp32 gradient
    reduction: NeMo's "BF16 O2" (``megatron_amp_O2``). With fp32 params it is a no-op policy."""
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=True)


def dp_mesh_for(parallel_dims):
    """The mesh FSDP2 shards over: 1-D ``dp_shard`` when there is no replication, else 2-D HSDP."""
    if parallel_dims.dp_replicate == 1:
        return parallel_dims.mesh["dp_shard"]
    return parallel_dims.mesh["dp_replicate", "dp_shard"]


def fsdp_runs_on(device_type: str) -> bool:
    """Whether this torch's FSDP2 runs on ``device_type``. torch 2.6's ``fully_shard`` records events
    on the device's current stream, which CPU streams there cannot do ("'Stream' object has no
    attribute 'record_event'"), so CPU / gloo FSDP2 needs a newer torch (checked here: 2.11, 2.15);
    on CUDA it runs on 2.6."""
    return device_type != "cpu" or hasattr(torch.cpu.Stream, "record_event")


def apply_fsdp(
    model: nn.Module,
    blocks: Iterable[nn.Module],
    dp_mesh,
    param_dtype: torch.dtype = torch.float32,
    reduce_dtype: torch.dtype = torch.float32,
    reshard_after_forward: bool = True,
    extra_units: Iterable[nn.Module] = (),
) -> nn.Module:
    """``fully_shard`` each block (one all-gather per block), each of ``extra_units`` (e.g. a large
    head), then the root (everything left: embeddings, norms, classifier).

    The last block is not resharded after forward: backward needs it immediately.
    """
    mp = mixed_precision_policy(param_dtype, reduce_dtype)
    blocks = list(blocks)
    for i, block in enumerate(blocks):
        fully_shard(
            block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward and i < len(blocks) - 1
        )
    for unit in extra_units:
        if unit is not None:
            fully_shard(unit, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return model


__all__ = [
    "FSDPModule",
    "MixedPrecisionPolicy",
    "apply_fsdp",
    "autocast",
    "autocast_factory",
    "dp_mesh_for",
    "fsdp_runs_on",
    "fully_shard",
    "mixed_precision_policy",
    "Precision",
    "resolve_precision",
    "to_dtype",
]
