"""Where DINO's training-only parts live under torchrun (:mod:`vitscale.tasks.dino`): FSDP2 data
parallelism. The teacher's backbone is a second model parallelized exactly as the student (the run's
:meth:`~vitscale.run.assemble.Run.new_model`, as the trainer's EMA copy), its values copied shard by
shard; every head (the student's and the teacher's) and the mask token are FSDP2 units of their own on
the same data-parallel mesh, built from the same keyed weights on every rank. The teacher's parameters
are then sharded exactly as the student's, so the EMA update is element-wise on the local shards, with
no communication (DINOv3 does the same: facebookresearch/dinov3 ``dinov3/train/ssl_meta_arch.py``
``update_ema``; ``dinov3/fsdp/ac_compile_parallelize.py``). One process: plain copies.

Tensor parallelism has no plan for the heads yet: :func:`check_layout` (``DinoTask.check``) refuses it
in one line."""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn

from vitscale.errors import CheckError


def check_layout(dims) -> None:
    """One line before any data is read or model built for a layout the parts cannot take
    (``parallel.tp > 1``; a prototype count TP could not split is then moot)."""
    if dims.distributed and dims.tp_enabled:
        raise CheckError(f"train.task=dino with parallel.tp={dims.tp}: the DINO / iBOT heads and the teacher have no "
                          "tensor-parallel plan yet; use FSDP2 data parallelism (parallel.tp=1)")  # fmt: skip


def teacher_backbone(run, model: nn.Module) -> nn.Module:
    """A copy of ``model`` (its parameters and buffers), laid out as ``model``: a deep copy in one
    process, else a new model parallelized as the run's, given ``model``'s local shards."""
    if not run.dims.distributed:
        return copy.deepcopy(model)
    from vitscale.train.ema import _local

    teacher = run.new_model()
    own = [(n, p) for n, p in model.named_parameters() if not n.startswith("task_parts.")]
    with torch.no_grad():
        for (n, d), (m, s) in zip(teacher.named_parameters(), own, strict=True):
            assert n == m, (n, m)
            _local(d).copy_(_local(s.detach()))
        for d, s in zip(teacher.buffers(), model.buffers()):
            _local(d).copy_(_local(s))
    return teacher


def shard_units(run, units: Iterable[nn.Module | None]) -> None:
    """Each of ``units`` an FSDP2 unit on the run's data-parallel mesh with its mixed precision (as MAE's
    decoder); nothing in one process."""
    if not run.dims.distributed:
        return
    from vitscale.distributed.fsdp import dp_mesh_for, fully_shard, mixed_precision_policy, resolve_precision

    prec = resolve_precision(run.cfg.precision, run.device)
    mp = mixed_precision_policy(prec.param_dtype, prec.reduce_dtype)
    for unit in units:
        if unit is not None:
            # resharded after each forward, as a unit below a root: the teacher's then gather its new values
            fully_shard(unit, mesh=dp_mesh_for(run.dims), mp_policy=mp, reshard_after_forward=True)


def keep_root_gathered(run, backbone: nn.Module) -> None:
    """The parameters the root FSDP2 unit of ``backbone`` holds (norms, attention pool) stay gathered
    after its forward (FSDP2's own default for a root), so that DINO can pool and normalise its tokens
    (``forward_head``, ``fc_norm``) after the forward; the student's are resharded by its backward,
    the teacher's by :func:`release`."""
    if run.dims.distributed:
        backbone.set_reshard_after_forward(False, recurse=False)


def release(backbone: nn.Module) -> None:
    """Reshard every FSDP2 unit of the teacher's ``backbone`` after its use in a step (its root and its
    last block stay gathered after a forward, for a backward the teacher never runs), so that the next
    step gathers the EMA's new values; nothing in one process."""
    for m in backbone.modules():
        if hasattr(m, "reshard") and hasattr(m, "unshard"):  # an FSDPModule
            m.reshard()


__all__ = ["check_layout", "keep_root_gathered", "release", "shard_units", "teacher_backbone"]
