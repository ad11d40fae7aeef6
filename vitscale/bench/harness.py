"""Training / inference throughput of a model, optionally against a reference implementation.

Every implementation gets the same synthetic batch, the same loss, optimizer and precision. After
untimed warm-up steps (compilation happens there) and one warm-up round that is timed but not counted
(the first round after the warm-up steps ran 2.5x slower than the others on a CPU: caches, allocator
and thread pools settle there), the timed steps are split into rounds and the implementations
alternate round by round (ours, theirs, theirs, ours, ...), so drift of the machine (clocks, other
processes) hits all of them alike. The headline ratio is the median of the per-round ratios (robust
to a round disturbed by other work); the ratio of the overall rates is kept beside it. A round is
timed with CUDA events on a GPU (one synchronisation at its end, none inside a step) and with
``time.perf_counter`` on a CPU.

Sizes left unset take the device's defaults (``DEFAULTS``): on a GPU 20 timed steps of batch 32; on a
CPU a quick run, about a minute for ViT-S/16 against timm on 2 idle cores.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch import nn

from ..config import Config
from ..config.schema import ModelConfig, TrainConfig
from ..distributed.compile import mark_step, uses_cudagraphs
from ..distributed.config import PrecisionConfig
from ..distributed.fsdp import resolve_precision
from ..distributed.parallel_dims import resolve_device
from ..run import assemble
from ..tasks import get_task
from ..tools import mfu as mfu_tools
from ..tools.device_memory import read_peak
from ..train import fastpath

COMPARES = ("timm", "open_clip")
# Default sizes per device type: (batch_size, steps, warmup, rounds).
DEFAULTS = {"cuda": (32, 20, 3, 5), "cpu": (8, 10, 2, 5)}
PRECISIONS = ("auto", "fp32", "bf16")
_AUTOCAST = {"auto": "auto", "fp32": "none", "bf16": "bf16"}  # --precision -> precision.autocast


@dataclass
class BenchSettings:
    model: str
    """Registered variant name (``vitscale models``)."""
    mode: str = "train"
    """``train`` (forward + backward + AdamW step) or ``infer`` (forward under inference_mode)."""
    device: str = "auto"
    """``auto`` (cuda if available), ``cpu`` or ``cuda``."""
    batch_size: int | None = None
    """Images per step; None = the device's default (``DEFAULTS``: 32 on a GPU, 8 on a CPU)."""
    steps: int | None = None
    """Timed steps per implementation, split over ``rounds``; None = 20 on a GPU, 10 on a CPU."""
    warmup: int | None = None
    """Untimed steps per implementation first (compilation, allocator and autotuning warm-up);
    None = 3 on a GPU, 2 on a CPU. A warm-up round, timed but not counted, follows them."""
    rounds: int | None = None
    """Timed rounds; implementations alternate round by round; None = 5."""
    compile: bool | None = None
    """torch.compile each of our transformer blocks; None = on for CUDA, off on CPU."""
    compare: str | None = None
    """Reference implementation to run alongside: ``timm`` (ViT, VOLO) or ``open_clip`` (CLIP): the
    library's model built by the family's state-dict adapter."""
    compare_compiled: bool | None = None
    """Also run the reference torch.compile'd (whole model); None = when ``compile`` is on."""
    precision: str = "auto"
    """``auto`` (bf16 on CUDA, fp32 on CPU), ``bf16`` (autocast; pure bf16 weights for infer) or ``fp32``."""
    sdpa: str = "auto"
    """SDPA backends: auto (flash > cuDNN > efficient > math), flash, cudnn, efficient, math, default."""
    seed: int = 0
    """Seed of the weights and the synthetic batch."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Overrides of the variant's config (e.g. ``{"num_classes": 10}``)."""
    task: str | None = None
    """The task whose loss the training step times (``Task.bench_loss``); None = the family's task."""
    fp8: str = "none"
    """Our blocks' linear layers in float8 (torchao recipe, as ``precision.fp8``); training only."""
    fp8_filter: str = "auto"
    """Which block linears go to float8 (as ``precision.fp8_filter``)."""
    compile_mode: str = "default"
    """``torch.compile`` mode of our per-block compile (as ``train.compile_mode``)."""
    residual: str = "fp32"
    """Our blocks' residual stream under bf16 autocast (as ``precision.residual``): fp32 | bf16."""
    mlp_epilogue: str = "none"
    """Our blocks' GELU MLP in cuBLASLt epilogues (as ``precision.mlp_epilogue``): none | cublaslt | cublaslt_tanh."""
    profile_top: int = 0
    """After the timed rounds, profile one step of each implementation and keep its ``profile_top``
    operators with the most device (CUDA) or CPU self time, ms per step (``top_ops`` in the JSON); 0 = none."""
    baseline: dict[str, Any] = field(default_factory=dict)
    """A second copy of ours with these settings changed (``fp8``, ``fp8_filter``, ``compile_mode``,
    ``residual``, ``mlp_epilogue`` or fields of the model config), alternating rounds with ours: ``speedup_vs_baseline`` (e.g.
    ``{"fp8": "none"}``: fp8 against bf16; ``{"parallel_block": False}``: ViT-22B block against the plain one)."""


BASELINE_SETTINGS = ("fp8", "fp8_filter", "compile_mode", "residual", "mlp_epilogue")


def baseline_settings(settings: BenchSettings) -> BenchSettings:
    """``settings`` with ``settings.baseline`` applied (bench settings, or model config overrides)."""
    changed = {k: v for k, v in settings.baseline.items() if k in BASELINE_SETTINGS}
    model = {k: v for k, v in settings.baseline.items() if k not in BASELINE_SETTINGS}
    return replace(settings, overrides={**settings.overrides, **model}, baseline={}, **changed)


@dataclass
class _Impl:
    key: str
    label: str
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    step: Callable[[], None]
    times: list[float] = field(default_factory=list)
    cpu_times: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    peak_bytes: int | None = None
    cudagraphs: bool = False

    def release(self) -> None:
        """Free gradients between rounds so the other implementation's peak does not include them."""
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

    def resident_bytes(self) -> int:
        n = sum(p.numel() * p.element_size() for p in self.model.parameters())
        n += sum(b.numel() * b.element_size() for b in self.model.buffers())
        if self.optimizer is not None:
            for st in self.optimizer.state.values():
                n += sum(t.numel() * t.element_size() for t in st.values() if torch.is_tensor(t))
        return n


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({mfu_tools._cpu_name()}, {torch.get_num_threads()} threads)"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------- workloads
def _make_step(
    model, optimizer, inputs, labels, loss_fn, mode, device, autocast: torch.dtype | None, cudagraphs: bool = False
) -> Callable[[], None]:
    if mode == "infer":

        def infer_step() -> None:
            with torch.inference_mode(), fastpath.autocast(device, autocast):
                model(*inputs)

        return infer_step

    targets = [labels]

    def train_step() -> None:
        if cudagraphs:
            mark_step()  # CUDA-graph trees: the last step's graph outputs may be overwritten now
        # The labels move one image along every step (a device op, no sync): a model that saw one
        # batch with fixed labels would learn it within tens of steps, its loss would fall towards 0
        # and the softmax's tiny probabilities and gradients would turn subnormal — on a CPU many
        # times slower to compute with, a regime no real training step is in.
        targets[0] = targets[0].roll(1)
        with fastpath.autocast(device, autocast):
            out = model(*inputs)
            loss = loss_fn(out, targets[0])  # the task's bench loss (vitscale.tasks.base.Task.bench_loss)
        loss.backward()  # no .item(): nothing in the step waits for the device
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return train_step


def resolve_autocast(precision: str, device: torch.device) -> torch.dtype | None:
    """``--precision`` (auto | fp32 | bf16) on ``device`` -> the autocast dtype (None = fp32)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return resolve_precision(PrecisionConfig(autocast=_AUTOCAST[precision]), device).autocast


def run_config(settings: BenchSettings) -> Config:
    """The run config of ``settings``: the model, device, seed, per-block compile and autocast."""
    if settings.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {settings.precision!r}")
    if settings.fp8 != "none" and settings.mode != "train":
        raise ValueError("--fp8 is a training recipe: use --mode train")
    return Config(
        model=ModelConfig(name=settings.model, overrides=dict(settings.overrides)),
        train=TrainConfig(device=settings.device, seed=settings.seed, compile=settings.compile, batch_size=settings.batch_size,
                          compile_mode=settings.compile_mode),  # fmt: skip
        precision=PrecisionConfig(autocast=_AUTOCAST[settings.precision], fp8=settings.fp8, fp8_filter=settings.fp8_filter,
                                  residual=settings.residual, mlp_epilogue=settings.mlp_epilogue),  # fmt: skip
    )


def with_defaults(settings: BenchSettings, device_type: str) -> BenchSettings:
    """``settings`` with the sizes it leaves unset (None) taken from ``DEFAULTS`` for ``device_type``
    (``cuda`` or ``cpu``)."""
    batch, steps, warmup, rounds = DEFAULTS["cuda" if device_type == "cuda" else "cpu"]
    return replace(
        settings,
        batch_size=batch if settings.batch_size is None else settings.batch_size,
        steps=steps if settings.steps is None else settings.steps,
        warmup=warmup if settings.warmup is None else settings.warmup,
        rounds=rounds if settings.rounds is None else settings.rounds,
    )


# ---------------------------------------------------------------------------------- run
def build_impls(settings: BenchSettings) -> tuple[list[_Impl], dict]:
    if settings.compare is not None and settings.compare not in COMPARES:
        raise ValueError(f"--compare must be one of {COMPARES}, got {settings.compare!r}")
    run = assemble(run_config(settings), "bench")  # ours: fp8 and per-block compile by the parallelize tail
    task = settings.task or run.family.task
    loss_fn = get_task(task).bench_loss
    adapter = run.family.adapter(settings.compare) if settings.compare else None  # one line if the family has none
    device, ours, compile_on = run.device, run.model, run.cfg.train.compile
    compare_compiled = compile_on if settings.compare_compiled is None else settings.compare_compiled
    autocast = run.precision.autocast
    pure_infer = settings.mode == "infer" and autocast == torch.bfloat16  # pure bf16 weights, no autocast
    inputs = ours.example_inputs(settings.batch_size, device)
    labels = torch.randint(0, ours.num_classes or 1000, (settings.batch_size,), device=device)
    if pure_infer:
        inputs = tuple(t.to(torch.bfloat16) if t.is_floating_point() else t for t in inputs)
        autocast = None

    def finish(key: str, label: str, model: nn.Module, whole_compile: bool = False, cudagraphs: bool = False):
        if pure_infer:
            model = model.to(torch.bfloat16)
        model.train(settings.mode == "train")
        if whole_compile:
            model.compile()
        opt = None
        if settings.mode == "train":
            opt = fastpath.make_adamw([p for p in model.parameters() if p.requires_grad], device)
        step = _make_step(model, opt, inputs, labels, loss_fn, settings.mode, device, autocast, cudagraphs)
        return _Impl(key, label, model, opt, step, cudagraphs=cudagraphs)

    impls = [finish("vitscale", f"vitscale {settings.model}", ours, cudagraphs=compile_on and uses_cudagraphs(settings.compile_mode))]
    fp8_lines = [run.float8.summary()] if settings.fp8 != "none" else []
    if settings.baseline:
        base_settings = baseline_settings(settings)
        torch.manual_seed(settings.seed)
        base = assemble(run_config(base_settings), "bench")
        what = ", ".join(f"{k}={v}" for k, v in settings.baseline.items())
        cudagraphs = compile_on and uses_cudagraphs(base_settings.compile_mode)
        impls.append(finish("baseline", f"vitscale {settings.model} ({what})", base.model, cudagraphs=cudagraphs))
        if base_settings.fp8 != "none":
            fp8_lines.append(f"baseline: {base.float8.summary()}")
    if adapter is not None:
        from .reference import reference_model

        ref_key = settings.compare
        for key, comp in [(ref_key, False)] + ([(f"{ref_key}_compiled", True)] if compare_compiled else []):
            torch.manual_seed(settings.seed)
            ref, label = reference_model(adapter, ours, settings.model, device)
            impls.append(finish(key, label + (" (torch.compile)" if comp else ""), ref, whole_compile=comp))
    info = dict(
        # the family's count of one sample's forward, as this mode runs it (training: patch dropout applies)
        flops_img=run.family.forward_flops(run.model_cfg, None, training=settings.mode == "train"),
        task=task, compile=compile_on, compare_compiled=compare_compiled if settings.compare else None,
        device=device, precision="bf16" if run.precision.autocast == torch.bfloat16 else "fp32", fp8=fp8_lines,
    )  # fmt: skip
    return impls, info


def _time_round(impl: _Impl, n: int, device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        sync(device)
        start.record()
        for _ in range(n):
            impl.step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    for _ in range(n):
        impl.step()
    return time.perf_counter() - t0


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"


def _print(msg: str) -> None:
    print(msg, flush=True)  # flushed: the raw log of a long run shows progress as it goes


def run_bench(settings: BenchSettings, log: Callable[[str], None] = _print) -> dict[str, Any]:
    """Run the benchmark; returns the result dict (the JSON written by ``vitscale bench --json``)."""
    if settings.mode not in ("train", "infer"):
        raise ValueError(f"mode must be 'train' or 'infer', got {settings.mode!r}")
    settings = with_defaults(settings, resolve_device(settings.device).type)
    if settings.batch_size < 1 or settings.steps < 1 or settings.rounds < 1 or settings.warmup < 0:
        raise ValueError("batch_size, steps and rounds must be >= 1 and warmup >= 0")
    impls, info = build_impls(settings)
    device, precision, flops_img = info.pop("device"), info.pop("precision"), info.pop("flops_img")
    peak, peak_source = mfu_tools.peak_tflops(device, precision, refresh=device.type == "cpu")

    rounds = min(settings.rounds, settings.steps)
    per_round = [settings.steps // rounds + (1 if r < settings.steps % rounds else 0) for r in range(rounds)]
    with fastpath.sdpa_backend(settings.sdpa):
        log(
            f"bench {settings.model} {settings.mode} on {device_description(device)}: batch {settings.batch_size}, "
            f"{precision}, sdpa={settings.sdpa}, compile={info['compile']}; per implementation {settings.warmup} "
            f"warm-up steps, a warm-up round of {per_round[0]} (not counted), {settings.steps} timed steps in "
            f"{rounds} rounds; forward {flops_img / 1e9:.3f} GFLOP/img, peak {peak:.2f} TFLOP/s ({peak_source})"
        )
        step_s = {}  # the last warm-up step's time per implementation: what the rest will take
        for impl in impls:
            t0 = t_step = time.perf_counter()
            for _ in range(settings.warmup):
                t_step = time.perf_counter()
                impl.step()
                sync(device)
            now = time.perf_counter()
            step_s[impl.key] = now - t_step if settings.warmup else 0.0
            impl.release()
            log(f"  warm-up {impl.label}: {now - t0:.1f} s")
        if settings.warmup:
            rest = sum(step_s.values()) * (per_round[0] + settings.steps)
            log(f"  the warm-up round and the timed rounds take about {_duration(rest)} more")
        warm: dict[str, float] = {}
        for r, n in [(-1, per_round[0]), *enumerate(per_round)]:  # round -1: the warm-up round
            order = impls if r % 2 == 0 else impls[::-1]
            for impl in order:
                if r < 0:
                    dt = _time_round(impl, n, device)
                    impl.release()
                    warm[impl.key] = n * settings.batch_size / dt
                    log(f"  warm-up round {impl.key}: {warm[impl.key]:.2f} img/s ({dt / n * 1e3:.1f} ms/step, not counted)")
                    continue
                others = sum(o.resident_bytes() for o in impls if o is not impl)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                c0 = time.process_time()
                dt = _time_round(impl, n, device)
                impl.cpu_times.append(time.process_time() - c0)
                if device.type == "cuda":  # under CUDA graphs the reserved peak (tools/device_memory.py)
                    own = read_peak(device, impl.cudagraphs, reset=False) - others
                    impl.peak_bytes = max(impl.peak_bytes or 0, own)
                impl.times.append(dt)
                impl.steps.append(n)
                impl.release()
                log(
                    f"  round {r + 1}/{rounds} {impl.key}: {n * settings.batch_size / dt:.2f} img/s ({dt / n * 1e3:.1f} ms/step)"
                )
        top_ops = {}
        if settings.profile_top > 0:
            from .profile import op_times, top

            for impl in impls:  # after the timing: the profiler's overhead stays out of the figures
                top_ops[impl.key] = top(op_times(impl.step, device), settings.profile_top)
                impl.release()

    out: dict[str, Any] = {
        "model": settings.model,
        "mode": settings.mode,
        "device": device_description(device),
        "batch_size": settings.batch_size,
        "flops_per_img": flops_img,
        "peak_tflops": peak,
    }
    for impl in impls:
        total = sum(impl.times)
        ips = sum(impl.steps) * settings.batch_size / total
        per = [n * settings.batch_size / t for n, t in zip(impl.steps, impl.times)]
        out[impl.key] = {
            "img_per_s": ips,
            "tflops": mfu_tools.achieved_tflops(ips, flops_img, settings.mode),
            "mfu": mfu_tools.mfu(ips, flops_img, settings.mode, peak),
            "peak_mem_gb": None if impl.peak_bytes is None else impl.peak_bytes / 1e9,
            "round_img_per_s": per,
            "warmup_round_img_per_s": warm[impl.key],
            "implementation": impl.label,
        }
        if impl.key in top_ops:
            out[impl.key]["top_ops"] = [[name, ms] for name, ms in top_ops[impl.key]]
        if device.type == "cpu":
            # CPU seconds of this process (all its threads): less sensitive than wall time to other
            # processes competing for the cores, though it also counts threads spinning at barriers.
            out[impl.key]["img_per_cpu_s"] = sum(impl.steps) * settings.batch_size / sum(impl.cpu_times)
            out[impl.key]["round_cpu_s"] = impl.cpu_times
    ref = settings.compare
    out["speedup"] = out["vitscale"]["img_per_s"] / out[ref]["img_per_s"] if ref else None
    if ref:
        # The headline, robust to a busy machine: the median over rounds of ours / theirs in the same
        # round ("speedup" above: the ratio of the overall rates, i.e. of the mean step times).
        ratios = [a / b for a, b in zip(out["vitscale"]["round_img_per_s"], out[ref]["round_img_per_s"])]
        out["speedup_median_round"] = statistics.median(ratios)
        out["speedup_rounds"] = ratios
        if device.type == "cpu":
            out["speedup_cpu_time"] = out["vitscale"]["img_per_cpu_s"] / out[ref]["img_per_cpu_s"]
    if "baseline" in out:
        ratios = [a / b for a, b in zip(out["vitscale"]["round_img_per_s"], out["baseline"]["round_img_per_s"])]
        out["speedup_vs_baseline"] = out["vitscale"]["img_per_s"] / out["baseline"]["img_per_s"]
        out["speedup_vs_baseline_median_round"] = statistics.median(ratios)
    if ref and f"{ref}_compiled" in out:
        out["speedup_vs_compiled"] = out["vitscale"]["img_per_s"] / out[f"{ref}_compiled"]["img_per_s"]
        ratios = [a / b for a, b in zip(out["vitscale"]["round_img_per_s"], out[f"{ref}_compiled"]["round_img_per_s"])]
        out["speedup_vs_compiled_median_round"] = statistics.median(ratios)
    out["torch"] = torch.__version__
    from .report import git_commit

    out["commit"] = git_commit()
    out["peak_source"] = peak_source
    out["step_flops_per_img"] = mfu_tools.step_flops_per_image(flops_img, settings.mode)
    out["settings"] = {
        **asdict(settings),
        "precision": precision,
        "device": str(device),
        **info,
        "rounds": rounds,
        "peak_mem": "peak allocated (under CUDA graphs: reserved, whose pools replays use without allocating) "
        "during own rounds minus the other implementations' resident params/buffers/optimizer state (CUDA only)",
    }
    out["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _log_summary(out, log)
    return out


def _log_summary(out: dict[str, Any], log: Callable[[str], None]) -> None:
    log(f"{'implementation':<44} {'img/s':>10} {'TFLOP/s':>9} {'MFU':>7} {'peak GB':>8}")
    for v in out.values():
        if isinstance(v, dict) and "img_per_s" in v:
            mem = "-" if v["peak_mem_gb"] is None else f"{v['peak_mem_gb']:.2f}"
            log(
                f"{v['implementation']:<44} {v['img_per_s']:>10.2f} {v['tflops']:>9.4f} {v['mfu']:>6.2f}% {mem:>8}"
            )
    for v in out.values():
        if isinstance(v, dict) and v.get("top_ops"):
            total = sum(ms for _, ms in v["top_ops"])
            log(f"top operators of {v['implementation']} (self ms per step; these {len(v['top_ops'])}: {total:.2f} ms):")
            for name, ms in v["top_ops"]:
                log(f"  {ms:9.3f}  {name[:110]}")
    for line in out["settings"].get("fp8") or []:
        log(f"  {line}")
    if "speedup_vs_baseline" in out:
        log(
            f"speedup vitscale / baseline ({out['baseline']['implementation']}): "
            f"{out['speedup_vs_baseline_median_round']:.3f}x (median of per-round ratios; overall "
            f"{out['speedup_vs_baseline']:.3f}x)"
        )
    if out.get("speedup") is not None:
        n = len(out["speedup_rounds"])
        msg = f"speedup vitscale / {out['settings']['compare']}: {out['speedup_median_round']:.3f}x"
        msg += f" (median of {n} per-round ratios; overall {out['speedup']:.3f}x)"
        if "speedup_cpu_time" in out:
            msg += f"; per CPU-second {out['speedup_cpu_time']:.3f}x"
        if "speedup_vs_compiled" in out:
            msg += (f"; vs compiled: {out['speedup_vs_compiled_median_round']:.3f}x (median; overall "
                    f"{out['speedup_vs_compiled']:.3f}x)")
        log(msg)


__all__ = [
    "BenchSettings", "COMPARES", "DEFAULTS", "PRECISIONS", "build_impls", "resolve_autocast",
    "run_bench", "run_config", "sync", "with_defaults",
]  # fmt: skip
