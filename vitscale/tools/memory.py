"""Memory per rank of a training layout, estimated from the model config (no allocation).

Per rank, with ``P`` parameters of which ``P_tp`` live in tensor-parallel matmuls:

- sharded parameter count ``P_rank = (P_tp / tp + (P - P_tp)) / dp_shard``
- master weights fp32 ``4 P_rank``, gradients fp32 ``4 P_rank`` (FSDP2 keeps reduced gradients in the
  parameter dtype), AdamW / LAMB moments ``8 P_rank`` (SGD with momentum ``4 P_rank``)
- with FSDP and a bf16 compute dtype: the all-gathered compute copy and its unsharded gradient for
  the units in flight: ``2 x (param + grad)`` of the largest FSDP unit (a block) in that dtype
- activations per micro-batch image, counted from what autograd saves for backward, times the
  compute dtype's bytes; ``full`` checkpointing keeps only each block's input plus one block's
  activations during its recompute, ``selective`` keeps the matmul / attention outputs and
  recomputes LayerNorms and activations
- ``overhead``: a fixed allowance (CUDA context, allocator caching, comm buffers: 1 GiB on GPU)

``P``, ``P_tp``, the largest unit and the activations come from the model family's memory model
(``FamilySpec.memory``: the ViT's analytic :mod:`vitscale.models.vit.memory`, or the default measured
on the meta device, :mod:`vitscale.models.memory`); whether ``tp`` splits the model, from its
parallel plan's ``check_tp``. The numbers are an estimate for planning; ``tests/unit/test_memory.py``
checks the parameter, gradient and optimizer terms exactly and the activation term against tensors
saved by autograd.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

GIB = 2**30
_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


@dataclass
class MemoryEstimate:
    """Bytes per rank."""

    model: str
    layout: str
    params: int
    """Parameters of the whole model."""
    param_bytes: int
    """fp32 master weights held by this rank (its shard)."""
    grad_bytes: int
    """Gradients held by this rank (its shard, fp32)."""
    optim_bytes: int
    """Optimizer state held by this rank."""
    unsharded_bytes: int
    """FSDP: all-gathered compute copies and unsharded grads of the units in flight."""
    activation_bytes: int
    """Activations autograd holds at the end of forward, one micro-batch."""
    recompute_bytes: int
    """Full activation checkpointing: one block's activations rebuilt during its backward."""
    overhead_bytes: int
    """Fixed allowance (CUDA context, caching, communication buffers)."""
    task_params: int = 0
    """Parameters the task adds (``--task``: heads and teacher of dino, MAE's decoder)."""
    task_bytes: int = 0
    """Their states on this rank: the trained parts' fp32 weights, gradients and optimizer moments, the
    teacher's fp32 weights, each sharded over ``dp_shard`` as the model (the heads not split by TP)."""

    @property
    def total_bytes(self) -> int:
        return (
            self.param_bytes + self.grad_bytes + self.optim_bytes + self.unsharded_bytes
            + self.activation_bytes + self.recompute_bytes + self.overhead_bytes + self.task_bytes
        )  # fmt: skip

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["total_bytes"] = self.total_bytes
        return d

    def table_row(self) -> str:
        g = lambda b: f"{b / GIB:.1f}"  # noqa: E731
        states = self.param_bytes + self.grad_bytes + self.optim_bytes + self.task_bytes
        other = self.activation_bytes + self.recompute_bytes + self.unsharded_bytes + self.overhead_bytes
        return f"{g(states)} + {g(other)} = {g(self.total_bytes)}"


def _family_cfg(model: Any, overrides: dict | None = None):
    """(label, family, variant config) of a registered name, a variant config or a model."""
    from vitscale.models.registry import family_of, resolve_model

    if isinstance(model, str):
        resolved = resolve_model(model, **(overrides or {}))
        return model, resolved.family, resolved.cfg
    cfg = model if dataclasses.is_dataclass(model) else model.cfg
    return type(model).__name__, family_of(model), cfg


def estimate(
    model: Any,
    *,
    dp_replicate: int = 1,
    dp_shard: int = 1,
    tp: int = 1,
    micro_batch: int = 32,
    param_dtype: str | torch.dtype | None = "bf16",
    ac: str = "none",
    optimizer: str = "adamw",
    img_size: int | None = None,
    overhead_gib: float | None = None,
    overrides: dict | None = None,
    task: str | None = None,
    task_cfg: Any = None,
) -> MemoryEstimate:
    """Estimated bytes per rank to train ``model`` (a registered name, a config or a model).

    ``micro_batch``: images per rank per micro-step. ``param_dtype``: the compute dtype (bf16 with
    FSDP's MixedPrecisionPolicy or autocast; fp32). ``ac``: none | full | selective (all blocks).
    The model's family gives the parameter and activation counts (its memory model) and says
    whether ``tp`` splits it (its parallel plan's ``check_tp``). ``task``: a task's name (``train.task``)
    counts the parameters its training module adds (:meth:`vitscale.tasks.Task.parts_on_meta`: the
    heads, a teacher, a decoder; ``task_cfg`` its config group, None for its defaults); their activations
    are not counted (a teacher runs without autograd).
    """
    from vitscale.distributed.fsdp import to_dtype
    from vitscale.registry import TASKS

    name, family, cfg = _family_cfg(model, overrides)
    if img_size:
        cfg = cfg.with_image_size(img_size)
    plan = family.plan()
    problems = plan.check_tp(cfg, tp) if tp > 1 else []
    if problems:
        raise ValueError(f"{name}: tp={tp} does not split the model: {'; '.join(problems)}")
    memory = family.memory_model()
    meta = family.model_cls(cfg, device="meta")
    P, P_tp, P_block = memory.param_counts(meta, plan)
    act_elems, recompute_elems = memory.activation_elems(meta, plan, tp, ac)
    compute = to_dtype(param_dtype, torch.float32)
    cb = _BYTES[compute]
    fsdp = dp_replicate * dp_shard * tp > 1
    p_rank = (P_tp / tp + (P - P_tp)) / dp_shard
    param_bytes = int(4 * p_rank)
    grad_bytes = int(4 * p_rank)
    optim_bytes = int({"adamw": 8, "adam": 8, "lamb": 8, "sgd": 4}[optimizer] * p_rank)
    unsharded = 0
    if fsdp and (dp_shard > 1 or cb != 4):
        unit = P_block / tp
        unsharded = int(2 * 2 * unit * cb)  # (params + grads) of the current and the prefetched unit
    activation_bytes = int(act_elems * micro_batch * cb)
    recompute_bytes = int(recompute_elems * micro_batch * cb)
    trained = held = 0
    if task:  # the task's parts (vitscale.tasks.base.Task.parts_on_meta): trained, or held (a teacher)
        task_cls = TASKS.get(task)
        for name, part in task_cls.parts_on_meta(task_cfg, meta).items():
            n = sum(q.numel() for q in part.parameters())
            held, trained = (held + n, trained) if name in task_cls.held_parts else (held, trained + n)
    per = {"adamw": 8, "adam": 8, "lamb": 8, "sgd": 4}[optimizer]
    held_rank = (p_rank + (held - P) / dp_shard) if held else 0  # the teacher's backbone sharded as the model
    task_bytes = int((8 + per) * trained / dp_shard + 4 * held_rank)
    if overhead_gib is None:
        overhead_gib = 1.0 if compute != torch.float32 else 0.0
    layout = f"dp_replicate={dp_replicate} dp_shard={dp_shard} tp={tp} micro_batch={micro_batch} ac={ac} {compute}"
    layout += f" task={task}" if task else ""
    return MemoryEstimate(
        model=name, layout=layout, params=int(P), param_bytes=param_bytes, grad_bytes=grad_bytes,
        optim_bytes=optim_bytes, unsharded_bytes=unsharded, activation_bytes=activation_bytes,
        recompute_bytes=recompute_bytes,
        overhead_bytes=int(overhead_gib * GIB), task_params=int(trained + held), task_bytes=task_bytes,
    )  # fmt: skip


# The layouts of the memory table in docs/distributed.md: (label, dp_replicate, dp_shard, tp).
TABLE_LAYOUTS = (
    ("1 GPU", 1, 1, 1),
    ("FSDP 8", 1, 8, 1),
    ("FSDP 64", 1, 64, 1),
    ("FSDP 8 x TP 8", 1, 8, 8),
    ("HSDP 8x8 x TP 8", 8, 8, 8),
)


H100_GIB = 81559 / 1024  # an H100 80GB's memory as CUDA reports it (81,559 MiB)
RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"  # in a source checkout


def largest_batch(model: Any, gpu_gib: float = H100_GIB, ac: str = "none", param_dtype="bf16", **kw) -> int:
    """The largest micro-batch whose estimated training memory fits one GPU of ``gpu_gib`` (states
    and the allowance are fixed, activations grow linearly with the batch)."""
    fixed = estimate(model, micro_batch=0, ac=ac, param_dtype=param_dtype, **kw).total_bytes
    per_image = estimate(model, micro_batch=1, ac=ac, param_dtype=param_dtype, **kw).total_bytes - fixed
    return max(int((gpu_gib * GIB - fixed) // per_image), 0)


def measured_largest_batches(results_dir: Path | str = RESULTS_DIR) -> dict[str, Any] | None:
    """What ``benchmarks/max_batch.py`` measured, from ``max_batch*_<gpu>_<yyyymm>.json`` in
    ``results_dir`` (a newer month's figure replaces an older one): ``{"file", "device", "gpu_gib",
    "batches": {(model, ac): "largest batch"}}`` (``">= N"`` where the search stopped at its limit);
    None if there is none."""
    files = sorted(Path(results_dir).glob("max_batch*.json"), key=lambda f: (f.stem.rsplit("_", 1)[-1], f.name))
    if not files:
        return None
    batches: dict[tuple[str, str], str] = {}
    for f in files:
        data = json.loads(f.read_text())
        for r in data["results"]:
            batches[(r["model"], r["ac"])] = f"{'>= ' if r.get('reached_limit') else ''}{int(r['max_batch'])}"
    gib = float(data["gpu_gib"]) if data.get("gpu_gib") else None
    names = ", ".join(f.name for f in files)
    return {"file": names, "device": data["device"], "gpu_gib": gib, "batches": batches}


def memory_table(
    models, micro_batch: int = 32, ac: str = "none", param_dtype="bf16", gpu_gib: float | None = None,
    measured: dict[str, Any] | None = None,
) -> str:  # fmt: skip
    """A markdown table: per-rank GiB (states + activations = total) for each model and layout, and
    the largest batch on one GPU: the estimate and, from ``measured`` (see
    :func:`measured_largest_batches`), the measured one, or "unmeasured"."""
    gpu_gib = gpu_gib or (measured or {}).get("gpu_gib") or H100_GIB
    largest = f"largest batch, 1 GPU of {gpu_gib:.1f} GiB, ac={ac}: estimate / measured"
    head = "| model | params | " + " | ".join(lab for lab, *_ in TABLE_LAYOUTS) + f" | {largest} |"
    lines = [head, "|" + "---|" * (len(TABLE_LAYOUTS) + 3)]
    for m in models:
        cells = []
        for _, r, s, t in TABLE_LAYOUTS:
            try:
                e = estimate(m, dp_replicate=r, dp_shard=s, tp=t, micro_batch=micro_batch, ac=ac, param_dtype=param_dtype)
                cells.append(e.table_row())
            except ValueError:
                cells.append("n/a")
        params = estimate(m, micro_batch=1).params
        est = largest_batch(m, gpu_gib, ac, param_dtype)
        got = (measured or {}).get("batches", {}).get((m, ac))
        cells.append(f"{est} / {got if got is not None else 'unmeasured'}")
        lines.append(f"| {m} | {params / 1e6:,.0f}M | " + " | ".join(cells) + " |")
    if measured:
        lines.append(f"\nmeasured: {measured['file']} ({measured['device']})")
    return "\n".join(lines)


__all__ = [
    "MemoryEstimate",
    "TABLE_LAYOUTS",
    "estimate",
    "largest_batch",
    "measured_largest_batches",
    "memory_table",
]
