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

from __future__ import annotations

import dataclasses
import json
import sys
import time

from . import HelpFormatter

EPILOG = """\
Examples:
  vitscale label-tokens digits_vit teacher.checkpoint=runs/digits_vit runs/digits_token_labels
  vitscale label-tokens imagenet_volo_d1 teacher.timm=volo_d5_224 teacher.checkpoint=d5.pth.tar \\
      data.train_path=/data/imagenet/train teacher.topk=5 /data/imagenet_token_labels
  torchrun --nproc-per-node 8 -m vitscale label-tokens imagenet_volo_d1 teacher.timm=volo_d5_224 ...
CONFIG supplies the data (and, without teacher.model / teacher.timm, the teacher architecture).
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "label-tokens",
        help="store a teacher's dense top-k token labels for token labeling",
        description=__doc__.split("\n\n", 1)[1],
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    p.add_argument("config", help="YAML path or built-in config name (data + teacher settings)")
    p.add_argument("args", nargs="+", metavar="key=value | OUT", help="dotted overrides, then the output folder")
    p.set_defaults(func=run)


def teacher_config(cfg, num_classes: int | None = None):
    """The run config of the teacher: its model (``teacher.model`` with ``teacher.overrides``, else the
    config's own model; ``num_classes`` = its checkpoint's head) over the config's data, uncropped
    (``data.crop_pct=1``) and at ``teacher.img_size`` (else the teacher's own size)."""
    from vitscale.config.schema import ModelConfig
    from vitscale.models import get_model_config

    t = cfg.teacher
    name = t.model or cfg.model.name
    overrides = dict(t.overrides if t.model else cfg.model.overrides)
    if num_classes is not None and "num_classes" in {f.name for f in dataclasses.fields(get_model_config(name))}:
        overrides["num_classes"] = num_classes
    data = dataclasses.replace(cfg.data, crop_pct=1.0, img_size=None)
    return dataclasses.replace(cfg, model=ModelConfig(name=name, overrides=overrides), data=data)


def teacher_run(cfg):
    """The assembled run of the teacher (``vitscale.run.assemble``, purpose ``label``), weights loaded."""
    t = cfg.teacher
    if not t.checkpoint:
        raise ValueError("set teacher.checkpoint (a .safetensors file, run folder or checkpoint)")
    from vitscale.run import assemble, head_classes

    if t.timm:
        from vitscale.interop import load_timm_checkpoint

        teacher = load_timm_checkpoint(t.checkpoint, t.timm, **dict(t.overrides))
        return assemble(teacher_config(cfg), "label", model=teacher)
    from vitscale.checkpoint import load_model_weights, read_weights

    sd = read_weights(t.checkpoint, t.weights)
    run = assemble(teacher_config(cfg, head_classes(sd)), "label")
    load_model_weights(run.model, sd, strict=True, source=f"teacher.checkpoint={t.checkpoint}")
    return run


def label_tokens(cfg, out: str) -> dict:
    """Label every split in ``cfg.teacher.splits``; returns a summary (teacher accuracy per split).

    Under torchrun the teacher takes the ``parallel.*`` layout and each data-parallel rank labels
    whole batches of the split (the batches of a one-process run: ``EvalShardSampler``) into the
    same files; every rank returns the summary of the whole split."""
    import torch
    import torch.distributed as dist

    from vitscale.data.token_labels import TokenLabelWriter
    from vitscale.tasks.token_labeling import dense_forward
    from vitscale.train.fastpath import autocast_factory

    t = cfg.teacher
    if cfg.data.format == "webdataset" and cfg.data.webdataset_mode == "stream":
        raise ValueError("label-tokens labels every image by its index: use data.webdataset_mode=index")
    run = teacher_run(cfg)
    teacher, img, C = run.model.eval(), run.img_size, run.model.num_classes
    autocast = autocast_factory(run.device, run.precision.autocast)
    group = run.dims.dp_group()
    summary: dict = {"out": out, "splits": {}}
    for split in t.splits:
        loader = {"train": run.loaders.train, "val": run.loaders.val}.get(split)
        if loader is None:
            raise ValueError(f"the dataset has no {split!r} split")
        n = len(loader.dataset)
        info = {"teacher": t.model or t.timm or cfg.model.name, "teacher_checkpoint": str(t.checkpoint),
                "teacher_img_size": list(img), "dataset": cfg.data.format}  # fmt: skip
        writer = None
        counts = torch.zeros(3, dtype=torch.float64, device=run.device)  # images, class top-1, token top-1
        t0 = time.perf_counter()
        with torch.no_grad():
            for batch in loader:
                with autocast():
                    cls, tok = dense_forward(teacher, batch["image"])
                cls_p, tok_p = cls.float().softmax(-1), tok.float().softmax(-1)
                if writer is None:
                    writer = TokenLabelWriter(out, split, n, tuple(tok.shape[1:3]), min(t.topk, C), C, info,
                                              writes=run.dims.tp_rank == 0)  # fmt: skip
                writer.write(batch["index"], tok_p, cls_p, batch.get("crop"))
                real = (batch["index"] >= 0).to(run.device)  # padding samples (index -1) do not count
                labels = batch["label"].to(run.device)
                tok_hit = (tok_p.argmax(-1) == labels.view(-1, 1, 1)).double().mean((1, 2))
                counts += torch.stack([real.sum().double(), ((cls_p.argmax(-1) == labels) & real).sum().double(),
                                       torch.where(real, tok_hit, 0.0).sum()])  # fmt: skip
        writer.close()
        if run.dims.distributed:
            dist.all_reduce(counts, group=group)
        seen, correct, tok_correct = counts.tolist()
        summary["splits"][split] = {
            "images": n, "grid": list(writer.grid), "topk": writer.topk, "teacher_top1": 100.0 * correct / max(seen, 1),
            "teacher_token_top1": 100.0 * tok_correct / max(seen, 1),
            "seconds": round(time.perf_counter() - t0, 2),
        }  # fmt: skip
    if run.dims.distributed:
        summary["layout"] = run.dims.describe()
    return summary


def run(args) -> int:
    import os

    from vitscale.config import ConfigError, load_config

    overrides = [a for a in args.args if "=" in a]
    outs = [a for a in args.args if "=" not in a]
    if len(outs) != 1:
        print(f"vitscale label-tokens: give exactly one output folder (got {outs or 'none'})", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        print(f"vitscale label-tokens: config error: {e}", file=sys.stderr)
        return 2
    summary = label_tokens(cfg, outs[0])  # errors: one line (vitscale.cli)
    if int(os.environ.get("RANK", "0")) == 0:  # every rank holds the same summary: rank 0 reports it
        print(json.dumps(summary, indent=1))
    return 0
