"""Images per second per core of each ``data.auto_augment`` policy, vitscale against timm's transform
stack, one process, one thread. Not a test.

Two measurements per policy, on JPEGs cut from scikit-learn's two sample photos (china.jpg,
flower.jpg, 427 x 640):

- ``stage``: the augmentation alone on a 224 x 224 crop: vitscale's ``Augment`` (uint8 tensor in,
  uint8 tensor out, the PIL round trip included) against the reference policy on a PIL image
  followed by timm's ``MaybePILToTensor`` (timm's ``rand_augment_transform`` /
  ``auto_augment_transform``; torchvision's ``TrivialAugmentWide`` for ``ta_wide``, timm has none;
  torchvision's ``ColorJitter`` for the jitter);
- ``sample``: the whole training transform of one file: vitscale's ``SampleTransform.decode`` (JPEG
  decode at a reduced DCT scale, RandomResizedCrop, flip, the policy, the erasing draw) against
  timm's ``create_transform(is_training=True, use_prefetcher=True)`` on ``PIL.Image.open(...)``
  (full decode, RandomResizedCrop, flip, the policy, uint8 tensor).

Rates are images per CPU-second of this process (``time.process_time``), which a shared machine
disturbs less than the wall clock, the median of ``--rounds`` rounds in which the two sides alternate;
the wall-clock rate and the load average are recorded too.

    python benchmarks/augment_rate.py --images 300 --rounds 3 --json benchmarks/results/augment_rate_cpu_202611.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vitscale.data import data_config  # noqa: E402
from vitscale.data.auto_augment import build_augment  # noqa: E402
from vitscale.data.transforms import SampleTransform  # noqa: E402

MEAN = (0.485, 0.456, 0.406)
SIZE = 224
# (name, data.auto_augment, data.color_jitter)
POLICIES = [
    ("none", "", ()),
    ("rand-m9-mstd0.5-inc1", "rand-m9-mstd0.5-inc1", ()),
    ("rand-m7-mstd0.5", "rand-m7-mstd0.5", ()),
    ("original", "original", ()),
    ("3a + jitter 0.3", "3a", (0.3,)),
    ("ta_wide", "ta_wide", ()),
    ("jitter 0.4", "", (0.4,)),
]


def _photos(n_files: int) -> list[bytes]:
    from sklearn.datasets import load_sample_images

    out, rng = [], np.random.default_rng(0)
    for k in range(n_files):
        a = load_sample_images().images[k % 2]
        y, x = int(rng.integers(0, 60)), int(rng.integers(0, 120))
        buf = io.BytesIO()
        Image.fromarray(a[y:y + 360, x:x + 500]).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def _timm_stage(aa: str, jitter):
    from timm.data.auto_augment import auto_augment_transform, rand_augment_transform
    from timm.data.transforms import MaybePILToTensor
    from torchvision import transforms as T

    hp = dict(translate_const=int(SIZE * 0.45), img_mean=tuple(min(255, round(255 * x)) for x in MEAN),
              interpolation=Image.Resampling.BICUBIC)  # fmt: skip
    stages = []
    if aa.startswith("rand"):
        stages.append(rand_augment_transform(aa, hp))
    elif aa == "ta_wide":
        stages.append(T.TrivialAugmentWide(interpolation=T.InterpolationMode.BICUBIC))
    elif aa:
        stages.append(auto_augment_transform(aa, hp))
    if jitter:
        j = jitter[0]
        stages.append(T.ColorJitter(j, j, j))
    return T.Compose([*stages, MaybePILToTensor()])


def _timm_sample(aa: str, jitter):
    from timm.data import create_transform
    from timm.data.transforms import MaybePILToTensor, RandomResizedCropAndInterpolation
    from torchvision import transforms as T

    if aa == "ta_wide":  # timm has no TrivialAugment: its crop and flip, then torchvision's
        return T.Compose([RandomResizedCropAndInterpolation(SIZE, interpolation="bicubic"), T.RandomHorizontalFlip(),
                          T.TrivialAugmentWide(interpolation=T.InterpolationMode.BICUBIC), MaybePILToTensor()])  # fmt: skip
    return create_transform(SIZE, is_training=True, auto_augment=aa or None, color_jitter=jitter[0] if jitter else None,
                            interpolation="bicubic", mean=MEAN, use_prefetcher=True)  # fmt: skip


def _once(fn, items) -> tuple[float, float, int]:
    """(CPU s, wall s, errors) of ``fn`` over ``items``. timm's posterize to 0 bits
    (``PosterizeIncreasing`` at magnitude 10, which ``mstd`` noise reaches) raises ValueError with
    Pillow 13: such images are counted as errors and the timing goes on."""
    errors = 0
    w0, c0 = time.perf_counter(), time.process_time()
    for it in items:
        try:
            fn(it)
        except ValueError:
            errors += 1
    return time.process_time() - c0, time.perf_counter() - w0, errors


def _pair(ours, theirs, items, rounds: int) -> dict:
    """vitscale and the reference timed in alternating rounds (after a warm-up each): median rates."""
    ours(items[0]), theirs(items[0])
    runs = {"vitscale": [], "reference": []}
    for _ in range(rounds):
        runs["vitscale"].append(_once(ours, items))
        runs["reference"].append(_once(theirs, items))
    out = {}
    for side, rs in runs.items():
        out[side] = {"images": len(items), "rounds": rounds,
                     "img_per_cpu_s": round(statistics.median(len(items) / c for c, _, _ in rs), 1),
                     "img_per_wall_s": round(statistics.median(len(items) / w for _, w, _ in rs), 1),
                     "errors": sum(e for _, _, e in rs)}  # fmt: skip
    return out


def _measure(aa: str, jitter, files, crops, tensors, items, rounds: int) -> dict:
    """``stage`` (None without a policy) and ``sample`` rates of one policy, vitscale and reference."""
    row = {"stage": None}
    ours = build_augment(aa, jitter, mean=MEAN, interpolation="bicubic")
    random.seed(0)
    torch.manual_seed(0)
    if ours is not None:
        counter = iter(range(10**9))
        theirs = _timm_stage(aa, jitter)
        row["stage"] = _pair(lambda k: ours(tensors[k], random.Random(next(counter))), lambda k: theirs(crops[k]), items, rounds)
    cfg = data_config(format="imagefolder", auto_augment=aa, color_jitter=jitter, interpolation="bicubic", mean=MEAN)
    tf = SampleTransform(cfg, (SIZE, SIZE), 3, seed=0, train=True)
    ref = _timm_sample(aa, jitter)
    epoch = iter(range(10**9))
    row["sample"] = _pair(lambda k: tf.decode(files[k], next(epoch), k),
                          lambda k: ref(Image.open(io.BytesIO(files[k])).convert("RGB")), items, rounds)  # fmt: skip
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=150, help="images timed per round, policy and side (default 150)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per policy; medians reported (default 3)")
    ap.add_argument("--json", default=None, help="write the result here (and the printed lines beside it, .log)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    log(f"$ python benchmarks/augment_rate.py {' '.join(sys.argv[1:])}")
    files = _photos(16)
    crops = []
    for data in files:
        img = Image.open(io.BytesIO(data)).convert("RGB").resize((SIZE, SIZE), Image.Resampling.BICUBIC)
        crops.append(img)
    items = [k % len(files) for k in range(a.images)]
    load_before = os.getloadavg()
    results = []
    tensors = [torch.from_numpy(np.array(c)).permute(2, 0, 1) for c in crops]  # channels-last, as decoded
    for name, aa, jitter in POLICIES:
        row = {"policy": name, "auto_augment": aa, "color_jitter": list(jitter), **_measure(aa, jitter, files, crops, tensors, items, a.rounds)}
        for part in ("stage", "sample"):
            if row[part]:
                v, r = row[part]["vitscale"]["img_per_cpu_s"], row[part]["reference"]["img_per_cpu_s"]
                row[part]["ratio"] = round(v / r, 2)
                err = row[part]["reference"]["errors"]
                log(f"{name:22s} {part:6s}: vitscale {v:7.1f} img/s/core, timm {r:7.1f} img/s/core ({v / r:.2f}x)"
                    + (f"; timm raised on {err} images" if err else ""))  # fmt: skip
        results.append(row)
    import timm

    res = {
        "what": "images per CPU-second, one process, torch.set_num_threads(1); 224 px, bicubic, scikit-learn's sample photos",
        "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "python": sys.version.split()[0],
        "torch": torch.__version__, "timm": timm.__version__, "pillow": Image.__version__,
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "note": "a shared 2-core machine (other jobs running): rates per CPU-second, compare within one run",
        "results": results,
    }  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
        Path(a.json).with_suffix(".log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
