"""The typed run configuration: one root :class:`Config` of groups, a docstring under every field.

The dataclasses are the truth: ``vitscale.config.load`` merges defaults <- YAML <- dotted overrides
into them, refusing unknown keys (with the closest valid key) and wrong types (naming the field).
Groups that belong to one part of vitscale are fields of ``Config`` here: ``data`` (``config/data.py``:
typed by ``data.format``, each format's class declared in its module), ``parallel`` and ``precision``
(``vitscale/distributed/config.py``). Each task declares its root class, a subclass of ``Config`` with
its own groups as fields (``ContrastiveConfig``: ``clip``, ``distill``; ``Task.config``), and the
loader builds a run as the class of its task (:func:`config_class`); the entries of ``evals`` are each
evaluator's own config (``config/evals.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from vitscale.distributed.config import CompileBackend, CompileMode, ParallelConfig, PrecisionConfig

from ..errors import ConfigError
from ..registry import TASKS, model_family
from .data import DataConfig, data_config
from .evals import EvaluatorConfig, ProbeFeatures
from .ranges import COUNT_MAX, Bound, at_least, check_ranges, finite, fraction, positive

SAVE_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP", "SIGQUIT")
"""The signals ``checkpoint.save_on_signal`` may name."""



def check_save_signal(name: str) -> None:
    """A one-line :class:`ConfigError` unless ``name`` is one of :data:`SAVE_SIGNALS`: SIGKILL and SIGSTOP
    cannot be caught, another real signal is not one to save on, an unknown word names the closest."""
    import difflib
    import signal

    if name in SAVE_SIGNALS:
        return
    if name in ("SIGKILL", "SIGSTOP"):
        raise ConfigError(f"checkpoint.save_on_signal: {name} cannot be caught by any process; use e.g. SIGTERM, SIGUSR1, SIGINT")
    if name in signal.Signals.__members__:
        raise ConfigError(f"checkpoint.save_on_signal: {name!r} is not a signal a run can save on: use SIGTERM, "
                          "SIGUSR1, SIGUSR2, SIGINT, SIGHUP or SIGQUIT (or [] for none)")  # fmt: skip
    close = difflib.get_close_matches(str(name), SAVE_SIGNALS, n=1)
    raise ConfigError(f"checkpoint.save_on_signal: {name!r} is not a signal name here{f' (did you mean {close[0]}?)' if close else ''}; "
                      "use SIGTERM, SIGUSR1, SIGUSR2, SIGINT, SIGHUP or SIGQUIT (or [] for none)")  # fmt: skip


SdpaChoice = Literal["auto", "flash", "cudnn", "efficient", "math", "default"]
"""``train.sdpa`` / ``vitscale bench --sdpa``: the attention backends (``vitscale.train.fastpath``)."""


@dataclass
class ModelConfig:
    """Which registered model to train."""

    name: str = "vit_debug"
    """Registered variant name (``vitscale models`` lists them), e.g. ``vit_debug``, ``vit_b16``."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Changes to the variant's config (``model.overrides.hidden_size=128``; the shorthand
    ``model.hidden_size=128`` is routed here for any field of the variant's config). Changing
    ``model.name`` on the command line drops the overrides the YAML wrote for its own model (a note
    names them; set any you want back as ``model.<field>=value``)."""
    freeze: tuple[str, ...] = ()
    """Parameters left out of training: glob patterns over parameter names (the model's
    ``named_parameters()``), e.g. ``model.freeze=patch_embed.*,blocks.[0-5].*``; frozen parameters get
    no gradient and leave the optimizer. A pattern that matches nothing is an error naming some of
    the model's parameters."""


@dataclass
class OptimConfig:
    """The optimizer."""

    RANGES: ClassVar[dict[str, Bound]] = {
        "lr": (0.0, 1e9), "lr_scale_batch": (0, 1 << 24), "betas": (0.0, 1.0), "momentum": (0.0, 1.0),
        "weight_decay": (0.0, 1e3), "head_weight_decay": (0.0, 1e3), "layer_decay": (0.0, 1.0), "eps": (0.0, 1.0),
    }  # fmt: skip
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    name: Literal["adamw", "adam", "sgd", "lamb"] = "adamw"
    """adamw | adam | sgd | lamb. Adam's weight decay is the L2 kind (NeMo's recipe), AdamW's is decoupled;
    lamb is LAMB (arXiv 1904.00962) as DeiT III trains with it (apex ``FusedLAMB``: decoupled decay and a
    per-tensor trust ratio in the groups with weight decay; ``vitscale.train.lamb``; its gradient
    clipping is ``train.grad_clip``)."""
    lr: float = 1e-3
    """Base learning rate (before the batch-size scaling rule)."""
    lr_scale_batch: int = 0
    """LR scaling rule: lr = lr * train.batch_size / lr_scale_batch (e.g. 1024); 0 = no scaling."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam / AdamW / LAMB betas."""
    momentum: float = 0.9
    """SGD momentum."""
    nesterov: bool = False
    """SGD Nesterov momentum."""
    weight_decay: float = 0.05
    """Weight decay of the body's matrices; never applied to norms, biases, position embeddings,
    tokens or any name in the model's ``no_weight_decay()``."""
    head_weight_decay: float | None = None
    """Weight decay of the classifier head (ViT-22B decouples head and body); None = weight_decay."""
    layer_decay: float | None = None
    """Layer-wise LR decay (BEiT, Bao et al. 2021, arXiv 2106.08254; timm ``--layer-decay``): with L
    blocks, the embeddings' LR is multiplied by ``layer_decay^(L+1)``, block i's by
    ``layer_decay^(L-i)``, the final norm and head keep the full LR (each family says which of its
    parameters are which layer); e.g. 0.65 (BEiT-B) or 0.75. None = off. The groups are printed once
    at the start."""
    eps: float = 1e-8
    """Adam / AdamW / LAMB epsilon."""
    fused: Literal["auto", "fused", "foreach", "none"] = "auto"
    """auto (fused where torch has the kernels: CUDA, and the CPU since torch 2.4; foreach elsewhere) |
    fused | foreach | none (plain for-loop). Fused kernels skip a non-finite step on the device
    (``found_inf``); foreach / none read one flag per step on the host."""

    def __post_init__(self) -> None:
        finite(self, "optim")
        if not self.lr >= 0:
            raise ConfigError(f"optim.lr={self.lr} must be a finite number >= 0 (e.g. optim.lr=1e-3)")
        at_least("optim.weight_decay", self.weight_decay, 0, "0 = no weight decay")
        if self.head_weight_decay is not None:
            at_least("optim.head_weight_decay", self.head_weight_decay, 0, "None = optim.weight_decay")
        positive("optim.eps", self.eps, "Adam's epsilon, added to a denominator, e.g. 1e-8")
        for i, b in enumerate(self.betas):
            fraction(f"optim.betas[{i}]", b, "Adam's moment decay, e.g. 0.9,0.999")
        at_least("optim.momentum", self.momentum, 0, "SGD momentum, 0 = none")
        at_least("optim.lr_scale_batch", self.lr_scale_batch, 0, "0 = no scaling")
        if self.layer_decay is not None and not 0 < self.layer_decay <= 1:
            raise ConfigError(f"optim.layer_decay={self.layer_decay} must be in (0, 1] (each layer's LR factor towards the "
                              "input, e.g. 0.65 or 0.75; unset = off)")  # fmt: skip
        check_ranges(self, "optim")  # every declared bound (RANGES), past the messages above


@dataclass
class ScheduleConfig:
    """The learning-rate schedule, a pure function of the step (so a resume needs only the step)."""

    RANGES: ClassVar[dict[str, Bound]] = {
        "warmup_steps": (0, COUNT_MAX), "warmup_epochs": (0.0, 1e6), "cooldown_steps": (0, COUNT_MAX),
        "cooldown_epochs": (0.0, 1e6), "min_lr": (0.0, 1e3), "rsqrt_timescale": (1, COUNT_MAX),
    }  # fmt: skip
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    name: Literal["cosine", "rsqrt", "constant"] = "cosine"
    """cosine (linear warmup, cosine decay to min_lr) | rsqrt (linear warmup, reciprocal square root,
    linear cooldown to 0) | constant (linear warmup, then flat)."""
    warmup_steps: int = 0
    """Linear warmup steps from 0 to the peak LR."""
    warmup_epochs: float = 0.0
    """Warmup in epochs (converted to steps; used when warmup_steps is 0)."""
    warmup_shape: Literal["linear", "cosine"] = "linear"
    """linear (update ``s`` of ``w`` at ``s / w`` of the peak) | cosine (a half cosine from 0 at the first
    update to the peak at update ``w``: ``(1 - cos(pi (s - 1) / (w - 1))) / 2``, DINOv3's rising cosine
    from a peak of 0 to its end, ``schedules.lr`` of ``dinov3_vit7b16_high_res_adapt.yaml`` lines 203-209
    through ``dinov3/train/cosine_lr_scheduler.py`` lines 76-85)."""
    cooldown_steps: int = 0
    """rsqrt / constant: linear cooldown to 0 over the last steps. cosine: the last steps at ``min_lr``,
    the cosine ending that many steps before the run does (timm's ``--cooldown-epochs``)."""
    cooldown_epochs: float = 0.0
    """``cooldown_steps`` in epochs (used when ``cooldown_steps`` is 0), e.g. the VOLO code's 10
    (sail-sg/volo ``main.py --cooldown-epochs 10``: its 300 epochs are followed by 10 at ``min_lr``)."""
    min_lr: float = 0.0
    """Cosine: the final learning rate."""
    rsqrt_timescale: int = 10000
    """rsqrt: lr = peak * sqrt(timescale / max(step, timescale)) after warmup."""

    def __post_init__(self) -> None:
        finite(self, "schedule")
        at_least("schedule.warmup_steps", self.warmup_steps, 0, "linear warmup steps")
        at_least("schedule.warmup_epochs", self.warmup_epochs, 0, "used when schedule.warmup_steps is 0")
        at_least("schedule.cooldown_steps", self.cooldown_steps, 0, "0 = no cooldown")
        at_least("schedule.cooldown_epochs", self.cooldown_epochs, 0, "0 = no cooldown")
        at_least("schedule.min_lr", self.min_lr, 0, "the cosine's final learning rate")
        at_least("schedule.rsqrt_timescale", self.rsqrt_timescale, 1, "steps")
        check_ranges(self, "schedule")  # every declared bound (RANGES), past the messages above


def run_length(tc: TrainConfig, batches_per_epoch: int) -> tuple[int, int]:
    """``(optimizer steps per epoch, steps of the run)`` of the ``train`` group ``tc``: ``train.max_steps``,
    else ``train.epochs`` of steps (at least one)."""
    per_epoch = max(batches_per_epoch // tc.grad_accum, 1)
    return per_epoch, (tc.max_steps if tc.max_steps > 0 else max(int(math.ceil(tc.epochs * per_epoch)), 1))


@dataclass
class TrainConfig:
    """The training loop."""

    RANGES: ClassVar[dict[str, Bound]] = {
        "batch_size": (1, 1 << 24), "grad_accum": (1, 1 << 16), "max_steps": (0, COUNT_MAX), "epochs": (0.0, 1e6),
        "seed": (0, (1 << 63) - 1), "label_smoothing": (0.0, 1.0), "bce_target_thresh": (0.0, 1.0),
        "grad_clip": (0.0, math.inf), "ema_decay": (0.0, 1.0), "log_every": (1, COUNT_MAX), "cpu_threads": (0, 4096),
        "max_nonfinite_steps": (-1, COUNT_MAX), "max_consecutive_nonfinite": (-1, COUNT_MAX),
        "hang_timeout": (0.0, 7 * 86400.0),
    }  # fmt: skip
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    task: str | None = None
    """A task registered in ``vitscale.registry.TASKS`` (a plug-in's too; an unknown name's one-line error
    lists them); None = the model family's default task."""
    batch_size: int = 64
    """GLOBAL images per optimizer step (over all ranks and micro-steps)."""
    grad_accum: int = 1
    """Micro-steps per optimizer step; per-rank micro batch = batch_size / (dp_world * grad_accum)."""
    max_steps: int = 0
    """Optimizer steps to train; 0 = use epochs."""
    epochs: float = 0.0
    """Epochs to train (used when max_steps is 0)."""
    seed: int = 0
    """Seed of initialisation, sampling, augmentation, dropout."""
    loss: Literal["softmax", "sigmoid"] = "softmax"
    """Classification loss: softmax (cross-entropy) | sigmoid (binary cross-entropy, ViT-22B)."""
    label_smoothing: float = 0.0
    """Label smoothing of the targets (also passed to mixup)."""
    bce_sum: bool = True
    """``loss: sigmoid``: sum the binary cross-entropy over the classes, then average over the images
    (big_vision's ``sigmoid_xent``, ViT-22B; timm's ``--bce-sum``); false = average over classes and
    images alike (torch's ``BCEWithLogitsLoss()``, DeiT III), which makes the loss and its gradient
    1 / classes as large (what ``train.grad_clip`` then clips). The ``val_loss`` of evaluation stays
    summed over the classes."""
    bce_target_thresh: float | None = None
    """``loss: sigmoid``: targets (after label smoothing and mixup / cutmix) above this value become 1,
    the others 0 (timm's ``--bce-target-thresh``; DeiT III's ``--bce-loss`` binarises at 0: both
    classes of a mixed pair are positives). None = the soft targets as they are."""
    grad_clip: float = 0.0
    """Clip the gradient norm to this value (of what ``grad_clip_scope`` names); 0 = off (the global norm is
    still logged)."""
    grad_clip_scope: Literal["global", "part", "parameter"] = "global"
    """What ``grad_clip`` clips: ``global`` (the norm of every gradient together, as
    ``torch.nn.utils.clip_grad_norm_``), ``part`` (each part of the training module on its own: the
    backbone and each trained part of the task, DINO's heads each apart, as DINOv2 and DINOv3 clip each
    of the student's modules, facebookresearch/dinov2 ``dinov2/train/train.py`` lines 257-259 and dinov3
    ``dinov3/train/train.py`` lines 488-493) or
    ``parameter`` (each parameter's gradient on its own, as DINO v1's ``utils.clip_gradients``,
    facebookresearch/dino ``utils.py`` lines 132-141). The logged ``grad_norm`` is the global norm before
    clipping in every case."""
    ema_decay: float = 0.0
    """EMA of the weights with this decay (e.g. 0.9999); 0 = off. Evaluation then also reports EMA."""
    output_dir: str = "runs/default"
    """Run folder: config.yaml, metrics.jsonl, summary.json, checkpoints/, model.safetensors."""
    log_every: int = 10
    """Log (and sync with the device) every N steps."""
    compile: bool | None = None
    """torch.compile the model per block (the family's parallelize function does it); None = on
    when training on CUDA (the fast path), off on CPU."""
    compile_mode: CompileMode = "default"
    """``torch.compile`` mode of the per-block compile: default | reduce-overhead (CUDA graphs: each
    compiled block replays its recorded kernels with one launch; one CUDA process, one batch shape)
    | max-autotune-no-cudagraphs (autotuned GEMM / Triton configs, long compiles) | max-autotune
    (both). The CUDA-graph modes are refused, with the reason, where they are unsafe
    (``vitscale.distributed.compile.check_compile_mode``)."""
    compile_backend: CompileBackend = "inductor"
    """``torch.compile`` backend of the per-block compile: inductor (generated kernels: the fast path) |
    aot_eager (Dynamo's graphs through AOTAutograd, run by eager kernels: no code generation, to check in
    seconds that a model compiles and recompiles as it should) | eager (Dynamo's graphs only). The
    compile modes are inductor's (``torch.compile``'s documentation, docs.pytorch.org/docs/stable/generated/torch.compile.html)."""
    sdpa: SdpaChoice = "auto"
    """Attention kernels (``F.scaled_dot_product_attention`` backends), as ``vitscale bench --sdpa``:
    auto (flash > cuDNN > memory-efficient > math, first that fits) | flash | cudnn | efficient |
    math | default (PyTorch's own choice). Applies to training and evaluation."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto (cuda if available) | cpu | cuda."""
    cpu_threads: int = 0
    """Intra-op threads when training on CPU; 0 = PyTorch's default (one per core). Tiny models run
    faster on 1 thread (the digits demo: ~7x faster per step than 2 threads on a busy 2-core machine)."""
    max_nonfinite_steps: int = 100
    """Steps with a non-finite loss or gradient norm the run may have in all (counted across
    resumes); such a step is never applied. More stops the run (exit code 1, the last checkpoint
    kept intact); -1 = no limit. See docs/trust.md."""
    max_consecutive_nonfinite: int = 5
    """Non-finite steps the run may have in a row; more stops it (a run that has diverged);
    -1 = no limit."""
    hang_timeout: float = 0.0
    """Watchdog: when no step completes within this many seconds (evaluations and checkpoints
    included), every rank writes the Python stacks of all its threads to
    ``output_dir/hang-rank<r>.txt`` and the job exits with code 124, naming the file
    (``vitscale.train.watchdog``); 0 = off. Set it above the longest step + evaluation + save."""

    def __post_init__(self) -> None:
        finite(self, "train")
        at_least("train.batch_size", self.batch_size, 1, "images per optimizer step over all ranks")
        at_least("train.grad_accum", self.grad_accum, 1, "micro-steps per optimizer step; 1 = no accumulation")
        at_least("train.log_every", self.log_every, 1, "log every N steps")
        at_least("train.max_steps", self.max_steps, 0, "0 = train for train.epochs")
        at_least("train.epochs", self.epochs, 0, "used when train.max_steps is 0")
        at_least("train.max_nonfinite_steps", self.max_nonfinite_steps, -1, "-1 = no limit")
        at_least("train.max_consecutive_nonfinite", self.max_consecutive_nonfinite, -1, "-1 = no limit")
        at_least("train.grad_clip", self.grad_clip, 0, "0 = no clipping")
        at_least("train.cpu_threads", self.cpu_threads, 0, "0 = PyTorch's default")
        at_least("train.hang_timeout", self.hang_timeout, 0, "seconds without a step before the stacks are dumped; 0 = off")
        fraction("train.ema_decay", self.ema_decay, "0 = no EMA, e.g. 0.9999")
        fraction("train.label_smoothing", self.label_smoothing, "0 = none, e.g. 0.1")
        if self.bce_target_thresh is not None:
            fraction("train.bce_target_thresh", self.bce_target_thresh, "targets above it become 1; DeiT III: 0")
        check_ranges(self, "train")  # every declared bound (RANGES), past the messages above


@dataclass
class CheckpointConfig:
    """Checkpoints (torch.distributed.checkpoint, atomic, last K kept) and weights export."""

    RANGES: ClassVar[dict[str, Bound]] = {"every": (0, COUNT_MAX), "keep": (1, 1 << 16), "remote_wait_s": (0.0, 7 * 86400.0),
                                          "signal_deadline": (1e-3, 7 * 86400.0)}  # fmt: skip
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    every: int = 0
    """Save every N steps; 0 = only at the end."""
    keep: int = 2
    """Keep the newest K checkpoints."""
    path: str | None = None
    """A checkpoint (step folder, checkpoints/ folder, run folder or .safetensors) for ``vitscale eval``."""
    init_from: str | None = None
    """Initialise the model's weights (only) from: a vitscale run folder, checkpoint or
    ``.safetensors``; a timm or open_clip file (``.safetensors``, or ``.pth`` / ``.bin`` read with
    ``torch.load(weights_only=True)``); a Hugging Face Hub snapshot folder; or ``hf-hub:org/name``
    from the local Hugging Face cache (never downloaded). Converted through the model family's
    adapter; position embeddings resampled, a classifier of another class count re-initialised,
    each said in a line (docs/finetuning.md)."""
    init_parts: tuple[str, ...] = ()
    """Parts of the training module (``train.task``'s: DINO's ``student`` heads, ``teacher``, ``centres``,
    ``gram_teacher``) that start, with the backbone, from ``init_from``'s checkpoint (a vitscale run
    folder or step folder of the same task): a stage of a pretraining that continues the previous
    stage's heads and teacher, with its own optimizer and step counter starting afresh (DINOv3's
    high-resolution stage, docs/ssl.md). Empty: the backbone alone (the parts built afresh). A part
    the checkpoint lacks is refused in one line before the run starts; ignored when the run resumes."""
    init_format: Literal["vitscale", "timm", "open_clip"] | None = None
    """The format of ``init_from``, overriding what the file tells; None = told from the file (its kind,
    vitscale's metadata, its names: vitscale names its per-head projections ``*_per_head``, timm's
    are ``attn.qkv``, ...). Needed only where the names cannot tell: a ViT state dict that
    ``save_file`` wrote from a vitscale model before that rename has timm's names (set ``vitscale``),
    and a plug-in family whose namings overlap is refused until told (docs/finetuning.md)."""
    resume: bool = True
    """Resume from the newest checkpoint in output_dir/checkpoints when there is one (with the same
    config: see ``allow_changes``); false = start over."""
    allow_changes: tuple[str, ...] = ()
    """Config keys (or groups) a resume may change, e.g. ``checkpoint.allow_changes=train.max_steps``
    to train a finished run longer, ``optim`` for the whole group, ``all`` for anything. A resume
    with any other change to what the run computes is refused with the list of changed keys."""
    export_safetensors: bool = True
    """Write the final weights to output_dir/model.safetensors (and model_ema.safetensors)."""
    async_mode: Literal["disabled", "async", "async_pinned"] = "disabled"
    """How a checkpoint is written (torchtitan's ``checkpoint.async_mode``): disabled (the step loop
    waits for the whole write) | async (the state is copied to CPU memory, then written by a
    background thread while training goes on; the next save waits for the previous) | async_pinned
    (the same, into CPU buffers kept from one save to the next, pinned on a GPU for faster copies).
    Integrity and atomicity are those of a synchronous save (docs/trust.md)."""
    save_on_signal: tuple[str, ...] = ("SIGTERM", "SIGUSR1", "SIGINT")
    """Signals that make the run finish its current step, save a checkpoint and exit with code
    128 + the signal's number (SIGTERM 143, SIGUSR1 138, SIGINT 130); the ranks agree on the step.
    A second such signal (a second Ctrl-C) quits at once. Empty: these signals end the run at once,
    as before (SIGTERM, SIGINT), and SIGUSR1 keeps its default action."""
    signal_deadline: float = 300.0
    """Seconds a signal of ``save_on_signal`` waits for the step in progress to end (a step that hangs,
    a start-up that never reaches its first step): past them the run exits with code 128 + the signal's
    number without saving that step, the line naming the last checkpoint saved (``vitscale.train.preemption``).
    Counted from the signal to the end of the step; the save that follows is not bounded by it."""
    remote: str | None = None
    """Mirror the run folder's checkpoints (and config.yaml, metrics.jsonl, summary.json, train.log)
    to this fsspec URL after each save, e.g. ``s3://bucket/runs/x`` (open_clip's remote sync): a run
    whose folder holds no checkpoint resumes from the newest one there, checked like a local one
    (``vitscale.checkpoint.remote``; s3:// needs ``pip install s3fs``)."""
    remote_wait_s: float = 600.0
    """With ``remote``: an upload under way for longer than this is stalled (one warning line; training
    goes on), and the end of a run (or a signal's save) waits at most this long for the uploads under
    way before it ends without them (a warning line; the local checkpoints are complete). The step loop
    itself never waits for the remote location."""

    def __post_init__(self) -> None:
        finite(self, "checkpoint")
        at_least("checkpoint.every", self.every, 0, "save every N steps; 0 = only at the end")
        at_least("checkpoint.keep", self.keep, 1, "checkpoints kept")
        at_least("checkpoint.remote_wait_s", self.remote_wait_s, 0, "seconds the end of a run waits for an upload")
        positive("checkpoint.signal_deadline", self.signal_deadline, "seconds a signal waits for the step in progress to end")
        for name in self.save_on_signal:
            check_save_signal(name)
        check_ranges(self, "checkpoint")  # every declared bound (RANGES), past the messages above


@dataclass
class EvalConfig:
    """Evaluation on the val split when ``evals:`` is empty (the task's default evaluations), and the
    probes of ``vitscale eval``."""

    RANGES: ClassVar[dict[str, Bound]] = {
        "every": (0, COUNT_MAX), "batch_size": (1, 1 << 20), "probe_l2": (0.0, 1e12), "probe_holdout": (0.0, 1.0),
        "probe_max_iter": (1, 1 << 20), "probe_blocks": (1, 1024), "shots": (1, 1 << 16), "fewshot_seeds": (1, 1024),
        "fewshot_l2": (0.0, 1e12),
    }  # fmt: skip
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    every: int = 0
    """Evaluate every N steps; 0 = only at the end (the task's default evaluations)."""
    batch_size: int = 256
    """Per-rank evaluation batch size (of every evaluation that sets none)."""
    classnames: str | None = None
    """Zero-shot evaluation (image-text models) with a set of class names and prompt templates vitscale
    ships: ``imagenet`` = the 1,000 ImageNet classes and the 80 templates of the CLIP paper's ImageNet
    evaluation (arXiv 2103.00020), for an ImageNet val image folder; None = the data's class names and
    ``clip.zeroshot_templates``."""
    probe: Literal["none", "linear", "fewshot"] = "none"
    """``vitscale eval`` on frozen pre-logits features (``forward_head(forward_features(x),
    pre_logits=True)``; CLIP: the image embedding) instead of the model's own head: none | linear
    (L-BFGS multinomial logistic regression on the train split, L2 penalty chosen on a held-out part
    of it, validation top-1 / top-5) | fewshot (big_vision's few-shot evaluator: closed-form ridge
    regression on ``shots`` images per class, validation top-1 averaged over ``fewshot_seeds``)."""
    probe_l2: tuple[float, ...] = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
    """Linear probe: the L2 penalties tried (on standardised features; objective = mean
    cross-entropy + l2 / 2 * |W|^2, so scikit-learn's C = 1 / (l2 * n_train)); one value = no search."""
    probe_holdout: float = 0.2
    """Linear probe: fraction of each class of the train split held out to choose ``probe_l2`` (a
    split keyed by ``train.seed``); the chosen penalty is then refit on the whole train split."""
    probe_max_iter: int = 1000
    """Linear probe: L-BFGS iterations per fit (at most)."""
    probe_features: ProbeFeatures = "pooled"
    """Linear probe: the features it reads: pooled (the pre-logits representation) | class_token |
    class_token_patch_mean — DINOv2's linear-evaluation features (``dinov2/eval/linear.py``
    ``create_linear_input``): the normalised class tokens of a ViT's last ``probe_blocks`` blocks
    concatenated, and with ``_patch_mean`` the last block's mean patch token."""
    probe_blocks: int = 1
    """Linear probe with ``probe_features`` other than pooled: the last blocks whose class tokens are
    read (DINOv2 evaluates 1 and 4)."""
    shots: tuple[int, ...] = (1, 5, 10, 25)
    """Few-shot: training images per class (big_vision's default; ``eval.shots=1,5,10``)."""
    fewshot_seeds: int = 3
    """Few-shot: draws of the k images per class (keyed by ``train.seed``, draw and class);
    accuracies are averaged over them (big_vision: 3)."""
    fewshot_l2: float = 1024.0
    """Few-shot: ridge penalty on whitened features (big_vision: 2 ** 10)."""

    def __post_init__(self) -> None:
        finite(self, "eval")
        at_least("eval.every", self.every, 0, "evaluate every N steps; 0 = only at the end")
        at_least("eval.batch_size", self.batch_size, 1, "images per evaluation batch")
        at_least("eval.probe_blocks", self.probe_blocks, 1, "the last blocks whose class tokens the linear probe reads")
        check_ranges(self, "eval")  # every declared bound (RANGES), past the messages above


@dataclass
class LogConfig:
    """Logging."""

    tensorboard: bool | None = None
    """Also write TensorBoard events (the logged values as scalars, the settings as hyperparameters)
    to output_dir/tb: true | false | null (the default: on when the tensorboard package is installed).
    true without the package: a one-line note, the run goes on without it."""
    progress: Literal["auto", "bar", "plain", "none"] = "auto"
    """auto (a tqdm bar on a terminal, plain lines otherwise) | bar (a progress bar with the loss,
    and a line of metrics at each log step above it) | plain (the lines only) | none."""
    flops: bool = True
    """Log achieved TFLOP/s (and MFU, in percent, when the device peak is known)."""
    report: bool = True
    """Write report.html (plots of the run, vitscale.tools.report) at each evaluation and at the end."""
    wandb: bool = False
    """Also report to Weights & Biases (rank 0): the config, the logged values, the summary and the
    report's plots; the run id is kept in output_dir/trackers.json, so a resumed or requeued run
    continues the same W&B run. Settings from W&B's environment (WANDB_MODE=offline, WANDB_DIR,
    WANDB_ENTITY, WANDB_API_KEY); a missing package or an unreachable server is a one-line note."""
    mlflow: bool = False
    """Also report to MLflow (rank 0), as ``log.wandb`` does; the tracking URI from MLFLOW_TRACKING_URI
    (a server, or a local SQLite store such as ``sqlite:////data/mlflow.db``, MLflow 3.x's default; a
    file store ``file:/data/mlruns`` only with MLFLOW_ALLOW_FILE_STORE=true, docs/distributed.md)."""
    project: str = "vitscale"
    """The W&B project and the MLflow experiment the run reports to; the run's name is its folder's."""


@dataclass
class Config:
    """A whole run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The model."""
    data: DataConfig = field(default_factory=data_config)
    """Data, augmentation and loading: the class of its ``data.format`` (``vitscale.config.data``)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimizer."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """The learning-rate schedule."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The training loop."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Parallel layout."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Numerics."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoints."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation (the task's default evaluations when ``evals`` is empty; ``vitscale eval`` probes)."""
    evals: tuple[EvaluatorConfig, ...] | None = None
    """The run's evaluations, each ``{kind, name, every, data, split, ...}`` (``kind``: a registered
    evaluator; its metrics logged as ``<name>_<metric>``; docs/training.md, "Evaluations"); unset (null)
    = the task's default evaluations on the val split (``eval.every``); ``[]`` = none."""
    log: LogConfig = field(default_factory=LogConfig)
    """Logging."""


def config_class(task: str | None = None, model: str | None = None) -> type[Config]:
    """The root config class of a run of ``task`` (None: the default task of ``model``'s family; no
    model: ``model.name``'s default): the task's ``config`` (``ContrastiveConfig``, ...), looked up
    through ``vitscale.registry`` (the task's module is imported then, not by this one)."""
    if task is None:
        task = model_family(model or ModelConfig.name).task
    return TASKS.get(task).config


def config_classes() -> list[type[Config]]:
    """The root config class of every known task, each once (to list every key and group)."""
    return list(dict.fromkeys(cls.config for _, cls in TASKS.items()))
