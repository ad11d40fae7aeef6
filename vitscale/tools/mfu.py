"""Model FLOPs utilisation: achieved TFLOP/s over the device's peak.

Vision-aware definition (see ``docs/benchmarks.md``): the FLOPs of one image are those of the model's
forward pass as its family counts them (``vitscale.models.registry.forward_flops``; for a training
step as training runs it, e.g. only the patches patch dropout keeps) — every matmul, attention
scores and attention x values included, 2 FLOPs per multiply-add — and a training step is
taken as 3x the forward (backward = 2x forward; activation recomputation is *not* counted, so
checkpointing lowers MFU, as in the PaLM / ViT-22B convention).

The peak is the datasheet dense (no sparsity) figure of the GPU for the compute dtype, looked up by
``torch.cuda.get_device_name``; on a CPU it is a measured large-matmul rate, cached on disk.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

# Datasheet dense tensor-core peaks in TFLOP/s (NVIDIA product datasheets; sparsity figures halved).
# "fp32" is the non-tensor-core FP32 rate, "tf32" the TF32 tensor-core rate (used for fp32 matmuls
# when ``torch.backends.cuda.matmul.allow_tf32`` is on). Rows are matched in order, first hit wins:
# every pattern (lower case) must occur in the lower-cased device name.
PEAK_TABLE: list[tuple[tuple[str, ...], str, dict[str, float]]] = [
    (("gb200",), "NVIDIA GB200 (per GPU)", {"bf16": 2500.0, "fp16": 2500.0, "tf32": 1250.0, "fp32": 80.0}),
    (("b200",), "NVIDIA B200", {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 80.0}),
    (("gh200",), "NVIDIA GH200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (("h200", "nvl"), "NVIDIA H200 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (("h200",), "NVIDIA H200 SXM", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (("h100", "pcie"), "NVIDIA H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    (("h100", "nvl"), "NVIDIA H100 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (("h100",), "NVIDIA H100 SXM", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (("h800",), "NVIDIA H800 SXM", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (("a100",), "NVIDIA A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (("a800",), "NVIDIA A800", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (("l40s",), "NVIDIA L40S", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}),
    (("l40",), "NVIDIA L40", {"bf16": 181.05, "fp16": 181.05, "tf32": 90.5, "fp32": 90.5}),
    (("l4",), "NVIDIA L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (("a10g",), "NVIDIA A10G", {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2}),
    (("a10",), "NVIDIA A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (("4090",), "NVIDIA GeForce RTX 4090", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
    (("v100",), "NVIDIA V100", {"fp16": 125.0, "fp32": 15.7}),
]

_DTYPE_KEYS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def dtype_key(dtype: torch.dtype | str) -> str:
    """``torch.bfloat16`` / ``"bf16"`` / ``"bfloat16"`` -> the table's key (bf16, fp16, tf32, fp32)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPE_KEYS:
            raise ValueError(f"no peak for dtype {dtype}")
        return _DTYPE_KEYS[dtype]
    aliases = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
    key = aliases.get(dtype, dtype)
    if key not in ("bf16", "fp16", "tf32", "fp32"):
        raise ValueError(f"no peak for dtype {dtype!r}")
    return key


def lookup_peak(device_name: str, dtype: torch.dtype | str) -> tuple[float, str] | None:
    """Datasheet dense peak TFLOP/s of a GPU by its name, and the table row it came from.

    ``None`` when the GPU or the dtype is not in the table.
    """
    name = device_name.lower()
    key = dtype_key(dtype)
    for patterns, label, peaks in PEAK_TABLE:
        if all(p in name for p in patterns):
            if key not in peaks:
                return None
            return peaks[key], f"datasheet {label} dense {key}"
    return None


def _cache_path() -> Path:
    root = os.environ.get("VITSCALE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vitscale"
    )
    return Path(root) / "cpu_peak.json"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_matmul_tflops(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    size: int = 2048,
    min_time: float = 0.5,
) -> float:
    """Best-of rate of a square ``size`` matmul on ``device`` in TFLOP/s (2 FLOPs per multiply-add)."""
    device = torch.device(device)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    torch.mm(a, b)  # warm-up
    sync()
    best, spent = 0.0, 0.0
    while spent < min_time:
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        dt = time.perf_counter() - t0
        spent += dt
        best = max(best, 2 * size**3 / dt / 1e12)
    return best


def had_the_cpu(cpu_s: float, wall_s: float, threads: int, share: float = 0.9) -> bool:
    """Whether a measurement of ``wall_s`` seconds on ``threads`` threads had its cores to itself: the
    process ran for at least ``share`` of ``threads x wall_s`` CPU-seconds (``cpu_s``, all its threads;
    ``time.process_time``). A core shared with other work gives the process less: the OS's time slices."""
    return wall_s > 0 and cpu_s >= share * threads * wall_s


def peak_tflops(
    device: torch.device | str,
    dtype: torch.dtype | str = torch.bfloat16,
    cache: bool = True,
    refresh: bool = False,
) -> tuple[float, str]:
    """Peak TFLOP/s of ``device`` for ``dtype`` and where the figure comes from.

    CUDA: the datasheet table by GPU name (fp32 means tf32 when TF32 matmuls are allowed); a GPU not
    in the table falls back to a measured matmul peak. CPU: a measured large-matmul peak with the
    current thread count, cached in ``$VITSCALE_CACHE_DIR/cpu_peak.json`` (default ``~/.cache/vitscale``)
    per CPU model, thread count, dtype and torch version. ``refresh`` measures again and keeps the
    best of the cached and the new figure: a matmul never runs faster than the peak, so the maximum
    over runs converges to it even on a machine that is busy with other work during one of them. A
    measurement during which the process did not have its cores (:func:`had_the_cpu`) is not cached.
    """
    device = torch.device(device)
    key = dtype_key(dtype)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if key == "fp32" and torch.backends.cuda.matmul.allow_tf32:
            key = "tf32"
        hit = lookup_peak(name, key)
        if hit is not None:
            return hit
        tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(key, torch.float32)
        return measure_matmul_tflops(
            device, tdtype, size=8192
        ), f"measured {key} matmul on {name} (not in table)"
    if device.type != "cpu":
        raise ValueError(f"no peak for device type {device.type!r}")
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(key, torch.float32)
    threads = torch.get_num_threads()
    cpu = _cpu_name()
    cache_key = f"{cpu}|threads={threads}|{key}|torch={torch.__version__}"
    path = _cache_path()
    table: dict[str, float] = {}
    if cache and path.exists():
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {}
        if cache_key in table and not refresh:
            return float(table[cache_key]), f"measured {key} 1024^3 matmul, {threads} threads, {cpu} (cached)"
    cpu0, wall0 = time.process_time(), time.perf_counter()
    value = measure_matmul_tflops("cpu", tdtype, size=1024, min_time=1.0)  # best of many short runs
    if not had_the_cpu(time.process_time() - cpu0, time.perf_counter() - wall0, threads):
        # other work ran on these cores meanwhile: a figure below the peak, which, cached, would put a later
        # run on an idle machine over 100% MFU; used for this run only, the next measures again
        return max(value, float(table.get(cache_key, 0.0))), (
            f"measured {key} 1024^3 matmul, {threads} threads, {cpu} (the cores were shared: not cached)")
    if cache_key in table:
        value = max(value, float(table[cache_key]))
    if cache:
        table[cache_key] = value
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
            tmp.replace(path)
        except OSError:
            pass  # a read-only home: measure again next time
    return value, f"measured {key} 1024^3 matmul, {threads} threads, {cpu} (best of runs)"


def step_flops_per_image(forward_flops_per_image: float, mode: str) -> float:
    """FLOPs of one image in a step: the forward for inference, 3x the forward for training."""
    if mode not in ("train", "infer"):
        raise ValueError(f"mode must be 'train' or 'infer', got {mode!r}")
    return forward_flops_per_image * (3 if mode == "train" else 1)


def achieved_tflops(img_per_s: float, forward_flops_per_image: float, mode: str) -> float:
    """Model TFLOP/s achieved at ``img_per_s`` images per second."""
    return img_per_s * step_flops_per_image(forward_flops_per_image, mode) / 1e12


def mfu(img_per_s: float, forward_flops_per_image: float, mode: str, peak: float) -> float:
    """Model FLOPs utilisation in percent (0-100): achieved TFLOP/s over the peak TFLOP/s."""
    return mfu_percent(achieved_tflops(img_per_s, forward_flops_per_image, mode), peak)


def mfu_percent(tflops: float, peak: float) -> float:
    """MFU in percent of ``tflops`` achieved against ``peak`` TFLOP/s (vitscale writes every ratio in
    percent: ``vitscale.tools.units``)."""
    if peak <= 0:
        raise ValueError("peak TFLOP/s must be positive")
    return 100.0 * tflops / peak


__all__ = [
    "PEAK_TABLE",
    "achieved_tflops",
    "dtype_key",
    "lookup_peak",
    "measure_matmul_tflops",
    "mfu",
    "mfu_percent",
    "peak_tflops",
    "step_flops_per_image",
]
