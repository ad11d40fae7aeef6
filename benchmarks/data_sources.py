"""Input-pipeline img/s of the same images stored four ways: an image folder, local WebDataset shards,
the same shards served over HTTP from localhost, and local Parquet files.

``--images`` natural JPEGs (``vitscale.bench.data_pipeline.make_jpegs``: crops of scikit-learn's two
photos, 500x375, quality 90) are written as an image folder, then converted with ``vitscale data
convert`` to WebDataset shards (``--shard-size`` samples each) and Parquet files (row groups of
``--row-group``); the shards are also served by ``python -m http.server`` in its own process (a
remote server is another machine: it does not share this process). Each source is read by its
training loader (``build_loaders``: keyed RandomResizedCrop + flip at ``--img-size``, batches of
``--batch-size``, uint8 -> normalised float in the main process) with 1 and 2 DataLoader workers,
one epoch per measurement, the first batch (worker start-up, first reads) left out. Sources alternate
within each round, in a rotated order, and each figure is the median over ``--rounds``; the load
average is recorded around every measurement (the machine may be shared). Besides wall-clock img/s,
images per CPU-second of the loader (this process and its worker processes, the whole epoch with its
start-up; the HTTP server's time not counted) — what a shared machine's contention does not change.

    python benchmarks/data_sources.py --images 2000 --rounds 5 --json benchmarks/results/data_sources_cpu_202611.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

import torch

from vitscale.bench.data_pipeline import make_jpegs
from vitscale.bench.report import git_commit, write_json
from vitscale.cli import main as cli
from vitscale.data import build_loaders, data_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children (the DataLoader workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _sources(root: str, base: str, n_shards: int) -> dict[str, dict]:
    last = f"{n_shards - 1:06d}"
    return {
        "imagefolder": dict(format="imagefolder", train_path=f"{root}/folder"),
        "webdataset_local_index": dict(format="webdataset", train_path=f"{root}/wds"),
        "webdataset_local_stream": dict(format="webdataset", train_path=f"{root}/wds", webdataset_mode="stream"),
        "webdataset_http_stream": dict(format="webdataset", train_path=f"{base}/wds/folder-{{000000..{last}}}.tar",
                                       webdataset_mode="stream"),
        "parquet_local_stream": dict(format="parquet", train_path=f"{root}/parquet"),
    }


def _measure(fields: dict, workers: int, args) -> dict:
    cfg = data_config(**fields, num_workers=workers, pin_memory=False)
    load0 = os.getloadavg()
    cpu0 = _cpu_seconds()
    loader = build_loaders(cfg, img_size=(args.img_size, args.img_size), num_channels=3, seed=0,
                           micro_batch_size=args.batch_size, eval_batch_size=args.batch_size).train  # fmt: skip
    it = iter(loader)
    t_start = time.perf_counter()
    first = next(it)
    t0 = time.perf_counter()
    n = 0
    for batch in it:
        n += batch["image"].shape[0]
    t1 = time.perf_counter()
    del it, loader  # the workers are joined: their CPU time is counted as this process's children's
    cpu = _cpu_seconds() - cpu0
    return {"img_per_s": n / (t1 - t0), "images": n, "seconds": t1 - t0,
            "img_per_cpu_s": (n + int(first["image"].shape[0])) / cpu, "cpu_seconds": cpu,
            "first_batch_s": t0 - t_start, "first_batch_images": int(first["image"].shape[0]),
            "loadavg_before": list(load0), "loadavg_after": list(os.getloadavg())}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--shard-size", type=int, default=500)
    p.add_argument("--row-group", type=int, default=100)
    p.add_argument("--out-dir", default=None, help="where the images are written (default: a temp folder)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)

    root = args.out_dir or tempfile.mkdtemp(prefix="vitscale_sources_")
    make_jpegs(os.path.join(root, "folder"), n=args.images, classes=10)
    for to, out, extra in (("webdataset", "wds", ["--max-count", str(args.shard_size)]),
                           ("parquet", "parquet", ["--row-group", str(args.row_group)])):  # fmt: skip
        assert cli(["data", "convert", f"{root}/folder", f"{root}/{out}", "--to", to, *extra]) == 0
    n_shards = len([f for f in os.listdir(f"{root}/wds") if f.endswith(".tar")])
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", root], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(1.0)
    try:
        sources = _sources(root, f"http://127.0.0.1:{port}", n_shards)
        names = list(sources)
        runs: dict[str, dict[int, list]] = {s: {w: [] for w in args.workers} for s in names}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[: r % len(names)]  # rotated: no source always first
            for workers in args.workers:
                for name in order:
                    m = _measure(sources[name], workers, args)
                    runs[name][workers].append(m)
                    print(f"round {r} workers {workers} {name:<26} {m['img_per_s']:8.1f} img/s "
                          f"{m['img_per_cpu_s']:8.1f} img/CPU-s  (load {m['loadavg_before'][0]:.2f} -> "
                          f"{m['loadavg_after'][0]:.2f})", flush=True)  # fmt: skip
    finally:
        server.terminate()
        server.wait()
    def med(key):
        return {name: {str(w): statistics.median(x[key] for x in runs[name][w]) for w in args.workers} for name in names}

    def vs(table):
        return {str(w): {
            "http_stream_vs_local_stream": table["webdataset_http_stream"][str(w)] / table["webdataset_local_stream"][str(w)],
            "parquet_vs_imagefolder": table["parquet_local_stream"][str(w)] / table["imagefolder"][str(w)],
            "webdataset_index_vs_imagefolder": table["webdataset_local_index"][str(w)] / table["imagefolder"][str(w)],
        } for w in args.workers}  # fmt: skip

    summary, per_cpu = med("img_per_s"), med("img_per_cpu_s")
    ratios = {"wall": vs(summary), "per_cpu_second": vs(per_cpu)}
    loads = [x["loadavg_before"][0] for s in runs.values() for ms in s.values() for x in ms]
    result = {
        "benchmark": "data_sources", "command": " ".join(["python", *sys.argv]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": git_commit(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "loadavg_1min_min_median_max": [min(loads), statistics.median(loads), max(loads)]},
        "settings": vars(args) | {"root": root, "shards": n_shards},
        "median_img_per_s": summary, "median_img_per_cpu_s": per_cpu, "ratios": ratios,
        "runs": {name: {str(w): v for w, v in per.items()} for name, per in runs.items()},
    }  # fmt: skip
    print(json.dumps({"median_img_per_s": summary, "median_img_per_cpu_s": per_cpu, "ratios": ratios,
                      "loadavg": result["machine"]}, indent=1))  # fmt: skip
    if args.json:
        write_json(result, args.json)


if __name__ == "__main__":
    main()
