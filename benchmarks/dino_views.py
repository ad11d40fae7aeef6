"""A DINO step before and after the views moved to the data layer (docs/data.md "Views"): the step's
time with its batches already loaded, the training loader's images per second, and a
``torch.profiler`` table of the step with the count of crop, resize and colour kernels inside it.

Two runs, each a real ``Trainer`` of ``vitscale train``:

- ``digits``: the ``digits_dino`` recipe (2 global crops of 32 px, no local crops, iBOT and KoLeo);
- ``photos``: a small ViT (``vit_debug`` at 224 px, patch 16, width 96, 2 blocks) with DINOv2's
  2 x 224 + 8 x 96 crops, on an image folder of scikit-learn's two sample photos (``china.jpg``,
  ``flower.jpg``, 427 x 640 JPEGs: ImageNet's size) written 16 times each by this script.

The vitscale it measures is the one on ``PYTHONPATH``: the checkout before (where the crops are cut
inside the loss from the loader's image, which the recipe sets to the whole image with
``data.rrc_scale=[1,1] data.hflip=0``) or after (where the loader's workers cut them and those keys are
refused). Run both and merge::

    git worktree add /tmp/views_before 4ad6452
    PYTHONPATH=/tmp/views_before python benchmarks/dino_views.py --label before --json /tmp/before.json
    PYTHONPATH=$PWD python benchmarks/dino_views.py --label after --json /tmp/after.json
    python benchmarks/dino_views.py --merge /tmp/before.json /tmp/after.json --json benchmarks/results/dino_views_cpu_202612.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

# crop / resize / colour kernels: antialiased resizes (the crops' resize), flips, the jitter's and
# greyscale's channel arithmetic, and the blur's grouped convolution, as aten ops of torchvision's functional ops
CROP_OPS = ("aten::_upsample_bicubic2d_aa", "aten::_upsample_bilinear2d_aa", "aten::flip", "aten::rgb_to_grayscale",
            "aten::_rgb_to_hsv", "aten::clamp", "aten::clamp_", "aten::where", "aten::conv2d", "aten::pad",
            "aten::reflection_pad2d", "aten::remainder", "aten::fmod")  # fmt: skip

SMALL_VIT = ["model.name=vit_debug", "model.overrides.patch_dim=16", "model.overrides.img_h=224", "model.overrides.img_w=224",
             "model.overrides.hidden_size=96", "model.overrides.ffn_hidden_size=384", "model.overrides.num_attention_heads=2",
             "model.overrides.num_layers=2", "model.overrides.pool=token", "dino.global_crops_size=224",
             "dino.global_crops_scale=[0.32,1.0]", "dino.local_crops_number=8", "dino.local_crops_size=96",
             "dino.local_crops_scale=[0.05,0.32]", "dino.hflip=0.5", "dino.head_n_prototypes=1024",
             "dino.head_hidden_dim=256", "dino.head_bottleneck_dim=64", "data.format=imagefolder", "data.img_size=224",
             "data.mean=[0.485,0.456,0.406]", "data.std=[0.229,0.224,0.225]", "train.batch_size=8"]  # fmt: skip


def _photos(root: Path) -> Path:
    import sklearn.datasets

    images = Path(sklearn.datasets.__file__).parent / "images"
    for name in ("china", "flower"):
        d = root / "train" / name
        d.mkdir(parents=True, exist_ok=True)
        for i in range(16):
            shutil.copy(images / f"{name}.jpg", d / f"{i}.jpg")
    return root / "train"


def _is_after() -> bool:
    from vitscale.tasks.base import Task

    return hasattr(Task, "views")


def _trainer(overrides: list[str], out: Path):
    from vitscale.config import load_config
    from vitscale.train.trainer import Trainer

    common = ["log.flops=false", "checkpoint.every=0", "eval.every=0", "log.progress=none", "log.report=false",
              "train.max_steps=1000", "train.cpu_threads=1", f"train.output_dir={out}"]  # fmt: skip
    if not _is_after():  # the loader gives the whole image; the loss cuts the crops from it
        common += ["data.rrc_scale=[1.0,1.0]", "data.hflip=0"]
    return Trainer(load_config("digits_dino", [*overrides, *common]))


def _loader_rate(loader, batches: int) -> float:
    def forever():
        while True:
            yield from loader

    it = forever()
    next(it)
    t0, n = time.perf_counter(), 0
    for _ in range(batches):
        b = next(it)
        n += int(b["index"].shape[0])
    return n / (time.perf_counter() - t0)


def measure(name: str, overrides: list[str], steps: int, warmup: int, workdir: Path) -> dict:
    t = _trainer(overrides, workdir / name)
    rate = _loader_rate(t.loaders.train, max(4, steps // 2))  # images/s of the training loader (data.num_workers=0)
    batches = t._batches()
    loaded = [next(batches) for _ in range(warmup + steps + 1)]
    feed = iter(loaded)
    for _ in range(warmup):
        t.step += 1
        t.train_step(feed)
    times = []
    for _ in range(steps):
        t.step += 1
        t0 = time.perf_counter()
        t.train_step(feed)
        times.append(time.perf_counter() - t0)
    from torch.profiler import ProfilerActivity, profile

    t.step += 1
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t.train_step(feed)
    events = prof.key_averages()
    crop = {e.key: int(e.count) for e in events if e.key in CROP_OPS}
    table = sorted(({"op": e.key, "calls": int(e.count), "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 3)} for e in events),
                   key=lambda r: -r["self_cpu_ms"])[:20]  # fmt: skip
    b = loaded[0]
    return {"config": overrides, "images_per_step": int(b["index"].shape[0]), "median_step_ms": round(1e3 * statistics.median(times), 1),
            "step_ms": [round(1e3 * x, 1) for x in times], "loader_images_per_s": round(rate, 1),
            "crop_resize_colour_calls_in_step": crop, "profile_top20_self_cpu": table}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", default="after")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--merge", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    a = ap.parse_args()
    if a.merge:
        before, after = (json.loads(p.read_text()) for p in a.merge)
        out = {"before": before, "after": after,
               "speedup_median_step": {k: round(before["runs"][k]["median_step_ms"] / after["runs"][k]["median_step_ms"], 2)
                                       for k in after["runs"]}}  # fmt: skip
    else:
        torch.set_num_threads(1)
        with tempfile.TemporaryDirectory() as tmp:
            root = _photos(Path(tmp) / "photos")
            runs = {"digits": measure("digits", ["data.num_workers=0"], a.steps, a.warmup, Path(tmp)),
                    "photos": measure("photos", [*SMALL_VIT, f"data.train_path={root}", "data.num_workers=0"],
                                      a.steps, a.warmup, Path(tmp))}  # fmt: skip
        import vitscale

        head = subprocess.run(["git", "-C", str(Path(vitscale.__file__).parents[1]), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
        out = {"label": a.label, "views_in_loader": _is_after(), "commit": head, "torch": torch.__version__,
               "cpu": platform.processor() or platform.machine(), "threads": 1,
               "load_average": os.getloadavg(), "runs": runs}  # fmt: skip
    text = json.dumps(out, indent=1)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(text + "\n")
    print(text if a.merge else json.dumps({k: {m: v[m] for m in ("median_step_ms", "loader_images_per_s",
                                                                  "crop_resize_colour_calls_in_step")}
                                           for k, v in out["runs"].items()}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
