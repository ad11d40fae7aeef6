"""``vitscale eval CONFIG checkpoint.path=PATH``: top-1 / top-5 of trained weights on the val split."""

from __future__ import annotations

import json
import os
import sys

from ..registry import COMMANDS
from . import HelpFormatter, add_overrides, add_shell_flag

HELP = "evaluate a checkpoint on the val split (top-1 / top-5 / loss)"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval",
        help=HELP,
        description="Evaluate weights on the config's validation data. checkpoint.path may be a run "
        "folder (newest checkpoint, else model.safetensors), a checkpoints/ folder, a step_N folder or a "
        ".safetensors file. Under torchrun the model takes the parallel.* layout (FSDP, TP) and the "
        "ranks share the validation set; the numbers are those of one process (docs/distributed.md).",
        formatter_class=HelpFormatter,
        epilog="Example: vitscale eval digits_vit checkpoint.path=runs/digits_vit\n"
        "         vitscale eval digits_vit checkpoint.path=runs/digits_vit/model.safetensors --ema\n"
        "         vitscale eval runs/digits_vit/config.yaml checkpoint.path=runs/digits_vit eval.probe=linear\n"
        "         vitscale eval runs/digits_vit/config.yaml checkpoint.path=runs/digits_vit eval.probe=fewshot eval.shots=1,5,10\n"
        "         torchrun --nproc-per-node 8 -m vitscale eval runs/vit_b16/config.yaml checkpoint.path=runs/vit_b16",
    )
    p.add_argument("config", help="YAML path or built-in config name (model and data)")
    add_overrides(p)
    add_shell_flag(p)
    p.add_argument("--ema", action="store_true", help="evaluate the EMA weights")
    p.add_argument("--output", help="also write the metrics to this JSON file")
    p.set_defaults(func=run)


def run(args) -> int:
    from vitscale.config import load_config

    cfg = load_config(args.config, args.overrides, allow_shell=args.allow_shell)  # a config error: one line, exit code 2 (vitscale.cli)
    if not cfg.checkpoint.path:  # a refusal: one line, said once under torchrun (vitscale.cli)
        from vitscale.errors import ConfigError

        raise ConfigError("set checkpoint.path=PATH (run folder, step folder or .safetensors)")
    from vitscale.train.evaluate import evaluate_checkpoint
    from vitscale.train.fastpath import sdpa_backend

    with sdpa_backend(cfg.train.sdpa):  # the attention kernels training used
        result = evaluate_checkpoint(cfg, cfg.checkpoint.path, ema=args.ema)  # errors: one line (vitscale.cli)
    if int(os.environ.get("RANK", "0")) != 0:  # every rank holds the same result: rank 0 reports it
        return 0
    text = json.dumps(finite_json(result), indent=1, allow_nan=False)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    return 0


def finite_json(result: dict) -> dict:
    """``result`` with each non-finite number written as null and named under ``"not_finite"``: a bare
    ``NaN`` is not JSON (a reader of the file fails on it)."""
    import math

    bad: list[str] = []

    def clean(v, key):
        if isinstance(v, float) and not math.isfinite(v):
            bad.append(key)
            return None
        if isinstance(v, dict):
            return {k: clean(x, f"{key}.{k}" if key else str(k)) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x, f"{key}[{i}]") for i, x in enumerate(v)]
        return v

    out = clean(result, "")
    if bad:
        out["not_finite"] = bad
    return out


COMMANDS.register("eval", sys.modules[__name__])
