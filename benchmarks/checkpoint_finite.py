"""What checking a checkpoint's tensors for NaN / infinity costs on load, on a ViT-B/16-sized state:
the model's weights, AdamW's two moments per parameter and an EMA copy (fp32, ~1.38 GB), saved
with :class:`vitscale.checkpoint.Checkpointer`. Not a test.

Measured, in interleaved rounds (medians; the machine may be shared, so the load average is
recorded): verifying the checkpoint's files by checksum only (what a resume did before) and with the
finite check in the same read (what it does now); a whole resume (find the newest intact checkpoint
and load it) for scale; and the in-memory check before a save, ``torch.isfinite(t).all()`` per
tensor (before) against the sum-first test of ``vitscale.checkpoint.finite`` (now).

    python benchmarks/checkpoint_finite.py --rounds 5 --json benchmarks/results/checkpoint_finite_cpu_202611.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from vitscale.checkpoint import Checkpointer
from vitscale.checkpoint.finite import finite_flags, scan_file
from vitscale.checkpoint.integrity import HASH_NAME
from vitscale.checkpoint.safetensors_io import dtype_from_code
from vitscale.checkpoint.storage import read_index, read_manifests
from vitscale.models import create_model


def b16_state(model_name: str) -> dict:
    """The nesting and sizes the trainer saves: model, optim (AdamW state per parameter), ema."""
    torch.manual_seed(0)
    model = create_model(model_name)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optim = {"state": {k: {"exp_avg": torch.randn_like(v) * 1e-3, "exp_avg_sq": torch.rand_like(v) * 1e-6, "step": torch.tensor(10.0)}
                       for k, v in weights.items() if v.is_floating_point()}}  # fmt: skip
    ema = {k: v.clone() for k, v in weights.items()}
    return {"model": weights, "optim": optim, "ema": ema}


def files_and_spans(path: Path) -> list[tuple[Path, int, str, list]]:
    idx = read_index(path)
    files = read_manifests(path, idx)
    spans: dict[str, list] = {}
    for fqn, t in idx["tensors"].items():
        dtype = dtype_from_code(t["dtype"])
        if dtype.is_floating_point:
            for c in t["chunks"]:
                spans.setdefault(c["file"], []).append((c["start"], c["length"], dtype, fqn))
    return [(path / name, info["bytes"], info[HASH_NAME], spans.get(name, [])) for name, info in sorted(files.items())]


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vit_b16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temp folder)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    state = b16_state(args.model)
    flat = [t for group in (state["model"], state["ema"]) for t in group.values()]
    flat += [t for s in state["optim"]["state"].values() for t in s.values()]
    params = sum(t.numel() for t in state["model"].values())
    nbytes = sum(t.numel() * t.element_size() for t in flat)
    root = Path(args.dir or tempfile.mkdtemp(prefix="ckpt_finite_"))
    ck = Checkpointer(root / "checkpoints", keep=1)
    t_save = timed(lambda: ck.save(1, state, {"step": 1, "data": {}}))
    path = ck.latest()
    plan = files_and_spans(path)

    def verify_checksum_only():
        for p, size, checksum, _ in plan:
            scan_file(p, size, checksum, [])

    def verify_with_finite():
        for p, size, checksum, spans in plan:
            scan_file(p, size, checksum, spans)

    def resume():
        c = Checkpointer(root / "checkpoints", keep=1)
        c.load(c.latest(), state)

    def isfinite_all():
        torch.stack([torch.isfinite(t).all() for t in flat if t.is_floating_point()]).tolist()

    def sum_first():
        finite_flags([t for t in flat if t.is_floating_point()])

    cases = {"verify_checksum_only": verify_checksum_only, "verify_checksum_and_finite": verify_with_finite, "resume_latest_and_load": resume,
             "in_memory_isfinite_all": isfinite_all, "in_memory_sum_first": sum_first}  # fmt: skip
    verify_with_finite()  # warm the page cache: both variants read from memory, as a resume right after a save would
    times: dict[str, list[float]] = {k: [] for k in cases}
    load = [os.getloadavg()]
    for _ in range(args.rounds):  # interleaved: a busy spell on the shared machine hits every case alike
        for name, fn in cases.items():
            times[name].append(timed(fn))
    load.append(os.getloadavg())
    med = {k: statistics.median(v) for k, v in times.items()}
    added = statistics.median(a - b for a, b in zip(times["verify_checksum_and_finite"], times["verify_checksum_only"]))
    res = {
        "model": args.model, "parameters": params, "state_bytes": nbytes,
        "state": "model + AdamW exp_avg, exp_avg_sq + EMA, fp32", "rounds": args.rounds,
        "save_s": round(t_save, 3),
        "median_s": {k: round(v, 3) for k, v in med.items()},
        "all_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "finite_check_on_load_s": round(added, 3),
        "finite_check_on_load_note": "median over rounds of (verify with the finite check - checksum only), both reading the page cache",
        "finite_check_share_of_resume": round(added / med["resume_latest_and_load"], 3),
        "in_memory_speedup": round(med["in_memory_isfinite_all"] / med["in_memory_sum_first"], 1),
        "loadavg_before_after": [[round(x, 2) for x in la] for la in load],
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "command": "python benchmarks/checkpoint_finite.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items() if v is not None and k != "json"),
    }  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
