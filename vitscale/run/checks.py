"""Up-front checks of a run: the config against itself, the layout and the machine, before any data is
read or any model is built. :func:`vitscale.run.assemble` calls :func:`check_run` first; a check
that needs nothing but the config and the layout belongs here, so it fails in one readable line
instead of deep inside the first step.
"""

from __future__ import annotations

import torch

from ..config import Config
from ..distributed.compile import check_compile_mode
from ..distributed.float8 import check_recipe, fp8_emulated, require_torchao
from ..distributed.fsdp import fsdp_runs_on
from ..distributed.parallel_dims import ParallelDims


def check_run(cfg: Config, dims: ParallelDims, purpose: str) -> None:
    """ValueError / RuntimeError naming the setting to change, for a run of ``purpose``."""
    if dims.distributed and not fsdp_runs_on(dims.device.type):  # not an AttributeError in the first step
        raise RuntimeError(
            f"multi-process training wraps the model in FSDP2, which cannot train on CPU with torch "
            f"{torch.__version__} (its CPU streams lack record_event): train on CUDA, or on CPU with a "
            "newer torch (2.11 and 2.15 checked)"
        )
    if purpose in ("train", "bench"):
        check_compile_mode(cfg.train.compile_mode, compile=bool(cfg.train.compile), device_type=dims.device.type,
                           world_size=dims.world_size)  # fmt: skip
        if cfg.precision.fp8 != "none":
            check_recipe(cfg.precision.fp8, cfg.precision.fp8_filter)
            require_torchao()  # before any data is read: one line on how to install it
            fp8_emulated(dims.device)  # an older GPU: refused with the reason
    if purpose == "train":
        tc = cfg.train
        if tc.batch_size % (dims.dp_size * tc.grad_accum):
            raise ValueError(
                f"train.batch_size={tc.batch_size} must be divisible by data-parallel size {dims.dp_size} x "
                f"train.grad_accum {tc.grad_accum}"
            )


__all__ = ["check_run"]
