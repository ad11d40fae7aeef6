"""Input-pipeline benchmark: vitscale's loader vs torchvision's ImageFolder + v2 transforms, per CPU core.

Both pipelines run in the same process, one thread (torch.set_num_threads(1)), no workers,
alternating round by round over the same ImageNet-sized JPEGs (crops / resizes of the two real
photos scikit-learn ships, ~500x375, quality 90): JPEG decode + RandomResizedCrop(224) + flip, up
to the normalised float batch the model consumes. Figures are images per second of one core
(wall clock, and CPU time as a check against a busy machine).
"""

from __future__ import annotations

import json
import os
import platform
import time
from datetime import datetime, timezone

import numpy as np
import torch

from ..config.data import IMAGENET_MEAN, IMAGENET_STD, data_config
from .report import git_commit


def make_jpegs(root: str, n: int = 256, size: tuple[int, int] = (500, 375), quality: int = 90,
               classes: int = 4, seed: int = 0) -> list[str]:
    """Write ``n`` natural JPEGs (crops of sklearn's sample photos resized to ``size`` (W, H), one in
    four portrait) as ``root/<class>/<n>.jpg``."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = [Image.fromarray(a) for a in load_sample_images().images]  # china.jpg, flower.jpg (640x427)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        src = photos[i % len(photos)]
        w, h = src.size
        s = rng.uniform(0.45, 1.0)
        cw, ch = int(w * s), int(h * s)
        x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        out = size if i % 4 else (size[1], size[0])
        img = src.crop((x0, y0, x0 + cw, y0 + ch)).resize(out, Image.Resampling.BICUBIC)
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        d = os.path.join(root, f"class{i % classes}")
        os.makedirs(d, exist_ok=True)
        paths.append(os.path.join(d, f"{i:05d}.jpg"))
        img.save(paths[-1], quality=quality)
    return paths


def _torchvision_loader(root: str, out: int, batch_size: int, normalize: bool):
    from torchvision import datasets
    from torchvision.transforms import v2

    tfs = [v2.RandomResizedCrop(out, antialias=True), v2.RandomHorizontalFlip(), v2.ToImage()]
    if normalize:
        tfs += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    ds = datasets.ImageFolder(root, transform=v2.Compose(tfs))
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=0, drop_last=True)


def _vitscale_loader(root: str, out: int, batch_size: int, fast: bool, normalize: bool):
    from ..data.build import build_loaders

    cfg = data_config(format="imagefolder", train_path=root, num_workers=0, fast_decode=fast, pin_memory=False)
    train = build_loaders(cfg, img_size=(out, out), num_channels=3, seed=0, micro_batch_size=batch_size,
                          eval_batch_size=batch_size).train
    return train if normalize else train._dl  # the raw DataLoader yields the uint8 batches


def _time_epoch(loader) -> tuple[float, float, int]:
    n = 0
    w0, c0 = time.perf_counter(), time.process_time()
    for batch in loader:
        n += (batch["image"] if isinstance(batch, dict) else batch[0]).shape[0]
    return time.perf_counter() - w0, time.process_time() - c0, n


def run(n_images: int = 256, out: int = 224, batch_size: int = 32, rounds: int = 5, quality: int = 90,
        root: str | None = None, log=print) -> dict:
    """Time every pipeline ``rounds`` times, alternating; returns the result dict."""
    import tempfile

    import PIL
    import torchvision

    from ..data import decode

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tmp = None
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="vitscale_bench_data_")
        root = tmp.name
    load_before = os.getloadavg()
    paths = make_jpegs(root, n_images, quality=quality)
    mean_bytes = float(np.mean([os.path.getsize(p) for p in paths]))
    log(f"{len(paths)} JPEGs (~500x375, q{quality}, {mean_bytes / 1024:.1f} KiB avg) in {root}; "
        f"output {out}x{out}, batch {batch_size}, 1 thread, num_workers=0")
    sj = decode._simplejpeg()

    def vs(fast, normalize, use_sj):
        def make():
            decode.USE_SIMPLEJPEG = use_sj
            return _vitscale_loader(root, out, batch_size, fast, normalize)
        return make

    pipelines = {
        "torchvision": lambda: _torchvision_loader(root, out, batch_size, True),
        "vitscale": vs(True, True, True),
        "vitscale_pil_draft": vs(True, True, False),
        "vitscale_full_decode": vs(False, True, False),
        "torchvision_uint8": lambda: _torchvision_loader(root, out, batch_size, False),
        "vitscale_uint8": vs(True, False, True),
    }
    if sj is None:
        pipelines.pop("vitscale_pil_draft")
    results = {k: {"wall_s": [], "cpu_s": [], "images": 0} for k in pipelines}
    try:
        for make in pipelines.values():  # warm-up: page cache, imports, lazy init
            _time_epoch(make())
        for r in range(rounds):
            for name, make in pipelines.items():
                loader = make()
                wall, cpu, n = _time_epoch(loader)
                results[name]["wall_s"].append(wall)
                results[name]["cpu_s"].append(cpu)
                results[name]["images"] = n
                log(f"round {r} {name:22s} {n / wall:8.1f} img/s wall  {n / cpu:8.1f} img/s cpu")
    finally:
        decode.USE_SIMPLEJPEG = True
        torch.set_num_threads(threads)
        if tmp is not None:
            tmp.cleanup()
    load_after = os.getloadavg()
    log(f"load average (1, 5, 15 min) before {load_before}, after {load_after} on {os.cpu_count()} cpus")
    for res in results.values():
        n = res["images"]
        res["img_per_s"] = n / float(np.median(res["wall_s"]))
        res["cpu_img_per_s"] = n / float(np.median(res["cpu_s"]))
    base, base8 = results["torchvision"], results["torchvision_uint8"]
    speedup = {
        name: {"wall": res["img_per_s"] / (base8 if name.endswith("uint8") else base)["img_per_s"],
               "cpu": res["cpu_img_per_s"] / (base8 if name.endswith("uint8") else base)["cpu_img_per_s"]}
        for name, res in results.items() if name.startswith("vitscale")
    }
    for name, s in speedup.items():
        log(f"{name:22s} speedup vs torchvision: {s['wall']:.2f}x wall, {s['cpu']:.2f}x cpu")
    commit = git_commit()
    return {
        "benchmark": "data_pipeline",
        "device": "cpu",
        "cpu": platform.processor() or platform.machine(),
        "threads": 1,
        "cpu_count": os.cpu_count(),
        "load_average_before_after": [list(load_before), list(load_after)],
        "num_workers": 0,
        "n_images": len(paths),
        "image_size": "500x375 (1 in 4 portrait)",
        "jpeg_quality": quality,
        "mean_file_kib": round(mean_bytes / 1024, 1),
        "out_size": out,
        "batch_size": batch_size,
        "rounds": rounds,
        "pipelines": {
            "torchvision": "datasets.ImageFolder (PIL) + v2 RandomResizedCrop(antialias) + RandomHorizontalFlip "
                           "+ ToImage + ToDtype(float32, scale) + Normalize",
            "vitscale": "build_loaders(imagefolder, fast_decode=True): box first, libjpeg-turbo (simplejpeg) "
                        "decode at the smallest DCT scale covering the output, uint8 crop+resize, "
                        "per-batch normalisation (here on the CPU)",
            "vitscale_pil_draft": "same, decoding with PIL Image.draft (no simplejpeg)",
            "vitscale_full_decode": "fast_decode=False: full-size PIL decode, same uint8 crop+resize",
            "torchvision_uint8": "torchvision pipeline stopped at the uint8 tensor (no ToDtype/Normalize)",
            "vitscale_uint8": "vitscale fast pipeline stopped at the uint8 batch (normalisation left to the device)",
        },
        "results": results,
        "speedup_vs_torchvision": speedup,
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__, "pillow": PIL.__version__,
                     "simplejpeg": getattr(sj, "__version__", None) if sj else None},
        "commit": commit,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def write_results(result: dict, log_lines: list[str], out_dir: str) -> tuple[str, str]:
    """Write ``data_pipeline_cpu_<yyyymm>.json`` and the raw ``.log`` beside it."""
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"data_pipeline_cpu_{datetime.now(timezone.utc):%Y%m}")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    with open(stem + ".log", "w") as f:
        f.write("\n".join(log_lines) + "\n")
    return stem + ".json", stem + ".log"
