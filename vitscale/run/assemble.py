"""Assemble a run: one function turns a config into everything a job needs, a :class:`Run`.

``vitscale train``, ``eval``, ``label-tokens`` and ``bench`` all start here. In this order, each once:
the model resolved (its family and config: :class:`vitscale.models.registry.ResolvedModel`, handed
to every step below), the device and the parallel layout, the up-front checks
(:mod:`vitscale.run.checks`), for training the run folder (writable, locked, a resume with the same
config: :mod:`vitscale.run.folder`), the data (loaders, class count, image size) checked against the
run (an epoch holds a batch; the model's class count), the model config with its data-derived fields
filled in, for training the run's class names written, then the model — built on the meta device,
parallelized, materialised and initialised (:func:`vitscale.run.build_model`). The job then adds its own part: the training loop
(:class:`vitscale.train.trainer.Trainer`), the weights to evaluate, a model's labels, the timing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from ..config import Config
from ..config.data import DataConfig
from ..config.schema import run_length
from ..data import Loaders, build_loaders
from ..data.classes import check_classes, run_class_names, write_run_class_names
from ..data.formats import get_format
from ..data.sizes import check_batches
from ..data.views import Views, check_views
from ..distributed.compile import bound_recompiles
from ..distributed.float8 import Float8Report, float8_report
from ..distributed.fsdp import Precision, resolve_precision
from ..distributed.parallel_dims import (
    ParallelDims,
    init_distributed,
    resolve_device,
    use_device_settings,
    world_info,
)
from ..distributed.parallelize import parallelize
from ..models.registry import FamilySpec, ResolvedModel, family_of, resolve_model
from .build import build_model
from .checks import check_output_folder, check_run
from .folder import Claim, claim

Purpose = Literal["train", "eval", "label", "bench"]
PURPOSES = ("train", "eval", "label", "bench")


@dataclass
class Run:
    """A config resolved for one job: device, layout, data and the built model."""

    cfg: Config
    """The config as resolved (``train.compile`` filled in: on for CUDA training unless set)."""
    purpose: str
    """``train`` (augmented shuffled loaders), ``eval`` (every split in order, unaugmented: the val
    split for the task, the train split for probes), ``label`` (every split in order, unaugmented) or
    ``bench`` (one process, no data). Under torchrun, train, eval and label run on the ``parallel.*``
    layout, each data-parallel rank reading its shard."""
    device: torch.device
    """This rank's device."""
    dims: ParallelDims
    """The parallel layout (a world of one without torchrun, and for the bench)."""
    precision: Precision
    """The numerics on this device: FSDP2 compute / reduce dtypes and the autocast dtype."""
    resolved: ResolvedModel
    """The model resolved once, at the top of :func:`assemble`: its name, family, overrides (with the
    data-derived fields filled in: class count, image size) and config; every part of the run takes
    the model's config and family from here."""
    task: str
    """``train.task``, else the family's default task."""
    img_size: tuple[int, int]
    """(H, W) of the images the loaders give: the job's own side (``assemble(side=...)``), else
    ``data.img_size``, else the model's."""
    loaders: Loaders | None
    """This rank's train and val loaders; None for the bench."""
    num_classes: int | None
    """Classes of the data (``data.num_classes``, else the dataset's); None without data."""
    class_names: list[str]
    """The dataset's class names (empty without data)."""
    model: nn.Module
    """The model (a :class:`vitscale.models.contract.Model`), parallelized and initialised."""
    micro_batch: int
    """Images per rank per micro-step: ``train.batch_size / (data-parallel size x grad_accum)``."""
    float8: Float8Report
    """Which of the blocks' linear layers compute in float8 (``precision.fp8``; train and bench only)."""
    claim: Claim | None = None
    """Training: the run folder's lock (rank 0) and the config changes a resume accepted
    (:mod:`vitscale.run.folder`); release it when the run ends. None for other purposes."""
    steps_per_epoch: int = 0
    """Training: optimizer steps per epoch of the training loader (0 for other purposes)."""
    total_steps: int = 0
    """Training: the run's steps, ``train.max_steps`` else ``train.epochs`` of them (0 for other
    purposes): :func:`vitscale.config.schema.run_length`."""

    @property
    def family(self) -> FamilySpec:
        """The model's family (registry entry)."""
        return self.resolved.family

    @property
    def model_cfg(self) -> Any:
        """The model's config: the variant's with :attr:`model_overrides` applied."""
        return self.resolved.cfg

    @property
    def model_overrides(self) -> dict[str, Any]:
        """``model.overrides`` with the data-derived fields filled in (class count, image size): the
        model is ``create_model(cfg.model.name, **model_overrides)``."""
        return dict(self.resolved.overrides)

    def new_model(self) -> nn.Module:
        """Another model parallelized exactly like :attr:`model`, on the device, uninitialised (the
        EMA copy of a sharded model, which cannot be deep-copied)."""
        cfg = self.cfg
        return build_model(
            self.resolved, self.dims, parallel=cfg.parallel, precision=cfg.precision,
            compile=bool(cfg.train.compile), compile_mode=cfg.train.compile_mode, init=None,
        )  # fmt: skip


def resolve_run_model(cfg: Config) -> ResolvedModel:
    """``cfg.model`` resolved, with the changes its task implies (``Task.model_defaults``, e.g.
    SigLIP's initial temperature) under the user's own overrides."""
    from vitscale.tasks import get_task

    plain = resolve_model(cfg.model.name, **cfg.model.overrides)
    implied = get_task(cfg.train.task or plain.family.task).model_defaults(cfg, plain.cfg)
    implied = {k: v for k, v in implied.items() if k not in cfg.model.overrides}
    return plain.with_overrides({**implied, **cfg.model.overrides}) if implied else plain


def assemble(cfg: Config, purpose: Purpose = "train", *, model: nn.Module | None = None,
             side: tuple[str, int | None] | None = None, batch_size: int | None = None) -> Run:  # fmt: skip
    """The :class:`Run` of ``cfg`` for ``purpose``; ``model``: a model built elsewhere (e.g. converted
    from timm) to use instead of building ``cfg.model``. A job with settings of its own (label-tokens)
    gives the loaders' image side as ``side`` (its setting's name, for the checks' messages, and its
    value; None: ``data.img_size``) and the batch of an unaugmented pass as ``batch_size`` (None:
    ``eval.batch_size``)."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {PURPOSES}, got {purpose!r}")
    # The model, resolved once: the checks, the data and the model builder all take it from here.
    resolved = _given_model(cfg, model) if model is not None else resolve_run_model(cfg)
    tc = cfg.train
    if purpose == "train" or (purpose != "bench" and world_info()[2] > 1):
        dims = init_distributed(cfg.parallel, tc.device, timeout_s=cfg.parallel.timeout)
    else:  # one process: a run folder's layout (e.g. parallel.tp=2) is not this job's
        dims = ParallelDims(device=resolve_device(tc.device))
    if purpose == "train":
        use_device_settings(dims.device, tc.cpu_threads)  # train.cpu_threads; TF32 on CUDA
    device = dims.device
    compile = purpose in ("train", "bench") and (tc.compile if tc.compile is not None else device.type == "cuda")
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(tc, compile=compile))
    if purpose not in ("train", "bench"):  # fp8 is a training recipe: evaluation and labeling run the plain model
        cfg = dataclasses.replace(cfg, precision=dataclasses.replace(cfg.precision, fp8="none"))
    check_run(cfg, dims, purpose, resolved, side)
    views = _views(cfg, purpose, resolved, side)  # a task's views, checked before anything is written
    # Training: the run folder is writable and has room, nobody else trains in it, and a resume
    # continues the same run; decided on rank 0, and every rank stops together on a refusal.
    held = None
    if purpose == "train":
        held = claim(cfg, dims.is_main, share=_share if dims.distributed else None,
                     before=lambda c: check_output_folder(c, resolved),
                     restore=_restore_remote if cfg.checkpoint.remote else None)  # fmt: skip
    try:
        micro_batch = tc.batch_size // (dims.dp_size * tc.grad_accum)
        base = resolved.cfg
        px = side[1] if side is not None else cfg.data.img_size
        img_size = (px, px) if px else (base.img_h, base.img_w)
        where = _data_name(cfg)  # the data's setting, for the messages
        loaders = None if purpose == "bench" else _loaders(cfg, purpose, dims, img_size, micro_batch, resolved, batch_size, views)
        num_classes = (cfg.data.num_classes or loaders.num_classes) if loaders is not None else None
        # the data against the run: an epoch holds a batch (at every size); the model's class count
        # against the data's; then the run's class names written (for vitscale eval and export)
        if purpose == "train":
            check_batches(loaders, batch_size=tc.batch_size, dp_size=dims.dp_size, tokens_per_batch=cfg.data.tokens_per_batch)
        if loaders is not None and model is None and "num_classes" in resolved.fields:
            check_classes(cfg.model.overrides.get("num_classes"), num_classes, where)
        if purpose == "train" and dims.is_main and loaders.class_names:
            write_run_class_names(cfg.train.output_dir, loaders.class_names)
        # the model's config completed from the data (class count, image size)
        overrides = model_overrides(cfg, num_classes, resolved)
        resolved = resolved.with_overrides(overrides) if model is None else dataclasses.replace(resolved, overrides=overrides)
        steps_per_epoch, total_steps = run_length(tc, len(loaders.train)) if purpose == "train" else (0, 0)
        if purpose == "train" and loaders.sizes is not None:  # progressive stages are fractions of the run
            loaders.sizes.total_steps = total_steps
            if compile:
                bound_recompiles(len(loaders.sizes.sizes))
        if model is None:
            model = build_model(
                resolved, dims, parallel=cfg.parallel, precision=cfg.precision,
                compile=compile, compile_mode=tc.compile_mode, compile_backend=tc.compile_backend, seed=tc.seed,
            )  # fmt: skip
        else:  # built elsewhere (converted from timm): on the device, then laid out like a built one
            model = model.to(device)
            if dims.distributed:
                parallelize(model, resolved.family.plan(), dims, cfg.parallel, cfg.precision, compile, tc.compile_mode,
                            tc.compile_backend)  # fmt: skip
        family = resolved.family
        blocks = [block for stack in family.plan().blocks(model) for block in stack]
        float8 = float8_report(model, blocks, cfg.precision.fp8, cfg.precision.fp8_filter)
    except BaseException:
        if held is not None:
            held.release()
        raise
    return Run(
        cfg=cfg, purpose=purpose, device=device, dims=dims, precision=resolve_precision(cfg.precision, device),
        resolved=resolved, task=tc.task or family.task, img_size=img_size, loaders=loaders, num_classes=num_classes,
        class_names=list(loaders.class_names) if loaders is not None else [], model=model, micro_batch=micro_batch,
        float8=float8, claim=held, steps_per_epoch=steps_per_epoch, total_steps=total_steps,
    )  # fmt: skip


def _data_name(cfg: Config) -> str:
    d = cfg.data
    path = getattr(d, "train_path", None)  # the formats that read files have it
    return f"data.train_path={path}" if path else f"data.format={d.format}"


def _share(outcome):
    """Rank 0's outcome (None, or an error's exit code and message) on every rank: one broadcast."""
    import torch.distributed as dist

    box = [outcome]
    dist.broadcast_object_list(box, src=0)  # strings between this run's own processes
    return box[0]


def _given_model(cfg: Config, model: nn.Module) -> ResolvedModel:
    """A model built elsewhere (converted from timm) as a resolved one: its own family and config under
    ``model.name`` and ``model.overrides``."""
    return ResolvedModel(cfg.model.name, family_of(model), dict(cfg.model.overrides), model.cfg)


def model_overrides(cfg: Config, num_classes: int | None, model: ResolvedModel) -> dict[str, Any]:
    """The overrides of ``model`` (``cfg.model`` resolved: ``model.overrides`` and what the task
    implies) plus the data's class count and ``data.img_size`` for the fields the variant's config has
    and the overrides do not set. Data whose format carries no labels (``data.format=images``) gives
    the model no classifier (``num_classes=0``: a backbone, as DINOv2's ship)."""
    fields = model.fields
    over = dict(model.overrides)
    if num_classes and "num_classes" in fields and "num_classes" not in over:
        over["num_classes"] = num_classes
    elif num_classes == 0 and "num_classes" in fields and "num_classes" not in over and not get_format(cfg.data.format).labels:
        over["num_classes"] = 0
    if cfg.data.img_size and {"img_h", "img_w"} <= fields:
        over.setdefault("img_h", cfg.data.img_size)
        over.setdefault("img_w", cfg.data.img_size)
    return over


def head_classes(weights: dict[str, Any]) -> int | None:
    """The class count of trained weights: the rows of their classifier (``head.weight``); None
    without one (a CLIP, a headless model)."""
    head = weights.get("head.weight")
    return int(head.shape[0]) if isinstance(head, torch.Tensor) else None


def _restore_remote(cfg: Config) -> None:
    """``checkpoint.remote``: a run folder without checkpoints gets the mirrored ones back (rank 0,
    the folder locked, before the same-run check reads its config.yaml)."""
    from ..checkpoint.remote import RemoteMirror

    restored = RemoteMirror(cfg.checkpoint.remote, cfg.train.output_dir, cfg.checkpoint.keep).restore()
    if restored:
        print(f"restored {', '.join(restored)} from {cfg.checkpoint.remote} (checked like a local checkpoint before use)", flush=True)


def data_tokenizer(family: FamilySpec, data: DataConfig):
    """The tokenizer the data layer turns captions into token ids with: the family's
    (``FamilySpec.create_tokenizer``, ``data.caption_context_length`` tokens) for a family that reads
    text and a data format whose samples carry captions; None otherwise (no caption tokens). Built
    here, once per loader build: forked workers share it."""
    if family.tokenizer is None or not get_format(data.format).captions:
        return None
    return family.create_tokenizer(data.caption_context_length)


def _views(cfg: Config, purpose: str, model: ResolvedModel, side) -> Views | None:
    """The views the run's task declares for its training samples (``Task.views``), checked against
    the data config and the loader's image (one-line refusals); None for other purposes."""
    from vitscale.tasks import get_task

    task = cfg.train.task or model.family.task
    views = get_task(task).views(cfg) if purpose == "train" else None
    if views is not None:
        px = side[1] if side is not None else cfg.data.img_size
        check_views(views, cfg.data, (px, px) if px else (model.cfg.img_h, model.cfg.img_w), task)
    return views


def _loaders(cfg: Config, purpose: str, dims: ParallelDims, img_size, micro_batch: int,
             model: ResolvedModel, batch_size: int | None, views: Views | None = None) -> Loaders:  # fmt: skip
    tokenize = data_tokenizer(model.family, cfg.data)  # a family that reads text hands the data its tokenizer
    # this data-parallel rank's shard; TP ranks of one replica read the same
    patch = model.cfg.patch_dim  # NaFlex patches, token budgets
    common = dict(img_size=img_size, num_channels=model.cfg.num_channels, seed=cfg.train.seed, device=dims.device,
                  rank=dims.dp_rank, world_size=dims.dp_size, tokenize=tokenize, patch=patch)  # fmt: skip
    if purpose == "train":
        return build_loaders(cfg.data, micro_batch_size=micro_batch, eval_batch_size=cfg.eval.batch_size,
                             grad_accum=cfg.train.grad_accum, views=views, task=cfg.train.task or model.family.task,
                             **common)  # fmt: skip
    # every image once, in order, unaugmented, in whole batches of the one-process job (EvalShardSampler);
    # an evaluation maps the labels to the classes the weights were trained on (their run folder's)
    batch = batch_size or cfg.eval.batch_size
    classes = run_class_names(cfg.checkpoint.path) if purpose == "eval" else None
    return build_loaders(cfg.data, micro_batch_size=batch, eval_batch_size=batch, train_augment=False,
                         classes=classes, **common)  # fmt: skip


__all__ = ["PURPOSES", "Purpose", "Run", "assemble", "data_tokenizer", "head_classes", "model_overrides"]
