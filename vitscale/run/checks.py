"""Up-front checks of a run: the config against itself, the layout and the machine, before any data is
read or any model is built. :func:`vitscale.run.assemble` calls :func:`check_run` first (and
:func:`check_output_folder` on the main rank of a training run; once the loaders exist, the data layer
checks them against the run: :func:`vitscale.data.sizes.check_batches`,
:func:`vitscale.data.classes.check_classes`); a check that needs nothing but the config and the layout belongs here,
so it fails in one readable line instead of deep inside the first step.

Every failure is a :class:`vitscale.errors.CheckError`: one line naming the field, its value and
the fix; the CLI exits with code 2.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import socket
from pathlib import Path

import torch

from ..config import Config, config_to_dict
from ..config.ranges import (
    MAX_IMAGE_SIDE,
    at_least,
    fraction,
    image_side,
    nonfinite,
    not_finite_message,
    positive,
)
from ..data.auto_augment import build_augment
from ..data.sizes import check_sizes
from ..distributed.compile import check_compile_mode
from ..distributed.float8 import check_recipe, fp8_emulated, require_torchao
from ..distributed.fsdp import fsdp_runs_on
from ..distributed.parallel_dims import ParallelDims
from ..distributed.parallelize import check_layout
from ..errors import CheckError
from ..models.contract import check_input_mode
from ..models.registry import ResolvedModel
from ..safe_write import open_new
from ..tasks import get_task

log = logging.getLogger("vitscale.run")

_at_least = functools.partial(at_least, error=CheckError)
_fraction = functools.partial(fraction, error=CheckError)
_positive = functools.partial(positive, error=CheckError)
_side = functools.partial(image_side, error=CheckError)


def _check_signals(names) -> None:
    import signal

    for name in names:  # the names are checked as the config loads; what this machine has, here
        if not hasattr(signal, name):
            raise CheckError(f"checkpoint.save_on_signal: {name!r} is not a signal a run can save on: use SIGTERM, "
                             "SIGUSR1, SIGUSR2, SIGINT, SIGHUP or SIGQUIT (or [] for none)")  # fmt: skip


def _check_ranges(cfg: Config, purpose: str) -> None:
    """What one field's range cannot say: settings that only matter for some purposes, or together."""
    tc = cfg.train
    if purpose == "train":
        if tc.max_steps == 0 and tc.epochs == 0:
            raise CheckError("train.max_steps and train.epochs are both 0: set one, e.g. train.max_steps=1000 or train.epochs=10")
        _check_signals(cfg.checkpoint.save_on_signal)
    if purpose != "bench" and not cfg.parallel.timeout > 0:
        raise CheckError(f"parallel.timeout={cfg.parallel.timeout} must be greater than 0 (seconds a collective may wait)")


def _check_image_size(cfg: Config, model: ResolvedModel, side: tuple[str, int | None] | None) -> None:
    """The image side the model will see (``side``: the job's own setting and its value; None:
    ``data.img_size``): within :data:`vitscale.config.ranges.MAX_IMAGE_SIDE` and a multiple of its patch."""
    key, side = side or ("data.img_size", cfg.data.img_size)
    _side(key, side)
    base = model.cfg
    for name in ("img_h", "img_w"):
        _side(f"model.{name}", getattr(base, name))
    if side:
        try:
            base.with_image_size(side)
        except ValueError as e:
            raise CheckError(f"{key}={side} does not fit {cfg.model.name}: {e}; use a multiple of {base.patch_dim}") from None


def _check_training(cfg: Config, dims: ParallelDims) -> None:
    """What training alone adds: a batch the data-parallel ranks and micro-steps divide; LAMB's one
    implementation."""
    tc = cfg.train
    if tc.batch_size % (dims.dp_size * tc.grad_accum):
        raise CheckError(
            f"train.batch_size={tc.batch_size} must be divisible by data-parallel size {dims.dp_size} x "
            f"train.grad_accum {tc.grad_accum} (e.g. train.batch_size={dims.dp_size * tc.grad_accum * max(tc.batch_size // (dims.dp_size * tc.grad_accum), 1)})"
        )
    if cfg.optim.name == "lamb" and cfg.optim.fused in ("fused", "foreach"):
        raise CheckError(f"optim.fused={cfg.optim.fused}: vitscale's LAMB has one implementation (a loop over the "
                         "parameters); leave optim.fused at auto with optim.name=lamb")  # fmt: skip


def _check_labels(task, fmt_name: str) -> None:
    """A task whose training reads labels (:attr:`vitscale.tasks.Task.reads_labels`) on a format whose
    samples carry none (``DataFormat.labels``): one line naming the tasks that train there."""
    from ..data import get_format
    from ..registry import TASKS

    if not task.reads_labels or get_format(fmt_name).labels:
        return
    free = ", ".join(name for name, cls in TASKS.items() if not cls.reads_labels)
    raise CheckError(f"train.task={task.name} reads class labels and data.format={fmt_name} has none (a folder of images "
                     f"without classes): put the images in class folders (<root>/<class>/<image>) and use "
                     f"data.format=imagefolder, or train a task that reads no labels (train.task={free})")  # fmt: skip


def check_run(cfg: Config, dims: ParallelDims, purpose: str, model: ResolvedModel,
              side: tuple[str, int | None] | None = None) -> None:  # fmt: skip
    """:class:`CheckError` (or RuntimeError for the machine) naming the setting to change, for a run
    of ``purpose`` whose model :func:`vitscale.run.assemble` resolved as ``model`` (the checks take
    its config and family from there, never from the registry again); ``side``: the setting and
    value of the image side a job gives its loaders instead of ``data.img_size`` (the label-tokens
    job's own).

    Layer by layer, from this one down, each layer's part in one place: the run's own rules (settings
    that matter only for some purposes or together, the image side, what training adds), the data's
    (variable-resolution sizes, the augmentation policy), no NaN in the groups that do not refuse
    theirs as they are built (the model's overrides, the tasks' groups, the layout), the model's
    input modes, the run's task (:meth:`vitscale.tasks.Task.check`: its own group, its teacher), then
    the parallel layout, compilation, float8 and the machine. A config with several faults meets the
    first in this order."""
    # this layer's own rules
    _check_ranges(cfg, purpose)
    _check_image_size(cfg, model, side)
    if purpose == "train":
        _check_training(cfg, dims)
    # the data's: variable-resolution sizes the model's patch divides, a batch of at least one image per
    # rank at every size; the augmentation policy (a ConfigError naming data.auto_augment / data.color_jitter)
    d, tc = cfg.data, cfg.train
    if purpose != "bench" and (d.image_sizes or d.seq_lens or d.img_size or d.eval_image_size or d.eval_seq_len):
        check_sizes(d, patch=model.cfg.patch_dim, batch_size=tc.batch_size, parts=dims.dp_size * tc.grad_accum)
    if purpose == "train":
        build_augment(d.auto_augment, d.color_jitter, mean=d.mean, interpolation=d.train_interpolation or d.interpolation,
                      force_color_jitter=d.force_color_jitter)  # fmt: skip
    # no NaN in the groups that do not refuse theirs as they are built (it passes every comparison below)
    found = nonfinite(config_to_dict(cfg))
    if found:
        raise CheckError(not_finite_message(*found))
    # the model's: variable resolution where its family takes it (``input_modes``)
    if d.image_sizes:
        check_input_mode(model.family.model_cls, "multi", f"data.image_sizes={list(d.image_sizes)}", cfg.model.name)
    if d.seq_lens:
        check_input_mode(model.family.model_cls, "naflex", f"data.seq_lens={list(d.seq_lens)}", cfg.model.name)
    # the task's own settings and parts (its teacher), and what it reads of the data
    task = get_task(tc.task or model.family.task)
    if purpose in ("train", "label"):
        _check_labels(task, d.format)
    task.check(cfg, model, dims, purpose)
    if purpose == "train":
        check_init_parts(cfg, model, task)
    # the parallel layer's, on this machine: FSDP2 on this device, the model's TP plan over parallel.tp
    # ranks, the compile mode, float8 (its recipe, torchao, the GPU)
    if dims.distributed and not fsdp_runs_on(dims.device.type):  # not an AttributeError in the first step
        raise RuntimeError(
            f"multi-process training wraps the model in FSDP2, which cannot train on CPU with torch "
            f"{torch.__version__} (its CPU streams lack record_event): train on CUDA, or on CPU with a "
            "newer torch (2.11 and 2.15 checked)"
        )
    if dims.tp > 1:
        check_layout(model.family.plan(), model.cfg, dims.tp, cfg.model.name)
    if purpose in ("train", "bench"):
        check_compile_mode(tc.compile_mode, compile=bool(tc.compile), device_type=dims.device.type,
                           world_size=dims.world_size, backend=tc.compile_backend)  # fmt: skip
        if cfg.precision.fp8 != "none":
            check_recipe(cfg.precision.fp8, cfg.precision.fp8_filter)
            require_torchao()  # before any data is read: one line on how to install it
            fp8_emulated(dims.device)  # an older GPU: refused with the reason


def check_init_parts(cfg: Config, model: ResolvedModel, task) -> None:
    """``checkpoint.init_parts`` can be kept: ``checkpoint.init_from`` is a vitscale checkpoint (run or
    step folder) whose ``task.*`` tensors hold every tensor of each kept part this run's ``task``
    builds (:meth:`vitscale.tasks.Task.parts_on_meta`, names only: shapes are checked as they load, where
    position embeddings may be resampled). Only the checkpoint's index is read. Nothing to check when
    the run resumes from its own checkpoint (which holds every part)."""
    from ..checkpoint.discovery import find_checkpoint, list_checkpoints
    from ..checkpoint.integrity import CheckpointError
    from ..tasks.module import PARTS_KEY

    cc = cfg.checkpoint
    if not cc.init_parts:
        return
    key = f"checkpoint.init_parts={list(cc.init_parts)}"
    if not cc.init_from:
        raise CheckError(f"{key} keeps parts of checkpoint.init_from's training module: set checkpoint.init_from to the "
                         "previous stage's run folder (or one of its step folders)")  # fmt: skip
    if cc.resume and list_checkpoints(Path(cfg.train.output_dir) / "checkpoints"):
        return
    parts = task.parts_on_meta(getattr(cfg, task.name, None), model.create(device="meta"))
    shapes = {f"{name}.{k}": tuple(v.shape) for name, m in parts.items() for k, v in m.state_dict().items()}
    names = sorted({k.split(".", 1)[0] for k in shapes})
    for part in cc.init_parts:
        if part not in names:
            raise CheckError(f"{key}: train.task={task.name} has no part {part!r} to keep (its parts: "
                             f"{', '.join(names) or 'none'}); the backbone is checkpoint.init_from's in any case")  # fmt: skip
    where = f"checkpoint.init_from={cc.init_from}"
    try:
        ckpt, idx = find_checkpoint(cc.init_from, keys=set())  # the index alone: the tensors are checked as they load
    except (FileNotFoundError, CheckpointError, OSError) as e:
        raise CheckError(f"{key} reads the parts from a vitscale checkpoint, and {where} is none "
                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__}): give the previous stage's run "
                         "folder or step folder (an exported .safetensors holds the backbone only)") from None  # fmt: skip
    have = {k[len(PARTS_KEY) + 1 :]: tuple(t["shape"]) for k, t in idx["tensors"].items() if k.startswith(f"{PARTS_KEY}.")}
    for part in cc.init_parts:
        mine = {k: v for k, v in shapes.items() if k.split(".", 1)[0] == part}
        missing = [k for k in mine if k not in have]
        if missing:
            shown = ", ".join(missing[:3]) + (f", ... ({len(missing) - 3} more)" if len(missing) > 3 else "")
            raise CheckError(f"{key}: {ckpt} lacks {len(missing)} tensors of the {part} this run keeps ({shown}): it was "
                             f"written with other {task.name} settings or another task; keep only what it holds, or "
                             f"leave {part} out of checkpoint.init_parts to build it afresh")  # fmt: skip
        # the position embeddings load resampled to this run's grid (the backbone's own hook)
        other = [k for k, v in mine.items() if have[k] != v and not k.endswith("pos_embed")]
        if other:
            k = other[0]
            raise CheckError(f"{key}: {ckpt} holds {k} as {'x'.join(map(str, have[k]))}, this run's {part} has "
                             f"{'x'.join(map(str, mine[k]))}{f' ({len(other)} tensors differ)' if len(other) > 1 else ''}: "
                             f"set the {task.name} group's sizes as the run that wrote it, or leave {part} out of "
                             "checkpoint.init_parts")  # fmt: skip


# ------------------------------------------------------------------------------------- the folder
def checkpoint_bytes(cfg: Config, model: ResolvedModel) -> tuple[int, int]:
    """(parameters, bytes of one checkpoint) of the run (its model as :func:`vitscale.run.assemble`
    resolved it, ``model``): fp32 weights, the optimizer's fp32 states (Adam/AdamW/LAMB: 2 per parameter, SGD with
    momentum: 1) and the EMA copy; the model is built on the meta device (nothing allocated) to count
    its parameters."""
    params = sum(p.numel() for p in model.create(device="meta").parameters())
    states = {"adamw": 2, "adam": 2, "lamb": 2, "sgd": 1 if cfg.optim.momentum else 0}[cfg.optim.name]
    copies = 1 + states + (1 if cfg.train.ema_decay > 0 else 0)
    return params, params * 4 * copies


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_output_folder(cfg: Config, model: ResolvedModel) -> None:
    """``train.output_dir`` can be created and written, and its disk has room for one checkpoint (of
    ``model``, the run's model resolved)."""
    out = Path(cfg.train.output_dir)
    key = f"train.output_dir={cfg.train.output_dir}"
    if out.exists() and not out.is_dir():
        raise CheckError(f"{key} is a file, not a folder: choose a folder for the run")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{socket.gethostname()}-{os.getpid()}"
        with open_new(probe, "wb") as f:  # never through a symbolic link (vitscale.safe_write)
            f.write(b"vitscale")
        probe.unlink()
    except OSError as e:
        raise CheckError(f"{key} cannot be written ({e.strerror or type(e).__name__}: {e.filename or out}): choose a folder you can write to") from None
    params, need = checkpoint_bytes(cfg, model)
    free = shutil.disk_usage(out).free
    if free < need:
        raise CheckError(
            f"{key}: {_gib(free)} free on its disk, one checkpoint of {cfg.model.name} ({params / 1e6:.1f}M parameters: "
            f"weights, optimizer state{', EMA' if cfg.train.ema_decay > 0 else ''} in fp32) takes about {_gib(need)}: "
            f"free some space or choose another folder"
        )


__all__ = ["MAX_IMAGE_SIDE", "check_init_parts", "check_output_folder", "check_run", "checkpoint_bytes"]
