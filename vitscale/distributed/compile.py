"""Per-block ``torch.compile``: each transformer block compiled in place (``nn.Module.compile``),
so parameter names are unchanged and identical blocks reuse one compiled graph.

Compile modes (``train.compile_mode``, ``vitscale bench --compile-mode``), as ``torch.compile``
names them: ``default``; ``reduce-overhead`` records each compiled block as a CUDA graph and
replays it (one launch instead of one per kernel, which pays when kernels are short: small
batches, small widths); ``max-autotune-no-cudagraphs`` benchmarks GEMM / Triton configurations at
compile time; ``max-autotune`` does both. CUDA graphs replay fixed memory addresses and fixed
shapes, so the CUDA-graph modes come with guards (:func:`check_compile_mode`,
:func:`check_graph_inputs`, :class:`StaticShapes`) and a step marker (:func:`mark_step`), after
PyTorch's "CUDAGraph Trees" notes (docs.pytorch.org/docs/stable/torch.compiler_cudagraph_trees.html).
"""

from __future__ import annotations

import typing
from collections.abc import Sequence

import torch
from torch import nn

from vitscale.errors import ConfigError  # a setting that cannot run here: one line from the CLI

from .config import CompileBackend, CompileMode

COMPILE_MODES = typing.get_args(CompileMode)  # the choices of train.compile_mode, declared once in its field
COMPILE_BACKENDS = typing.get_args(CompileBackend)  # train.compile_backend's
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


def apply_compile(blocks: Sequence[nn.Module], fullgraph: bool = False, mode: str = "default",
                  backend="inductor", **kwargs) -> None:  # fmt: skip
    """Compile every block in place with ``backend`` (a mode is inductor's: the others take none); call
    after activation checkpointing and before FSDP."""
    if mode not in COMPILE_MODES:
        raise ConfigError(f"compile mode must be one of {', '.join(COMPILE_MODES)}; got {mode!r}")
    if isinstance(backend, str) and backend not in COMPILE_BACKENDS:  # a callable: a test's own backend
        raise ConfigError(f"compile backend must be one of {', '.join(COMPILE_BACKENDS)}; got {backend!r}")
    for block in blocks:
        block.compile(fullgraph=fullgraph, backend=backend, mode=mode if backend == "inductor" else None, **kwargs)


def uses_cudagraphs(mode: str) -> bool:
    return mode in CUDAGRAPH_MODES


def check_compile_mode(mode: str, *, compile: bool, device_type: str, world_size: int, backend: str = "inductor") -> None:
    """Refuse, in one line, a compile mode that cannot run as asked: any mode but ``default``
    without compile or with a backend other than inductor (the modes are inductor's); the CUDA-graph
    modes off CUDA or under several processes (FSDP2 / TP issue collectives and hooks around every
    block, which a recorded graph would replay without)."""
    if mode not in COMPILE_MODES:
        raise ConfigError(f"train.compile_mode must be one of {', '.join(COMPILE_MODES)}; got {mode!r}")
    if backend not in COMPILE_BACKENDS:
        raise ConfigError(f"train.compile_backend must be one of {', '.join(COMPILE_BACKENDS)}; got {backend!r}")
    if mode == "default":
        return
    if backend != "inductor":
        raise ConfigError(f"train.compile_mode={mode} is inductor's; train.compile_backend={backend} takes none (use default)")
    if not compile:
        raise ConfigError(f"train.compile_mode={mode} needs train.compile=true (per-block torch.compile)")
    if not uses_cudagraphs(mode):
        return
    if device_type != "cuda":
        raise ConfigError(
            f"train.compile_mode={mode} records CUDA graphs, which need a CUDA device (this run is on "
            f"{device_type}): use max-autotune-no-cudagraphs or default"
        )
    if world_size > 1:
        raise ConfigError(
            f"train.compile_mode={mode}: CUDA graphs of the blocks are not supported with FSDP2 / tensor "
            f"parallelism ({world_size} processes); use max-autotune-no-cudagraphs or default"
        )


def same_device(have: torch.device, want: torch.device | str) -> bool:
    """``cuda:0`` is on ``cuda`` (the trainer's device names no index: the current one)."""
    want = torch.device(want)
    return have.type == want.type and (want.index is None or have.index == want.index)


def check_graph_inputs(model: nn.Module, device: torch.device) -> None:
    """CUDA graphs keep no CPU tensor: every parameter and buffer must live on the CUDA device
    (torch.compile would otherwise quietly skip the graph for that block)."""
    off = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if not same_device(t.device, device)]
    if off:
        more = f" and {len(off) - 3} more" if len(off) > 3 else ""
        raise ConfigError(
            f"CUDA graphs need every tensor of the model on {device}; {', '.join(off[:3])}{more} are not"
        )


class StaticShapes:
    """A recorded CUDA graph replays one input shape; a new shape records another graph (memory and
    a pause each time). Training batches have one shape (the training loader drops the last partial
    batch); this checks it, step by step, so a change is an error naming the shapes."""

    def __init__(self) -> None:
        self.shapes: dict[str, tuple[int, ...]] | None = None

    def check(self, batch: dict) -> None:
        shapes = {k: tuple(v.shape) for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
        if self.shapes is None:
            self.shapes = shapes
            return
        changed = {k: (self.shapes.get(k), s) for k, s in shapes.items() if self.shapes.get(k) != s}
        if changed:
            k, (was, now) = next(iter(changed.items()))
            raise RuntimeError(
                f"CUDA graphs (train.compile_mode) need one batch shape: batch[{k!r}] was {was}, now {now}"
            )


def mark_step() -> None:
    """Tell CUDA-graph trees that a new training step begins: the outputs of the previous replays may
    be overwritten (without it, a tensor kept from the last step raises instead of being reused)."""
    torch.compiler.cudagraph_mark_step_begin()


def bound_recompiles(shapes: int) -> None:
    """Under ``train.compile`` with ``shapes`` input shapes (variable resolution): each shape compiles
    once with static shapes and is kept (dynamo's automatic dynamic shapes off, its cache large enough),
    never a recompile per step. The opening lines of the run say so."""
    import torch._dynamo

    torch._dynamo.config.automatic_dynamic_shapes = False
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, shapes + 1)
    if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
        limit = torch._dynamo.config.accumulated_cache_size_limit
        torch._dynamo.config.accumulated_cache_size_limit = max(limit, 4 * (shapes + 1))


__all__ = [
    "COMPILE_MODES",
    "CUDAGRAPH_MODES",
    "StaticShapes",
    "apply_compile",
    "bound_recompiles",
    "check_compile_mode",
    "check_graph_inputs",
    "mark_step",
    "same_device",
    "uses_cudagraphs",
]
