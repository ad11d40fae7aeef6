"""Where DINO's training-only parts live under torchrun (:mod:`vitscale.tasks.dino`): FSDP2 data
parallelism and tensor parallelism. The teacher's backbone is a second model parallelized exactly as the student (the run's
:meth:`~vitscale.run.assemble.Run.new_model`, as the trainer's EMA copy), its values copied shard by
shard; every head (the student's and the teacher's) and the mask token are FSDP2 units of their own on
the same data-parallel mesh, built from the same keyed weights on every rank. The teacher's parameters
are then sharded exactly as the student's, so the EMA update is element-wise on the local shards, with
no communication (DINOv3 does the same: facebookresearch/dinov3 ``dinov3/train/ssl_meta_arch.py``
``update_ema``; ``dinov3/fsdp/ac_compile_parallelize.py``). One process: plain copies.

The heads' layout is declared by the task's training module (:meth:`vitscale.tasks.dino.DinoModule.layout_plan`)
and applied by the parallelize tail (:func:`vitscale.distributed.parallelize.parallelize_parts`). Under
tensor parallelism (``parallel.tp``) every head, the student's and the teacher's alike, gets the
plan of :func:`head_plan` before its FSDP2 unit (Megatron style, as the ViT's MLP: the first linear
layer column parallel, the second row parallel with a replicated output, any further layer replicated)
and its prototypes split over the TP ranks, whole prototypes per rank (``last_v`` and ``last_g``, or
DINOv3's plain ``last_v``, sharded on their rows, so each prototype's weight norm is local); :class:`~vitscale.tasks.dino_head.DinoHead`
gathers the logits (``Replicate``) before the softmax, centring and Sinkhorn-Knopp, which then run on
the whole logits on every TP rank. :func:`check_layout` refuses, in one line before the first step, a
prototype count or head width that ``parallel.tp`` does not divide."""

from __future__ import annotations

import copy

import torch
from torch import nn

from vitscale.distributed.parallelize import indivisible
from vitscale.distributed.tensor_parallel import colwise, rowwise
from vitscale.distributed.utils import local_shard
from vitscale.errors import CheckError


def check_layout(dc, dims) -> None:
    """One line before any data is read or model built for heads (of :class:`~vitscale.tasks.dino_config.DinoConfig`
    ``dc``) that ``parallel.tp`` cannot split: the prototypes, and the hidden units of a head of two
    or more layers; and a batch-normalised head (``dino.head_use_bn``) under torchrun, whose statistics
    DINO v1 synchronises over the GPUs (``SyncBatchNorm``, facebookresearch/dino ``main_dino.py`` lines
    196-201) and vitscale does not yet."""
    if dc.head_use_bn and dims.distributed:
        raise CheckError(f"dino.head_use_bn=true on {dims.world_size} processes: DINO v1 synchronises the head's batch "
                         "statistics over every GPU (SyncBatchNorm), which vitscale does not yet; run it in one "
                         "process or set dino.head_use_bn=false")  # fmt: skip
    if not (dims.distributed and dims.tp_enabled):
        return
    fields = {"dino.head_n_prototypes": dc.head_n_prototypes}
    if dc.head_nlayers >= 2:
        fields["dino.head_hidden_dim"] = dc.head_hidden_dim
    problems = indivisible(fields, dims.tp)
    if problems:
        raise CheckError(f"parallel.tp={dims.tp} does not split the DINO / iBOT heads: {'; '.join(problems)}; "
                         "set the head sizes to multiples of parallel.tp")  # fmt: skip


def head_plan() -> dict:
    """The TP plan of a :class:`~vitscale.tasks.dino_head.DinoHead`'s MLP (paths relative to the head;
    a one-layer head has no ``mlp.2`` and its layer stays replicated)."""
    return {"mlp.0": colwise(), "mlp.2": rowwise(sequence_parallel_output=False)}


def teacher_backbone(run, model: nn.Module) -> nn.Module:
    """A copy of ``model`` (its parameters and buffers), laid out as ``model``: a deep copy in one
    process, else a new model parallelized as the run's, given ``model``'s local shards."""
    if not run.dims.distributed:
        return copy.deepcopy(model)
    teacher = run.new_model()
    copy_weights(model, teacher)
    return teacher


@torch.no_grad()
def copy_weights(src: nn.Module, dst: nn.Module) -> None:
    """``dst``'s parameters and buffers take ``src``'s values, shard by shard (both laid out alike, the
    same names: no communication)."""
    for (n, d), (m, s) in zip(dst.named_parameters(), src.named_parameters(), strict=True):
        assert n == m, (n, m)
        local_shard(d).copy_(local_shard(s.detach()))
    for d, s in zip(dst.buffers(), src.buffers(), strict=True):
        local_shard(d).copy_(local_shard(s))


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


__all__ = [
    "check_layout",
    "copy_weights",
    "head_plan",
    "keep_root_gathered",
    "release",
    "teacher_backbone",
]
