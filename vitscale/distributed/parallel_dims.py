"""The parallel layout: ``dp_replicate x dp_shard x tp`` ranks and the DeviceMesh built from it.

Mesh dimensions, outermost first: ``dp_replicate`` (plain data parallel / HSDP replicas),
``dp_shard`` (FSDP2 sharding of parameters, gradients and optimizer state), ``tp`` (DTensor tensor +
sequence parallel, innermost so its collectives stay inside a node). The layout is validated
before anything is built, with errors that say which setting to change.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..errors import EXIT_USAGE, UserError

MESH_DIMS = ("dp_replicate", "dp_shard", "tp")


class LayoutError(UserError, ValueError):
    """An impossible parallel layout; the message says what to change."""

    exit_code = EXIT_USAGE


@dataclass
class ParallelDims:
    """Sizes of the three mesh dimensions and the mesh once built (``None`` on one process)."""

    dp_replicate: int = 1
    """Replicas of the model (data parallel across them; with ``dp_shard > 1`` this is HSDP)."""
    dp_shard: int = 1
    """Ranks one replica is sharded over with FSDP2 (resolved: never -1 here)."""
    tp: int = 1
    """Tensor-parallel degree (heads and MLP hidden units split across this many ranks)."""
    world_size: int = 1
    """Number of processes; always the product of the three sizes."""
    rank: int = 0
    """Global rank of this process."""
    local_rank: int = 0
    """Rank within the node (selects the GPU)."""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    """The device this rank computes on."""
    mesh: Any = None
    """The 3-D DeviceMesh ``(dp_replicate, dp_shard, tp)``; None when ``world_size == 1``."""
    dp_mesh: Any = None
    """HSDP x TP only: the 1-D mesh of all data-parallel ranks of this TP rank, ``dp_replicate x
    dp_shard`` flattened (kept here: torch deprecates slicing a flattened dimension from the root)."""

    @classmethod
    def from_sizes(cls, dp_replicate: int = 1, dp_shard: int = -1, tp: int = 1, world_size: int = 1, **kw):
        """Resolve ``dp_shard=-1`` to "the rest" and validate the product against ``world_size``."""
        for name, v in (("dp_replicate", dp_replicate), ("tp", tp)):
            if not isinstance(v, int) or v < 1:
                raise LayoutError(f"parallel.{name} must be an integer >= 1, got {v!r}")
        if not isinstance(dp_shard, int) or (dp_shard < 1 and dp_shard != -1):
            raise LayoutError(f"parallel.dp_shard must be -1 (the rest) or an integer >= 1, got {dp_shard!r}")
        if dp_shard == -1:
            if world_size % (dp_replicate * tp):
                raise LayoutError(
                    f"world size {world_size} is not divisible by parallel.dp_replicate ({dp_replicate}) x "
                    f"parallel.tp ({tp}) = {dp_replicate * tp}: change parallel.dp_replicate / parallel.tp "
                    f"or the number of processes (torchrun --nproc-per-node)"
                )
            dp_shard = world_size // (dp_replicate * tp)
        product = dp_replicate * dp_shard * tp
        if product != world_size:
            raise LayoutError(
                f"parallel.dp_replicate ({dp_replicate}) x parallel.dp_shard ({dp_shard}) x parallel.tp ({tp}) = "
                f"{product}, but the world size is {world_size}: set parallel.dp_shard=-1 to use the rest, or "
                f"launch {product} processes"
            )
        return cls(dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp, world_size=world_size, **kw)

    # ------------------------------------------------------------------ properties
    @property
    def dp_size(self) -> int:
        """Data-parallel degree: how many different micro-batches are processed per micro-step."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel index (ranks of one TP group share it and see the same batch)."""
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def fsdp_enabled(self) -> bool:
        """Whether the model is wrapped by FSDP2 (sharding and/or data-parallel gradient reduction)."""
        return self.dp_size > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def tp_mesh(self):
        return self.mesh["tp"]

    def dp_group(self):
        """The process group of the data-parallel ranks that hold this rank's TP shard (the ranks whose
        batches, losses and evaluation results are combined), from the mesh; None = the whole world
        (no tensor parallelism, or one process)."""
        if not self.distributed or self.tp == 1:
            return None
        if self.dp_replicate > 1 and self.dp_shard > 1:
            return self.dp_mesh.get_group()
        return self.mesh["dp_replicate" if self.dp_replicate > 1 else "dp_shard"].get_group()

    def describe(self) -> str:
        parts = [f"world={self.world_size}", f"dp_replicate={self.dp_replicate}", f"dp_shard={self.dp_shard}"]
        parts.append(f"tp={self.tp}")
        mode = []
        if self.dp_replicate > 1 and self.dp_shard > 1:
            mode.append("HSDP")
        elif self.dp_shard > 1:
            mode.append("FSDP")
        elif self.dp_replicate > 1:
            mode.append("DP")
        if self.tp > 1:
            mode.append("TP+SP")
        return " ".join(parts) + (f" ({' x '.join(mode)})" if mode else " (single process)")


def _get(cfg: Any, name: str, default):
    if cfg is None:
        return default
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def resolve_device(device: str | torch.device | None = "auto", local_rank: int = 0) -> torch.device:
    """``auto`` -> this rank's GPU when CUDA is available, else the CPU; ``cuda`` without CUDA is an error."""
    if device is None or str(device) == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        from ..errors import ConfigError  # a GPU-only setting on a machine without one: one line, exit 2

        raise ConfigError("device cuda was asked for, and this machine has no GPU (CUDA is not available): "
                          "use device auto or cpu")  # fmt: skip
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
    return device


def use_device_settings(device: torch.device, cpu_threads: int = 0) -> None:
    """A training process's device settings: ``cpu_threads`` intra-op threads on the CPU (0: torch's
    default), TF32 matmuls and convolutions on CUDA."""
    if device.type == "cpu" and cpu_threads > 0:
        torch.set_num_threads(cpu_threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def world_info() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's environment (0, 0, 1 without torchrun)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), int(os.environ.get("LOCAL_RANK", dist.get_rank())), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def build_mesh(dims: ParallelDims):
    """The 3-D DeviceMesh ``(dp_replicate, dp_shard, tp)`` on ``dims.device`` (all sizes kept, even 1)."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = (dims.dp_replicate, dims.dp_shard, dims.tp)
    return init_device_mesh(dims.device.type, shape, mesh_dim_names=MESH_DIMS)


def init_distributed(parallel_cfg: Any = None, device: str | torch.device | None = "auto", timeout_s: int = 1800):
    """Set up the process group (NCCL on GPU, gloo on CPU) and the mesh; return :class:`ParallelDims`.

    Without torchrun (``WORLD_SIZE`` unset or 1) nothing is initialised and the layout is the single
    process one; ``parallel_cfg`` may then still ask for ``dp_shard=-1`` (resolves to 1), but any
    size > 1 is an error that says to launch with torchrun.
    """
    rank, local_rank, world = world_info()
    dp_replicate = _get(parallel_cfg, "dp_replicate", 1)
    dp_shard = _get(parallel_cfg, "dp_shard", -1)
    tp = _get(parallel_cfg, "tp", 1)
    dev = resolve_device(device, local_rank)
    dims = ParallelDims.from_sizes(
        dp_replicate, dp_shard, tp, world, rank=rank, local_rank=local_rank, device=dev
    )  # validates before any process group exists
    if world == 1:
        return dims
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        kw = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s), **kw)
    dims.mesh = build_mesh(dims)
    if dims.dp_replicate > 1 and dims.dp_shard > 1 and dims.tp > 1:  # one group of all data-parallel ranks,
        dims.dp_mesh = dims.mesh["dp_replicate", "dp_shard"]._flatten("dp")  # as torchtitan's ParallelDims
    return dims


def destroy_distributed(barrier: bool = False) -> None:
    """Leave the process group, and free what still holds its groups (a DeviceMesh, a model in
    reference cycles), while the process is whole. At the end of a command under torchrun: a process
    that leaves its gloo groups to the interpreter's teardown may abort ("terminate called without
    an active exception"; on 2 CPU ranks of torch 2.14, 16 of 40 launches of a script that only
    builds a mesh, 0 of 40 with this). ``barrier``: wait for every rank first (when all succeeded), so
    no rank tears down a group a peer still uses."""
    import gc

    if dist.is_available() and dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()
        gc.collect()


__all__ = [
    "LayoutError",
    "MESH_DIMS",
    "ParallelDims",
    "build_mesh",
    "destroy_distributed",
    "init_distributed",
    "resolve_device",
    "world_info",
]
