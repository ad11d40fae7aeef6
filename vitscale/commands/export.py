"""``vitscale export RUN_DIR_OR_WEIGHTS --format onnx|torch-export``: graphs for serving, checked."""

from __future__ import annotations

import argparse
import sys

from ..registry import COMMANDS
from . import HelpFormatter, add_shell_flag


def _batch(text: str):
    if text == "dynamic":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'dynamic' or a batch size, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"batch size must be positive, got {value}")
    return value


HELP = "export trained weights to ONNX or torch.export (+ export.json), checked against eager"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export",
        help=HELP,
        description="Export the graphs the model's family serves — a classifier (ViT, VOLO, any family by default):\n"
        "one graph, images -> logits; a CLIP: two, images -> embedding, token ids -> embedding — with export.json\n"
        "beside them: preprocessing constants, class names, the family's tokenizer settings (CLIP), each file's\n"
        "SHA-256 and the check run right after writing\n"
        "(ONNX Runtime on the CPU, or the loaded torch.export program, vs the eager model on real images and\n"
        "captions: 1e-4 relative). See docs/using.md.",
        formatter_class=HelpFormatter,
        epilog="Example: vitscale export runs/digits_vit --format onnx --batch dynamic\n"
        "         vitscale export runs/digits_clip --format torch-export\n"
        "         vitscale export weights.safetensors --config digits_vit --out /tmp/served\n"
        "         vitscale export runs/digits_dino --teacher --format torch-export",
    )
    p.add_argument("source", metavar="RUN_DIR_OR_WEIGHTS", help="a run folder or a .safetensors export")
    p.add_argument("--format", dest="fmt", choices=("onnx", "torch-export"), default="onnx",
                   help="onnx (needs: pip install 'vitscale[export]') or torch-export (.pt2); default onnx")
    p.add_argument("--batch", type=_batch, default=1, metavar="dynamic|N",
                   help="'dynamic' (any batch size) or a fixed batch size; default 1")
    p.add_argument("--out", help="output folder; default RUN_DIR/export/<format>")
    p.add_argument("--ema", action="store_true", help="export the run's EMA weights (model_ema.safetensors)")
    p.add_argument("--teacher", action="store_true",
                   help="export the teacher weight set of a run whose task keeps one (a self-distillation run's EMA teacher "
                   "backbone; from its newest checkpoint)")
    p.add_argument("--config", help="YAML path or built-in config name for the preprocessing / tokenizer "
                   "settings; default the config.yaml beside the weights")  # fmt: skip
    add_shell_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from vitscale.export import default_out_dir, export
    from vitscale.export.graphs import MissingDependency

    try:  # a missing path, a bad file or a config error: one line and its exit code (vitscale.cli)
        info = export(args.source, args.fmt, out=args.out, batch=args.batch, ema=args.ema, config=args.config,
                      allow_shell=args.allow_shell, teacher=args.teacher)
    except (MissingDependency, RuntimeError) as e:  # an optional package missing, the exporter failing
        print(f"vitscale export: {e}", file=sys.stderr)
        return 1
    out = args.out or default_out_dir(args.source, args.fmt, args.ema, args.teacher)
    files = ", ".join(g["file"] for g in info["graphs"].values())
    if not info["check"]["passed"]:
        print(f"vitscale export: the check FAILED (max relative error {info['check']['max_rel_error']:.2e}); "
              f"see {out}/export.json", file=sys.stderr)  # fmt: skip
        return 1
    print(f"wrote {files} and export.json to {out}")
    return 0


COMMANDS.register("export", sys.modules[__name__])
