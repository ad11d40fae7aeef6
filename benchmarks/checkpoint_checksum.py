"""What checksumming costs a checkpoint: hash throughput over a large tensor, and the share of a real
``Checkpointer.save`` / verify spent hashing. Not a test.

    python benchmarks/checkpoint_checksum.py --mib 512 --rounds 3 --json benchmarks/results/checkpoint_checksum_cpu_202611.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shutil
import tempfile
import time
import zlib
from pathlib import Path

import torch
import xxhash

from vitscale.checkpoint import Checkpointer
from vitscale.checkpoint.safetensors_io import byte_view
from vitscale.checkpoint.storage import verify

HASHES = {
    "xxh3_64": lambda b: xxhash.xxh3_64(b).digest(),
    "crc32 (zlib)": lambda b: zlib.crc32(b),
    "sha256": lambda b: hashlib.sha256(b).digest(),
    "blake2b": lambda b: hashlib.blake2b(b).digest(),
}


def best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512, help="size of the saved state (fp32, 8 tensors)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temp folder)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    n = args.mib * 2**20 // 4 // 8
    state = {"model": {f"w{i}": torch.randn(n) for i in range(8)}}
    total = 8 * n * 4
    one = byte_view(state["model"]["w0"])
    res = {"state_mib": args.mib, "cpu": platform.processor() or platform.machine(), "torch": torch.__version__, "hash_gib_s": {}}
    for name, fn in HASHES.items():
        res["hash_gib_s"][name] = round(one.nbytes / best(lambda fn=fn: fn(one), args.rounds) / 2**30, 2)
    root = Path(args.dir or tempfile.mkdtemp(prefix="ckpt_bench_"))
    ck = Checkpointer(root / "checkpoints", keep=1)
    step = [0]

    def save():
        step[0] += 1
        ck.save(step[0], state, {"step": step[0], "data": {}})

    res["save_s"] = round(best(save, args.rounds), 3)
    path = ck.latest()
    res["verify_s"] = round(best(lambda: verify(path), args.rounds), 3)
    res["xxh3_over_state_s"] = round(total / (res["hash_gib_s"]["xxh3_64"] * 2**30), 3)
    res["xxh3_share_of_save"] = round(res["xxh3_over_state_s"] / res["save_s"], 3)
    res["sha256_would_add_s"] = round(total / (res["hash_gib_s"]["sha256"] * 2**30), 3)
    shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
