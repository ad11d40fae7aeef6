"""``vitscale convert CHECKPOINT OUT``: consolidate a DCP checkpoint into one safetensors file."""

from __future__ import annotations

import sys

from ..registry import COMMANDS
from . import HelpFormatter

EPILOG = """\
CHECKPOINT is a step folder (runs/x/checkpoints/step_00001000), a checkpoints/ folder or a run
folder (the newest step). The checkpoint may come from any number of ranks and any layout (FSDP,
TP, HSDP); conversion runs on one process. The checkpoint's files are verified against their
checksums first (a run folder: its newest intact checkpoint); each output file carries a checksum in
its safetensors metadata. Examples:
  vitscale convert runs/vit_b16 vit_b16.safetensors
  vitscale convert runs/vit_22b/checkpoints/step_00100000 out/vit_22b.safetensors --dtype bf16 --max-shard-size 5GB
  vitscale convert runs/vit_b16 vit_b16_ema.safetensors --key ema
  vitscale convert runs/digits_dino teacher.safetensors --key teacher
  vitscale convert runs/dino_vits14 teacher_timm.safetensors --key teacher --to timm
  vitscale convert runs/dino_vits14 dinov2_teacher/ --key teacher --to transformers
--key: model, ema, or a weight set the run's task keeps (a self-distillation run's EMA teacher
backbone: teacher; `vitscale convert RUN OUT --key ?` lists a run's). --to timm: in
timm's names and layouts, loading with strict=True into timm's model of the same architecture (the
header's library_model names timm's registered one; the run's overrides, e.g. img_size, are yours to give).
"""


HELP = "consolidate a distributed (DCP) checkpoint into safetensors"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "convert",
        help=HELP,
        description="Consolidate a torch.distributed.checkpoint training checkpoint (one shard per rank) "
        "into a single safetensors file (or several with an index for very large models).",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    p.add_argument("checkpoint", help="step folder, checkpoints/ folder or run folder")
    p.add_argument("out", help="output .safetensors path")
    p.add_argument("--key", default="model",
                   help="which weights: model, ema, or a weight set of the run's task (e.g. teacher); default model")
    p.add_argument("--to", default="vitscale", choices=["vitscale", "timm", "transformers"],
                   help="the file's layout: vitscale's (default) or timm's (one file: no --max-shard-size); transformers: "
                   "OUT is a snapshot folder (config.json + model.safetensors) for transformers' from_pretrained")
    p.add_argument("--dtype", default=None, help="cast floating tensors (bf16, fp16, fp32); default: as saved")
    p.add_argument("--max-shard-size", default=None, help="split into files of at most this size (e.g. 5GB)")
    p.set_defaults(func=run)


def run(args) -> int:
    from vitscale.checkpoint.consolidate import consolidate, parse_size
    from vitscale.distributed.fsdp import to_dtype

    if args.to != "vitscale" and args.max_shard_size:  # a refusal: one line (vitscale.cli)
        from vitscale.errors import ConfigError

        raise ConfigError(f"--to {args.to} writes one file: drop --max-shard-size")
    from vitscale.run.weight_sets import weight_set_prefix

    prefix = weight_set_prefix(args.checkpoint, args.key)  # a task's own weight set: asked of the run's task
    if args.to == "transformers":  # OUT: a snapshot folder (vitscale/interop/transformers.py), written once checked
        import tempfile
        from pathlib import Path

        from vitscale.interop.transformers import write_transformers_file

        with tempfile.TemporaryDirectory() as tmp:
            files = consolidate(args.checkpoint, Path(tmp) / "model.safetensors", key=args.key, dtype=to_dtype(args.dtype),
                                prefix=prefix)  # fmt: skip
            print(write_transformers_file(files[0], args.out))
        return 0
    files = consolidate(  # errors: one line (vitscale.cli)
        args.checkpoint, args.out, key=args.key, dtype=to_dtype(args.dtype), max_shard_bytes=parse_size(args.max_shard_size),
        prefix=prefix,
    )
    if args.to != "vitscale":
        from vitscale.interop.library_file import write_library_weights

        files = [write_library_weights(files[0], args.out, args.to)]  # rewritten in place, checked strictly
    for f in files:
        print(f)
    return 0


COMMANDS.register("convert", sys.modules[__name__])
