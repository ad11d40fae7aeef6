"""What a task is, and the registry of tasks: a task is one module that declares everything a run of
it needs and registers itself (after torchtitan's ``protocols/train_spec.py``):

- its run config (``config``: a subclass of :class:`vitscale.config.Config` with the task's groups as
  ordinary fields, e.g. ``ContrastiveConfig`` with ``clip`` and ``distill``; the config loader builds a
  run of the task as this class, so ``config.yaml`` holds its groups only);
- its loss per micro-batch and the training metrics beside it (:meth:`Task.loss`);
- what it reads of the data: whether its loss reads class labels (:attr:`Task.reads_labels`; a task
  that does not trains on a folder of images without classes, ``data.format=images``), and the views
  each training sample yields, when it trains on several (:meth:`Task.views`: crops and masks the
  loader's workers cut, :mod:`vitscale.data.views`);
- its own up-front checks (:meth:`Task.check`, beside the run's: what needs more than one group;
  a group checks its own fields in its ``__post_init__``);
- its default evaluations (:meth:`Task.default_evals`: the entries a run gets when its config sets
  no ``evals:``, built from the ``eval.*`` keys);
- the loss ``vitscale bench`` times (:meth:`Task.bench_loss`, on the output of our model and of the
  reference implementations alike);
- what it trains (:meth:`Task.build`, once the run is assembled: the training module,
  :class:`vitscale.tasks.module.TrainModule` — the family's model and the task's own parts, which
  declares its parameter groups, what follows an optimizer update, its parts' layout and the weight
  sets it hands over; components that need the layout, such as a distillation teacher; changes to the
  model before the optimizer sees it, such as CLIP's tower locks), and the time its parts took
  (:meth:`Task.step_times`, for the throughput line);
- what it adds to the family's model, counted for ``vitscale memory`` (:meth:`Task.parts_on_meta`).

The trainer never branches on a model's name: ``train.task``, else the family's default task
(``FamilySpec.task``), picks a class from this registry. ``tests/unit/test_new_task.py`` adds a task
from its test file alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vitscale.config.schema import Config
from vitscale.registry import TASKS

from .module import TrainModule

if TYPE_CHECKING:
    from vitscale.data.views import Views


class Task:
    """``Task(cfg, model, num_classes, dp_group, class_names)``; the trainer calls :meth:`loss` per
    micro-batch.

    ``dp_group``: the process group of the data-parallel ranks (``ParallelDims.dp_group()``; None =
    the world): losses that span the global batch combine over it. ``class_names``: the class names
    of the run's data (as the run assembly resolved them). Attributes the trainer sets after
    construction: ``autocast`` (a zero-argument context factory for the forward pass) and ``device``.
    """

    name = "task"
    config: type[Config] = Config
    """The root config of a run of this task: :class:`Config`, or a subclass with the task's own groups
    as fields (``ContrastiveConfig``: ``clip``, ``distill``)."""
    tokenizer: Any = None
    """The text tokenizer of an image-text task (zero-shot prompts), else None."""
    reads_labels: bool = True
    """Whether training reads the samples' class labels (or captions made from them). False for a task
    whose loss reads the images alone (DINO, MAE, feature distillation): it also trains on data whose
    samples carry none (a format with ``labels=False``: ``data.format=images``), where a task that
    reads them is refused before anything is read (:func:`vitscale.run.checks.check_run`)."""
    weight_sets: dict[str, str] = {}
    """The weight sets its training module's checkpoint holds besides the family's model
    (:attr:`vitscale.tasks.module.TrainModule.weight_sets`), read without building the module."""

    def __init__(self, cfg: Any, model: nn.Module, num_classes: int | None, dp_group=None,
                 class_names: list[str] | None = None):  # fmt: skip
        self.cfg, self.model = cfg, model
        self.num_classes = num_classes
        self.dp_group = dp_group
        self.class_names = list(class_names or [])
        self.autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
        self.device = torch.device("cpu")
        self.runtime: Any = None
        """What the run that trains this task was handed by the task's own :meth:`job` (``train(cfg,
        runtime=...)``), None for a plain run: the runtime object one part of a job shares with the others
        (feature distillation's students: the job's exchange of the teachers' features). A runtime with a
        ``stop_group`` has the stop on a signal agreed over that group (the whole job) rather than the run's
        own ranks."""

    @classmethod
    def for_evaluation(cls, cfg: Any, model: nn.Module, num_classes: int | None, dp_group=None,
                       class_names: list[str] | None = None) -> Task:  # fmt: skip
        """The task that evaluates trained weights (``vitscale eval``): this one, unless training it
        needs more than the model and the data (token labeling evaluates as classification)."""
        return cls(cfg, model, num_classes, dp_group, class_names)

    def read_for_evaluation(self, run: Any, path: Any, evals: tuple | None) -> list[str]:
        """Called by ``vitscale eval`` on the task :meth:`for_evaluation` gave, once the model holds the
        weights of the checkpoint at ``path``, with the assembled ``run``: read what the task's own
        evaluations need besides the model (feature distillation's teachers and adaptor heads).
        ``evals``: the entries that will run (None: the task's defaults). Returns notes, a line each
        (what was left out, and why). Default: nothing."""
        return []

    @classmethod
    def check(cls, cfg: Any, model: Any, dims: Any, purpose: str) -> None:
        """The task's own up-front checks of a run (:func:`vitscale.run.checks.check_run` calls it, before
        any data is read or model built), raising :class:`vitscale.errors.CheckError` in one line that
        names the setting: what needs more than one config group (the resolved model ``model``, a
        :class:`vitscale.models.registry.ResolvedModel`; the layout ``dims``; ``purpose``: ``train``,
        ``eval``, ``label`` or ``bench``). A check of one group's own fields lives in that group's
        ``__post_init__``; a group of another task is refused as the config loads (each task's run
        config, :attr:`config`, holds its own groups only). Default: nothing. An override calls
        ``super().check``."""

    @classmethod
    def model_defaults(cls, cfg: Any, model_cfg: Any) -> dict[str, Any]:
        """Changes to the model's config that this task's settings imply (SigLIP's temperature and bias
        under ``train.loss=sigmoid``), applied when the run resolves its model, under the user's own
        ``model.*`` overrides (a key the user sets is theirs). ``model_cfg``: the variant's config.
        Default: none."""
        return {}

    @classmethod
    def views(cls, cfg: Any) -> Views | None:
        """The views each training sample yields (:class:`vitscale.data.views.Views`: named crops, their
        augmentation, block masks), cut by the loader's workers instead of its own crop and augmentation:
        the training batches then hold them (``global``, ``local``, ``masks``) and no ``image``.
        Default: None (the loader's ``image``)."""
        return None

    @classmethod
    def job(cls, cfg: Any) -> Callable[..., dict[str, Any]] | None:
        """How :func:`vitscale.train.train` trains ``cfg`` when it is not one run: a function
        ``fn(cfg, train, summary=..., notes=...)`` that trains it — each of its runs by calling ``train``
        (:func:`vitscale.train.train`, handed over: no task imports the trainer) — and returns the summary
        (feature distillation's ``distill.students``: one run per student, on its own ranks). Default:
        None (one run, the trainer's)."""
        return None

    def build(self, run: Any) -> TrainModule:
        """Called once by the trainer with the assembled run (:class:`vitscale.run.Run`: layout, device,
        data settings; the family's model already holds ``checkpoint.init_from``'s weights) after
        :attr:`autocast` and :attr:`device` are set and before the optimizer is built: the training
        module of the run — the model and the task's own parts (:mod:`vitscale.tasks.module`) — with
        the lines the run prints (``notices``). Build here the components that need the layout (a
        distillation teacher) and change the model (freeze parameters). Default: the model alone."""
        return TrainModule(self.model)

    held_parts: tuple[str, ...] = ()
    """The parts of :meth:`parts_on_meta` the training module holds without training them (a teacher)."""

    @classmethod
    def parts_on_meta(cls, group: Any, backbone: nn.Module) -> dict[str, nn.Module]:
        """The training module's parts as :meth:`build` makes them around ``backbone`` (a model of the
        family, on the meta device: shared, not copied), by name, on the meta device (``group``: the
        task's config group, None for its defaults): what ``vitscale memory --task`` counts (trained,
        or held: :attr:`held_parts`) and what ``checkpoint.init_parts`` checks a previous stage's
        checkpoint against, tensor by tensor (``teacher.head.mlp.0.weight``), before the run starts.
        Default: none."""
        return {}

    def step_times(self) -> dict[str, float]:
        """Seconds the task's named parts took since the last call (``{"teacher": s}``), read at log
        steps only; logged as ``<part>_time_pct`` of the step time. Default: none."""
        return {}

    def log_metrics(self, step: int) -> tuple[dict[str, float], list[str]]:
        """Metrics computed at log steps only, from what the task kept of the step just done — work
        that reads the device on the host (an SVD), which a step must not do — and lines to print (a
        warning). Called on every rank (it may combine over :attr:`dp_group`); logged beside the
        ``train_*`` metrics of :meth:`loss` (e.g. ``train_rankme``: :mod:`vitscale.tasks.health`).
        Default: none."""
        return {}, []

    def loss(self, model: nn.Module, batch: dict, step: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Mean loss of the (already on-device) micro-batch and detached metric tensors (``train_*``).

        ``step`` is a counter of micro-batches (keys per-batch randomness such as mixup)."""
        raise NotImplementedError

    @classmethod
    def default_evals(cls, cfg: Any) -> list[dict[str, Any]]:
        """The ``evals:`` entries of a run that sets none (the ``eval.*`` keys say how often)."""
        return [{"kind": "classification", "name": "val", "every": cfg.eval.every, "loss": cfg.train.loss}]

    @staticmethod
    def bench_loss(out: Any, labels: torch.Tensor) -> torch.Tensor:
        """The loss ``vitscale bench`` times on a model's output (ours or a reference's) for synthetic
        class labels: by default cross-entropy of the first output (the logits)."""
        return torch.nn.functional.cross_entropy(first_output(out).float(), labels)

    def fit_context(self, tokens: torch.Tensor) -> torch.Tensor:
        """Caption tokens cut to the model's text context (image-text tasks; others: as they are)."""
        return tokens


class PretrainingTask(Task):
    """A task that trains the backbone for its features, not a classifier (DINO, MAE, feature
    distillation): its run's default evaluations read the frozen backbone (``knn`` and ``linear_probe``:
    :func:`vitscale.tasks.health.frozen_backbone_evals`), and ``vitscale bench`` refuses it in one line —
    the bench's step is a loss of the model's output on whole images, not what the task's step holds
    (:attr:`bench_step`; :attr:`bench_hint` says how to time it instead)."""

    bench_step = "the task's own step"
    bench_hint = "time a run with `vitscale train`"

    @classmethod
    def bench_loss(cls, out: Any, labels: torch.Tensor) -> torch.Tensor:
        from vitscale.errors import ConfigError

        raise ConfigError(f"--task {cls.name}: the bench times a loss of the model's output on whole images, not "
                          f"{cls.bench_step}; {cls.bench_hint}")  # fmt: skip

    @classmethod
    def default_evals(cls, cfg: Any) -> list[dict[str, Any]]:
        from .health import frozen_backbone_evals

        return frozen_backbone_evals(cfg)


def first_output(out: Any) -> torch.Tensor:
    """The logits of a model's output: the tensor itself, a dict's ``logits`` (else its first value),
    a tuple's first element."""
    if isinstance(out, dict):
        return out.get("logits", next(iter(out.values())))
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def register_task(cls: type[Task]) -> type[Task]:
    """Make ``train.task=<cls.name>`` train with ``cls`` (a run of it is configured by ``cls.config``)."""
    return TASKS.register(cls.name, cls)


def get_task(name: str) -> type[Task]:
    """The task ``train.task=<name>`` trains with (ConfigError naming the closest task otherwise)."""
    return TASKS.get(name)
