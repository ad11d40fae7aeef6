"""What a run trains: a task's training module (:meth:`vitscale.tasks.Task.build`).

A :class:`TrainModule` holds the family's model (``backbone``: what is exported, evaluated, handed
to another run) and the task's own parts (``parts``: a teacher, heads, centres, a decoder), and
declares what the rest of the run needs of it, so that no other layer knows a task:

- its parameter groups (:meth:`TrainModule.param_groups`: :class:`ParamGroup`, each with
  learning-rate and weight-decay multipliers and a schedule key; the optimizer splits each by weight
  decay as it splits the backbone's), and what the task schedules itself per step
  (:meth:`TrainModule.hyper`: a learning-rate factor per schedule key, a weight-decay factor);
- what happens after an optimizer update (:meth:`TrainModule.after_update`: an EMA teacher);
- the modules whose gradients are clipped each on its own with ``train.grad_clip_scope=part``
  (:meth:`TrainModule.clip_parts`);
- the weight sets it can hand over by name (:attr:`TrainModule.weight_sets`: ``backbone`` always,
  e.g. ``teacher``), where the checkpoint keeps them;
- the parts' layout under torchrun (:meth:`TrainModule.layout_plan`, applied by
  :class:`vitscale.distributed.parallelize.PartsPlan`, applied by ``parallelize_parts``, the tail a
  family's plan goes through).

The run's checkpoint holds the backbone as ``model.*`` (what every reader of a checkpoint's weights
reads) and the parts as ``task.*``; the optimizer state is keyed alike (``optim.state.<backbone's
name>``, ``optim.state.task.<part's name>``), so a family's model checkpoints as it always has.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from vitscale.distributed.parallelize import PartsPlan

PARTS_KEY = "task"
"""The checkpoint key of a training module's parts (the backbone's is ``model``)."""


@dataclass
class ParamGroup:
    """Parameters a module trains alike. ``name``: ``""`` for the backbone's own (its groups keep the
    names ``decay`` / ``no_decay`` / ``head``), else the groups are ``<kind>.<name>``; ``params``:
    ``(name, parameter)`` pairs, names relative to the module that owns them (the backbone's are
    matched against its ``no_weight_decay()`` and ``head_parameter_names()``, and split by
    ``optim.layer_decay``); ``lr_scale`` / ``wd_scale``: multipliers of the run's learning rate and
    weight decay; ``schedule``: the key :meth:`TrainModule.hyper` answers for these groups."""

    name: str
    params: list[tuple[str, nn.Parameter]]
    lr_scale: float = 1.0
    wd_scale: float = 1.0
    schedule: str | None = None
    backbone: bool = False


@dataclass
class Hyper:
    """What a module schedules itself at an optimizer update: ``lr``, a factor per schedule key (on top
    of the run's learning-rate schedule; a key not named: 1); ``weight_decay``, a factor of every
    group's weight decay."""

    lr: dict[str, float] = field(default_factory=dict)
    weight_decay: float = 1.0


class TrainModule(nn.Module):
    """The family's model and a task's parts (see the module docstring). ``notices``: lines the run
    prints at its start (what the task built)."""

    weight_sets: dict[str, str] = {}
    """Weight sets besides ``backbone`` that this module's checkpoint holds, by name: the path of each
    under :attr:`parts` (``{"teacher": "teacher.backbone"}``), read back as the family's model
    (``vitscale convert --key NAME``, ``vitscale export --weights NAME``)."""

    def __init__(self, backbone: nn.Module, parts: dict[str, nn.Module] | None = None, notices: list[str] | None = None):
        super().__init__()
        self.backbone = backbone
        self.parts = nn.ModuleDict(parts or {})
        self.notices = list(notices or [])

    def forward(self, *args, **kwargs):
        """The backbone's forward (a task's loss calls the parts it needs itself)."""
        return self.backbone(*args, **kwargs)

    # ------------------------------------------------------------------------------ optimizer
    def param_groups(self) -> list[ParamGroup]:
        """The groups the optimizer builds: by default the backbone's trainable parameters, then the
        parts' trainable ones as one group ``parts``."""
        groups = [ParamGroup("", trainable(self.backbone), backbone=True)]
        rest = trainable(self.parts)
        if rest:
            groups.append(ParamGroup("parts", rest))
        return groups

    def hyper(self, step: int) -> Hyper:
        """What the module schedules itself at optimizer update ``step`` (1-based). Default: nothing."""
        return Hyper()

    def after_update(self, step: int, ok: torch.Tensor | None = None) -> None:
        """Called after optimizer update ``step`` (1-based). ``ok``: the step's finite flag, a device
        scalar (1.0 = the update was applied, 0.0 = skipped: what follows the update should not move
        either; None = applied). Read it on the device (a weight), not on the host. Default: nothing."""

    def parts_initialised(self, parts: tuple[str, ...]) -> list[str]:
        """Called once ``parts`` were read from ``checkpoint.init_from``'s checkpoint
        (``checkpoint.init_parts``), before the optimizer is built: what follows from them (DINO's Gram
        teacher from the kept teacher), a line each. Default: nothing."""
        return []

    def evaluated(self) -> dict[str, nn.Module]:
        """Weight sets the run evaluates beside the backbone, by name (metrics ``<eval>_<key>_<name>``:
        DINO's teacher, as DINOv2 evaluates it). Default: none."""
        return {}

    # ------------------------------------------------------------------------------ layout
    def layout_plan(self) -> PartsPlan:
        """The parts' layout under torchrun. Default: each part an FSDP2 unit of its own."""
        return PartsPlan(fsdp=list(self.parts.values()))

    # ------------------------------------------------------------------------------ grads
    def clip_parts(self) -> list[nn.Module]:
        """The modules ``train.grad_clip_scope=part`` clips each on its own: the backbone, then each part
        (one that trains nothing has no gradient and is left out). Default: ``[backbone, *parts]``."""
        return [self.backbone, *self.parts.values()]

    def set_requires_gradient_sync(self, flag: bool) -> None:
        """FSDP2's gradient reduction on or off for every unit of the module (grad accumulation)."""
        for m in self.fsdp_units():
            m.set_requires_gradient_sync(flag, recurse=False)

    def fsdp_units(self) -> Iterator[nn.Module]:
        for m in self.modules():
            if hasattr(m, "set_requires_gradient_sync") and hasattr(m, "unshard"):  # an FSDPModule
                yield m


def freeze_unreached(model: nn.Module, objective, others: tuple[nn.Module, ...] = ()) -> list[str]:
    """Freeze the parameters of ``model`` that a task's objective does not reach (the classifier of a
    self-supervised or feature-distillation run), found by one backward pass of ``objective(model)`` (a
    scalar of a blank input) in eval mode, no dropout drawn: they would get no gradient and no optimizer
    state, and a checkpointed optimizer would not match a resumed one. ``others``: the task's own
    modules the pass also went through (their gradients cleared). Returns the frozen names."""
    was = model.training
    model.eval()
    try:
        with torch.enable_grad():
            objective(model).float().sum().backward()
        unreached = [n for n, q in model.named_parameters() if q.requires_grad and q.grad is None]
    finally:
        for m in (model, *others):
            m.zero_grad(set_to_none=True)
        model.train(was)
    params = dict(model.named_parameters())
    for n in unreached:
        params[n].requires_grad_(False)
    return unreached


def trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of ``module``'s parameters that require gradients."""
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad]


def as_train_module(model: nn.Module) -> TrainModule:
    """``model`` itself when it is a :class:`TrainModule`, else a module of it alone."""
    return model if isinstance(model, TrainModule) else TrainModule(model)


__all__ = ["Hyper", "PARTS_KEY", "ParamGroup", "PartsPlan", "TrainModule", "as_train_module", "freeze_unreached",
           "trainable"]
