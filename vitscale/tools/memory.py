"""Memory per rank of a training layout, estimated from the model config (no allocation).

Per rank, with ``P`` parameters of which ``P_tp`` live in tensor-parallel matmuls:

- sharded parameter count ``P_rank = (P_tp / tp + (P - P_tp)) / dp_shard``
- master weights fp32 ``4 P_rank``, gradients fp32 ``4 P_rank`` (FSDP2 keeps reduced gradients in the
  parameter dtype), AdamW moments ``8 P_rank`` (SGD with momentum ``4 P_rank``)
- with FSDP and a bf16 compute dtype: the all-gathered compute copy and its unsharded gradient for
  the units in flight: ``2 x (param + grad)`` of the largest FSDP unit (a block) in that dtype
- activations per micro-batch image, counted from what autograd saves for backward
  (see :func:`block_activation_elems`), times the compute dtype's bytes; ``full`` checkpointing
  keeps only each block's input plus one block's activations during its recompute, ``selective``
  keeps the matmul / attention outputs and recomputes LayerNorms and activations
- ``overhead``: a fixed allowance (CUDA context, allocator caching, comm buffers: 1 GiB on GPU)

The numbers are an estimate for planning; ``tests/unit/test_memory.py`` checks the parameter,
gradient and optimizer terms exactly and the activation term against tensors saved by autograd.
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

    @property
    def total_bytes(self) -> int:
        return (
            self.param_bytes + self.grad_bytes + self.optim_bytes + self.unsharded_bytes
            + self.activation_bytes + self.recompute_bytes + self.overhead_bytes
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
        states = self.param_bytes + self.grad_bytes + self.optim_bytes
        other = self.activation_bytes + self.recompute_bytes + self.unsharded_bytes + self.overhead_bytes
        return f"{g(states)} + {g(other)} = {g(self.total_bytes)}"


def _model_cfg(model: Any, overrides: dict | None = None):
    if isinstance(model, str):
        from vitscale.models.registry import get_model_config

        return model, get_model_config(model, **(overrides or {}))
    if dataclasses.is_dataclass(model):
        return type(model).__name__, model
    return type(model).__name__, model.cfg


def _vision_cfg(cfg):
    """The ViT config inside ``cfg`` (CLIP's vision tower, or ``cfg`` itself)."""
    from vitscale.models.clip.configs import CLIPConfig
    from vitscale.models.vit.configs import ViTConfig

    if isinstance(cfg, ViTConfig):
        return cfg
    if isinstance(cfg, CLIPConfig):
        return cfg.vision
    raise TypeError(f"no ViT config in {type(cfg).__name__}: the estimate covers ViT and CLIP models")


def param_counts(name: str, cfg) -> tuple[int, int, int]:
    """(all parameters, parameters in TP-sharded matmuls, parameters of the largest block)."""
    from vitscale.models.registry import get_family

    family = get_family(name) if isinstance(name, str) else None
    with torch.device("meta"):
        model = family.model_cls(cfg, device="meta") if family else None
    if model is None:
        raise TypeError("pass a registered model name or a model")
    return _counts(model)


def _counts(model) -> tuple[int, int, int]:
    from vitscale.models.vit.model import Block, ParallelBlock, VisionTransformer

    total = sum(p.numel() for p in model.parameters())
    tp = 0
    biggest = 0
    for m in model.modules():
        if isinstance(m, (Block, ParallelBlock)):
            n = sum(p.numel() for p in m.parameters())
            biggest = max(biggest, n)
            # everything but the norms / LayerScale of a block is sharded by TP
            tp += n - sum(p.numel() for mm in m.modules() if isinstance(mm, (torch.nn.LayerNorm, torch.nn.RMSNorm)) for p in mm.parameters())
            tp -= sum(p.numel() for n_, p in m.named_parameters() if n_.startswith(("ls", "ls1", "ls2")))
    pool = model.attn_pool if isinstance(model, VisionTransformer) else None  # (a CLIP's stays in its root)
    if pool is not None:
        for lin in (pool.q, pool.kv, pool.proj, pool.mlp.fc1, pool.mlp.fc2):
            tp += sum(p.numel() for p in lin.parameters())
        biggest = max(biggest, sum(p.numel() for p in pool.parameters()))
    return total, tp, biggest


def block_activation_elems(cfg, tokens: int, tp: int = 1, ac: str = "none") -> float:
    """Elements autograd saves per image for one block (checked against autograd's saved tensors).

    Standard block, per token: LayerNorm inputs ``2D`` (sequence-sharded under TP: ``/tp``),
    LayerNorm outputs ``2D`` (the all-gathered matmul inputs: full), the QKV output and the
    attention output ``4D / tp``, fc1 and activation outputs ``2F / tp``; QK-norm adds the
    normalised q and k, ``2D / tp``. ViT-22B parallel block: LayerNorm input ``D / tp`` and output
    ``D``, then ``(5D + 3F) / tp`` (in_proj output, attention output, the MLP pre-activation and
    the concatenated out_proj input), ``+ 2D / tp`` with QK-norm.
    ``selective``: the block input, the matmul and attention outputs are kept, LayerNorms and
    activations are recomputed.
    """
    D, F = cfg.hidden_size, cfg.ffn_hidden_size
    qk = 2 * D if cfg.qk_norm else 0
    if cfg.parallel_block:
        none = D / tp + D + (5 * D + 3 * F + qk) / tp
        selective = D / tp + (3 * D + F + D + D) / tp  # input, in_proj out, attention out, out_proj out
    else:
        none = 2 * D / tp + 2 * D + (4 * D + 2 * F + qk) / tp
        selective = D / tp + (3 * D + D + D + F + D) / tp  # input, qkv, attention, proj, fc1, fc2 outputs
    return tokens * (min(selective, none) if ac == "selective" else none)


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
) -> MemoryEstimate:
    """Estimated bytes per rank to train ``model`` (a registered name, a config or a model).

    ``micro_batch``: images per rank per micro-step. ``param_dtype``: the compute dtype (bf16 with
    FSDP's MixedPrecisionPolicy or autocast; fp32). ``ac``: none | full | selective (all blocks).
    """
    from vitscale.distributed.fsdp import to_dtype

    name, cfg = _model_cfg(model, overrides)
    vcfg = _vision_cfg(cfg)
    if img_size:
        vcfg = vcfg.with_image_size(img_size)
        if vcfg is not cfg and cfg is _vision_cfg(cfg):
            cfg = vcfg
    if isinstance(model, str) or dataclasses.is_dataclass(model):
        P, P_tp, P_block = param_counts(name, cfg) if isinstance(model, str) else _counts_from_cfg(cfg)
    else:
        P, P_tp, P_block = _counts(model)
    if tp > 1:
        for what, n in (("num_attention_heads", vcfg.num_attention_heads), ("ffn_hidden_size", vcfg.ffn_hidden_size)):
            if n % tp:
                raise ValueError(f"{name}: {what}={n} is not divisible by tp={tp}")
    compute = to_dtype(param_dtype, torch.float32)
    cb = _BYTES[compute]
    fsdp = dp_replicate * dp_shard * tp > 1
    p_rank = (P_tp / tp + (P - P_tp)) / dp_shard
    param_bytes = int(4 * p_rank)
    grad_bytes = int(4 * p_rank)
    optim_bytes = int({"adamw": 8, "adam": 8, "sgd": 4}[optimizer] * p_rank)
    unsharded = 0
    if fsdp and (dp_shard > 1 or cb != 4):
        unit = P_block / tp
        unsharded = int(2 * 2 * unit * cb)  # (params + grads) of the current and the prefetched unit
    tokens = vcfg.num_patches + vcfg.class_token_length
    L = vcfg.num_layers
    per_block = block_activation_elems(vcfg, tokens, tp, ac)
    D = vcfg.hidden_size
    recompute_elems = 0.0
    if ac == "full":
        act_elems = L * tokens * D / tp  # each block's input only
        recompute_elems = per_block
    else:
        act_elems = L * per_block
    # around the blocks: the input image (patch-embedding conv), the final LayerNorm's input and
    # output; the pooled features and logits are negligible
    act_elems += 2 * tokens * D + vcfg.num_channels * vcfg.img_h * vcfg.img_w
    activation_bytes = int(act_elems * micro_batch * cb)
    recompute_bytes = int(recompute_elems * micro_batch * cb)
    if overhead_gib is None:
        overhead_gib = 1.0 if compute != torch.float32 else 0.0
    layout = f"dp_replicate={dp_replicate} dp_shard={dp_shard} tp={tp} micro_batch={micro_batch} ac={ac} {compute}"
    return MemoryEstimate(
        model=name, layout=layout, params=int(P), param_bytes=param_bytes, grad_bytes=grad_bytes,
        optim_bytes=optim_bytes, unsharded_bytes=unsharded, activation_bytes=activation_bytes,
        recompute_bytes=recompute_bytes,
        overhead_bytes=int(overhead_gib * GIB),
    )  # fmt: skip


def _counts_from_cfg(cfg) -> tuple[int, int, int]:
    from vitscale.models.vit.model import VisionTransformer

    with torch.device("meta"):
        return _counts(VisionTransformer(_vision_cfg(cfg), device="meta"))


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
    "block_activation_elems",
    "estimate",
    "largest_batch",
    "measured_largest_batches",
    "memory_table",
]
