"""``vitscale train CONFIG [key=value ...]``: train a model from a YAML recipe plus dotted overrides."""

from __future__ import annotations

import sys

from ..registry import COMMANDS
from . import HelpFormatter, add_overrides, add_shell_flag

EPILOG = """\
CONFIG is a YAML file or a built-in name (digits_vit, imagenet_vit_b16, ...). Overrides are dotted
keys, e.g.:
  vitscale train digits_vit train.max_steps=200 optim.lr=1e-3 model.hidden_size=128
  torchrun --nproc-per-node 8 -m vitscale train imagenet_vit_b16 data.train_path=/data/imagenet/train
A run resumes from the newest checkpoint in train.output_dir, with the same config (a changed one is
refused, listing the changes; checkpoint.allow_changes=KEY,... accepts them, e.g. train.max_steps to
train longer). A finished run started again says so and trains nothing. One run per folder: a second
run on a folder in use is refused.
"""


HELP = "train a model (config + dotted overrides)"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help=HELP,
        description="Train a model. Writes config.yaml, train.log (what the run printed), metrics.jsonl, "
        "summary.json (results, versions, devices, layout, times, command line), checkpoints/, "
        "model.safetensors, report.html and tb/ (TensorBoard, when installed) into train.output_dir, and "
        "ends with a short summary: the final metrics, where the outputs are and the commands to run next.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    p.add_argument("config", help="YAML path or built-in config name")
    add_overrides(p)
    add_shell_flag(p)
    p.add_argument("--print-config", action="store_true", help="print the resolved config (as the run's "
                   "config.yaml will hold it) and exit")
    p.add_argument("--json", action="store_true", help="end with summary.json's contents as JSON instead of the "
                   "short summary (for scripts)")  # fmt: skip
    p.set_defaults(func=run)


def run(args) -> int:
    from vitscale.config import dump_config, load_config

    notes: list[str] = []  # e.g. the model overrides a new model.name dropped
    cfg = load_config(args.config, args.overrides, notes=notes, allow_shell=args.allow_shell)  # a config error: one line, exit code 2 (vitscale.cli)
    if args.print_config:
        for note in notes:
            print(f"# note: {note}")
        print(dump_config(cfg), end="")
        return 0
    from vitscale.train import train

    # an error a person can fix (a damaged checkpoint, a failed save, a setting this machine cannot run
    # such as precision.fp8 without torchao) ends as one or two lines: vitscale.cli
    train(cfg, summary="json" if args.json else "human", notes=notes)  # printed by rank 0, also into train.log
    return 0


COMMANDS.register("train", sys.modules[__name__])
