"""``vitscale memory MODEL``: estimated memory per GPU of a training layout (no allocation)."""

from __future__ import annotations

import json
import sys

from ..registry import COMMANDS
from . import HelpFormatter

EPILOG = """\
Examples:
  vitscale memory vit_h14 --dp-shard 8 --micro-batch 32
  vitscale memory vit_22b --dp-shard 64 --tp 8 --micro-batch 8 --ac full
  vitscale memory --table vit_b16 vit_l16 vit_h14 vit_g14 vit_bigg14 vit_22b   (the docs table)
States = fp32 master weights + fp32 gradients + optimizer moments (sharded by FSDP / TP);
the rest = activations of one micro-batch, FSDP's all-gathered units and a 1 GiB allowance on GPU.
"""


HELP = "estimate memory per GPU for a model and parallel layout"


def register(subparsers) -> None:
    from ..config.schema import OptimConfig
    from ..distributed.config import ParallelConfig
    from . import field_choices as _choices

    p = subparsers.add_parser(
        "memory",
        help=HELP,
        description="Estimate the memory per rank of training MODEL under a parallel layout.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    p.add_argument("models", nargs="+", metavar="MODEL", help="registered model name(s)")
    p.add_argument("--dp-replicate", type=int, default=1, help="data-parallel replicas, each holding a whole "
                   "copy of the (sharded) model: HSDP's replicate dimension (default: 1)")
    p.add_argument("--dp-shard", type=int, default=1, help="ranks FSDP shards weights, gradients and "
                   "optimizer states over (default: 1)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per model replica (default: 1)")
    p.add_argument("--micro-batch", type=int, default=32, help="images per rank per micro-step (default: 32)")
    p.add_argument("--dtype", default="bf16", help="compute dtype: bf16 (default) or fp32")
    p.add_argument("--ac", default="none", choices=_choices(ParallelConfig, "activation_checkpointing"), help="activation checkpointing (default: none)")
    p.add_argument("--optimizer", default="adamw", choices=_choices(OptimConfig, "name"),
                   help="optimizer, for its states: two fp32 moments (adamw, adam, lamb) or one (sgd with momentum)")
    p.add_argument("--img-size", type=int, default=None, help="training image side in pixels (default: the "
                   "model's)")
    p.add_argument("--task", default=None, metavar="TASK", help="count what a task's training module adds to the model, "
                   "at its config group's defaults: heads, a teacher, a decoder (a train.task name; default: none)")
    p.add_argument("--table", action="store_true", help="markdown table over the standard layouts, with the "
                   "largest batch on one GPU (estimate / measured)")
    p.add_argument("--gpu-gib", type=float, default=None, help="GPU memory for the largest-batch column "
                   "(default: the measured GPU's, else an H100 80GB's 79.6)")
    p.add_argument("--measured", default=None, metavar="DIR", help="folder of benchmarks/max_batch.py results "
                   "(default: benchmarks/results of this checkout)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from vitscale.tools.memory import GIB, RESULTS_DIR, estimate, measured_largest_batches, memory_table

    try:
        if args.table:
            measured = measured_largest_batches(args.measured or RESULTS_DIR)
            print(memory_table(args.models, micro_batch=args.micro_batch, ac=args.ac, param_dtype=args.dtype,
                               gpu_gib=args.gpu_gib, measured=measured))  # fmt: skip
            return 0
        for name in args.models:
            e = estimate(
                name, dp_replicate=args.dp_replicate, dp_shard=args.dp_shard, tp=args.tp,
                micro_batch=args.micro_batch, param_dtype=args.dtype, ac=args.ac, optimizer=args.optimizer,
                img_size=args.img_size, task=args.task,
            )  # fmt: skip
            if args.json:
                print(json.dumps(e.as_dict()))
                continue
            print(f"{name} ({e.params / 1e6:,.1f}M params), {e.layout}")
            for label, b in (
                ("weights (fp32, this rank's shard)", e.param_bytes),
                ("gradients (fp32)", e.grad_bytes),
                (f"optimizer ({args.optimizer})", e.optim_bytes),
                ("FSDP all-gathered units", e.unsharded_bytes),
                ("activations", e.activation_bytes),
                ("recompute (full AC)", e.recompute_bytes),
                ("overhead allowance", e.overhead_bytes),
                *([(f"{args.task} parts ({e.task_params / 1e6:,.1f}M params)", e.task_bytes)] if args.task else []),
            ):
                print(f"  {label:<36} {b / GIB:8.2f} GiB")
            print(f"  {'total per rank':<36} {e.total_gib:8.2f} GiB")
    except (KeyError, ValueError, TypeError) as err:  # a refusal: one line (vitscale.cli)
        from vitscale.errors import ConfigError

        raise ConfigError(str(err)) from None
    return 0


COMMANDS.register("memory", sys.modules[__name__])
