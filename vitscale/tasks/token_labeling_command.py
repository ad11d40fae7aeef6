"""``vitscale label-tokens CONFIG teacher.checkpoint=... [key=value ...] OUT``: dense token labels from a teacher.

Runs the teacher over every image of the dataset in CONFIG (uncropped: data.crop_pct=1, no
augmentation) and stores per image its top-k class scores at every token location, plus its
class-token top-k, in OUT (the format is described in vitscale/data/token_labels.py). A VOLO
teacher's locations are its aux head's outputs; a ViT teacher's come from its own classifier applied
to every patch token (pre-logits features -> head): train such a teacher with model.pool=avg (its
classifier is trained on the mean patch token, so per-token outputs are class-activation maps; a
class-token ViT's patch tokens are never trained to classify).

The summary reports the teacher's class top-1 and the fraction of locations whose top class is
the image label (teacher_token_top1). Train a student on them with train.task=token_labeling
token_label.path=OUT.

Under torchrun the teacher takes the parallel.* layout (FSDP, TP) and the ranks share the batches of
each split, writing into the same files: the output is the one-process output (docs/volo.md).
"""

# Token labeling's own command, registered as every command is (vitscale.registry.COMMANDS: its built-in
# table names this module among the commands the tasks bring). It is of the command layer (parsing and
# printing; the job is vitscale.tasks.token_labeling_job), imports nothing heavy at its top (vitscale
# --help imports it for HELP) and nothing in the task imports it.

from __future__ import annotations

import json
import sys

from vitscale.commands import HelpFormatter, add_overrides, add_shell_flag
from vitscale.registry import COMMANDS

EPILOG = """\
Examples:
  vitscale label-tokens digits_vit teacher.checkpoint=runs/digits_vit runs/digits_token_labels
  vitscale label-tokens imagenet_volo_d1 teacher.timm=volo_d5_224 teacher.checkpoint=d5.pth.tar \\
      data.train_path=/data/imagenet/train teacher.topk=5 /data/imagenet_token_labels
  torchrun --nproc-per-node 8 -m vitscale label-tokens imagenet_volo_d1 teacher.timm=volo_d5_224 ...
CONFIG supplies the data (and, without teacher.model / teacher.timm, the teacher architecture).
"""


HELP = "store a teacher's dense top-k token labels for token labeling"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "label-tokens",
        help=HELP,
        description=__doc__.split("\n\n", 1)[1],
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    p.add_argument("config", help="YAML path or built-in config name (data + teacher settings)")
    add_overrides(p, "args", nargs="+", metavar="key=value | OUT", help="dotted overrides, then the output folder")
    add_shell_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import os

    from vitscale.config import load_config

    from .token_labeling_job import label_tokens

    overrides = [a for a in args.args if "=" in a]
    outs = [a for a in args.args if "=" not in a]
    if len(outs) != 1:
        print(f"vitscale label-tokens: give exactly one output folder (got {outs or 'none'})", file=sys.stderr)
        return 2
    # the teacher group is token labeling's: its labels are written for a token-labeling run
    cfg = load_config(args.config, ["train.task=token_labeling", *overrides], allow_shell=args.allow_shell)  # errors: one line and the exit code (vitscale.cli)
    summary = label_tokens(cfg, outs[0])
    if int(os.environ.get("RANK", "0")) == 0:  # every rank holds the same summary: rank 0 reports it
        print(json.dumps(summary, indent=1))
    return 0


COMMANDS.register("label-tokens", sys.modules[__name__])
