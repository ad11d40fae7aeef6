"""Self-distillation with no labels, DINOv2's way (``train.task=dino``): Oquab et al. 2023, "DINOv2:
Learning Robust Visual Features without Supervision", arXiv 2304.07193; reference code
facebookresearch/dinov2 at b8931f7 (``dinov2/train/ssl_meta_arch.py``, ``dinov2/loss/``,
``dinov2/layers/dino_head.py``, ``dinov2/data/``; lines cited in each part). Labels are ignored.

- **Views** (:mod:`vitscale.tasks.dino_crops`, cut by the loader's workers: :mod:`vitscale.data.views`):
  2 global and ``dino.local_crops_number`` local crops of each image with DINOv2's colour jitter, blur
  and solarisation, and iBOT's masks, keyed by (``train.seed``, epoch, the sample's dataset index,
  repeat, view): the same on resume and on any number of ranks.
- **Student and teacher**: the student is the run's model (its backbone) with a DINO head
  (:mod:`vitscale.tasks.dino_head`); with iBOT the backbone's own learnt mask token (zeros, DINOv2's
  ``vision_transformer.py`` line 169) takes the masked patches' embeddings (line 218) through the token
  interface (``model(x, tokens=True, keep=..., mask=...)``, :class:`vitscale.models.contract.Tokens`,
  which also gives the pooled and the patch features below); the teacher is a copy of both, updated after every optimizer step as
  ``t = m t + (1 - m) s`` (``ssl_meta_arch.py`` lines 356-365) with ``m`` on a cosine from
  ``dino.momentum_teacher`` to ``dino.final_momentum_teacher`` (:func:`~vitscale.tasks.dino_loss.momentum_at`).
  The update follows each optimizer update (:meth:`DinoModule.after_update`, weighted by the step's
  finite flag: a skipped step moves neither). Both, and the running centres, are the parts of the
  task's training module (:class:`DinoModule`, :mod:`vitscale.tasks.module`): trained or carried,
  checkpointed (``task.*``) and resumed with the model, left out of ``model.safetensors``; the teacher's
  backbone is its ``teacher`` weight set (``vitscale convert --key teacher``).
- **The class token** (DINOv2's ``x_norm_clstoken``) is the backbone's own pooled, normalised features
  (its ``pre_logits``, what the k-NN and probes evaluate): the class token for ``pool=token``,
  ``fc_norm`` of the mean patch token for ``avg``, the attention pool's output for ``map``; the patch
  tokens (``x_norm_patchtokens``) are normalised as the backbone normalises (``norm``, or ``fc_norm``
  where it normalises after pooling).
- **Losses** (:mod:`vitscale.tasks.dino_loss`): the DINO class-token cross-entropy between the
  student's crops and the teacher's targets of the other global crops (targets by a running softmax
  centre or Sinkhorn-Knopp, ``dino.centering``, at the teacher temperature of this step; the local
  crops' terms weighted by DINOv3's ``dino.local_loss_weight_schedule``), KoLeo on the
  student's class tokens of each global crop, and iBOT's cross-entropy on the masked patches of the
  global crops (``ssl_meta_arch.py`` lines 132-346); DINOv3's Gram loss (:mod:`vitscale.tasks.gram`) on
  the global crops' patch features, its teacher on the global crops or on larger crops of its own
  (the views' ``gram``), its weight ``dino.gram_loss_weight`` or scheduled.
- **The prototypes** have learning rate 0 for the first ``dino.freeze_last_layer_epochs``, as DINOv2's
  ``last_layer_lr_schedule`` (``dinov2/train/train.py`` lines 98-100): their own parameter group,
  scheduled by the module (:meth:`DinoModule.hyper`); their gradient still counts in the clipping norm
  and AdamW's moments, as there, and no weight decay moves them. Their layer is DINOv2's weight-normalised
  one, DINO v1's unit prototypes or DINOv3's plain linear layer (``dino.head_last_layer``), optionally
  after a batch-normalised MLP (DINO v1's ``dino.head_use_bn``); ``train.grad_clip_scope: part`` clips
  the backbone and each head apart (:meth:`DinoModule.clip_parts`).
- **Weight decay**: constant ``optim.weight_decay``, or DINOv2's cosine to ``dino.weight_decay_end``
  (:meth:`DinoModule.hyper`).
- **Layout** (:mod:`vitscale.tasks.dino_layout`): one process, or FSDP2 data parallelism and tensor
  parallelism under torchrun, with the teacher sharded as the student (the heads' MLPs column / row
  parallel, the prototypes split over the TP ranks, their logits gathered before the targets).
- **Health** at log steps: ``train_rankme`` of the teacher's class tokens and the teacher targets'
  entropy and KL divergence from uniform (:mod:`vitscale.tasks.health`).
- **Not yet**: ``vitscale bench --task dino``.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from vitscale.data import keyed
from vitscale.distributed.parallelize import parallelize_parts
from vitscale.distributed.utils import move_towards
from vitscale.errors import ConfigError

from .base import PretrainingTask, register_task
from .dino_config import DinoConfig, DinoPretrainingConfig
from .dino_crops import STREAM_DINO_INIT, dino_views
from .dino_head import DinoHead
from .dino_layout import check_layout, copy_weights, head_plan, keep_root_gathered, release, teacher_backbone
from .dino_loss import (
    dino_loss,
    ibot_loss,
    koleo_loss,
    momentum_at,
    sinkhorn_knopp,
    softmax_centered,
    teacher_temp_at,
    update_center,
    warmup_cosine_at,
)
from .gram import gram_loss, refreshes_after, resize_patches
from .health import RankWatch, TeacherWatch
from .module import Hyper, ParamGroup, PartsPlan, TrainModule, freeze_unreached, trainable


class DinoStudent(nn.Module):
    """The student's training-only parts: its DINO head and an iBOT head of its own
    (``ibot_separate_head``). The mask token is the backbone's own (``model.mask_token``, DINOv2's
    ``vision_transformer.py`` line 169), asked for by :meth:`DinoTask.model_defaults`."""

    def __init__(self, width: int, dc: DinoConfig, ibot: bool):
        super().__init__()
        sizes = dict(nlayers=dc.head_nlayers, hidden_dim=dc.head_hidden_dim, bottleneck_dim=dc.head_bottleneck_dim,
                     last_layer=dc.head_last_layer, use_bn=dc.head_use_bn)
        self.head = DinoHead(width, dc.head_n_prototypes, **sizes)
        self.ibot_head = DinoHead(width, dc.head_n_prototypes, **sizes) if ibot and dc.ibot_separate_head else None


class DinoCentres(nn.Module):
    """The running centres of the teacher's class-token and patch logits (``centering: softmax``)."""

    def __init__(self, k: int):
        super().__init__()
        self.register_buffer("cls", torch.zeros(1, k))
        self.register_buffer("patch", torch.zeros(1, k))


class DinoModule(TrainModule):
    """DINO's training module: the student's backbone (the family's model), ``student`` (its heads:
    :class:`DinoStudent`), ``teacher`` (the EMA copy: ``backbone``, ``head``, ``ibot_head``) and
    ``centres``. It declares the prototypes' own parameter group (learning rate 0 while frozen), DINOv2's
    weight-decay cosine, the teacher's update after each optimizer step and the heads' layout."""

    weight_sets = {"teacher": "teacher.backbone"}

    def __init__(self, backbone: nn.Module, student: DinoStudent, teacher: nn.ModuleDict, centres: DinoCentres,
                 schedules: dict, notices: list[str], gram_teacher: nn.Module | None = None):  # fmt: skip
        parts = {"student": student, "teacher": teacher, "centres": centres}
        if gram_teacher is not None:  # DINOv3's Gram teacher: a frozen copy of the EMA teacher's backbone
            parts["gram_teacher"] = gram_teacher
        super().__init__(backbone, parts, notices)
        self.dc, self.total = schedules["dc"], schedules["total"]
        self.freeze_steps, self.wd0 = schedules["freeze_steps"], schedules["wd0"]
        self._pairs: list[tuple[nn.Parameter, nn.Parameter]] = []

    @property
    def ema_pairs(self) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """``(teacher, student)`` parameter pairs the teacher's EMA moves: the backbone's, then the heads'
        (listed on first use, once the layout has put the parameters in place)."""
        if not self._pairs:
            teacher, student = self.teacher, self.student
            tb = dict(teacher["backbone"].named_parameters())
            self._pairs = [(tb[n], q) for n, q in self.backbone.named_parameters()]
            for key in ("head", "ibot_head"):
                if key in teacher:
                    self._pairs += list(zip(teacher[key].parameters(), getattr(student, key).parameters(), strict=True))
        return self._pairs

    @property
    def student(self) -> DinoStudent:
        return self.parts["student"]

    @property
    def teacher(self) -> nn.ModuleDict:
        return self.parts["teacher"]

    @property
    def centres(self) -> DinoCentres:
        return self.parts["centres"]

    @property
    def gram_teacher(self) -> nn.Module | None:
        return self.parts["gram_teacher"] if "gram_teacher" in self.parts else None

    def gram_active(self, it: int) -> bool:
        """Whether the Gram loss enters iteration ``it`` (0-based): on, and its teacher loaded (after update
        ``dino.gram_it_load_ema_teacher``; the EMA teacher itself is always there)."""
        dc = self.dc
        return dc.gram_loss_weight > 0 and (dc.gram_ema_teacher or it >= dc.gram_it_load_ema_teacher)

    def param_groups(self) -> list[ParamGroup]:
        """The backbone's groups (its patch embedding apart, at ``dino.patch_embed_lr_mult``; both frozen
        for ``dino.freeze_backbone_steps``), the heads' as ``heads``, and each head's
        prototypes (``last_layer_parameters``) as ``prototypes``, scheduled by :meth:`hyper`."""
        protos = {id(q) for h in (self.student.head, self.student.ibot_head) if h is not None
                  for q in h.last_layer_parameters()}  # fmt: skip
        own = trainable(self.student)
        body = trainable(self.backbone)
        embed = [(n, q) for n, q in body if n.startswith("patch_embed.")]
        rest = [(n, q) for n, q in body if not n.startswith("patch_embed.")]
        return [ParamGroup("", rest, backbone=True, schedule="backbone"),
                ParamGroup("patch_embed", embed, lr_scale=self.dc.patch_embed_lr_mult, backbone=True, schedule="backbone"),
                ParamGroup("heads", [(n, q) for n, q in own if id(q) not in protos]),
                ParamGroup("prototypes", [(n, q) for n, q in own if id(q) in protos], schedule="prototypes")]  # fmt: skip

    def hyper(self, step: int) -> Hyper:
        """DINOv2's schedules at iteration ``step - 1`` (``apply_optim_scheduler``): the prototypes at
        learning rate 0 while frozen (``last_layer_lr``); with ``dino.weight_decay_end``, every group's
        decay scaled by the cosine from ``optim.weight_decay`` to it (``wd x wd_multiplier``)."""
        end = self.dc.weight_decay_end
        wd = 1.0 if end is None else momentum_at(step - 1, self.wd0, end, self.total) / self.wd0
        lr = {"prototypes": 0.0} if step - 1 < self.freeze_steps else {}
        if step <= self.dc.freeze_backbone_steps:  # the heads warm up on a frozen backbone
            lr["backbone"] = 0.0
        return Hyper(lr=lr, weight_decay=wd)

    def after_update(self, step: int, ok: torch.Tensor | None = None) -> None:
        """``teacher = m teacher + (1 - m) student`` after optimizer update ``step``, parameter by
        parameter on the local shards (``ssl_meta_arch.py`` lines 356-365), ``m`` on DINOv2's cosine at
        iteration ``step - 1``; a skipped (non-finite) step moves nothing."""
        m = momentum_at(step - 1, self.dc.momentum_teacher, self.dc.final_momentum_teacher, self.total)
        move_towards([a for a, _ in self.ema_pairs], [b for _, b in self.ema_pairs], 1.0 - m, ok)
        dc, gram = self.dc, self.gram_teacher
        if gram is not None and refreshes_after(step, load_at=dc.gram_it_load_ema_teacher, rep_update=dc.gram_rep_update,
                                                every=dc.gram_update_frequency, first=dc.gram_it_first_update,
                                                most=dc.gram_max_updates):  # fmt: skip
            copy_weights(self.teacher["backbone"], gram)  # DINOv3's update_gram / gram_load_ema_teacher

    def parts_initialised(self, parts: tuple[str, ...]) -> list[str]:
        """A kept teacher without a kept Gram teacher: the Gram teacher starts as the kept teacher's
        backbone (as :meth:`DinoTask.build` starts it as the teacher's), DINOv3's high-resolution
        stage loading its Gram teacher from the previous stage's teacher (``gram.ckpt``,
        ``dinov3/train/ssl_meta_arch.py`` lines 308-327)."""
        lines, teacher = [], self.teacher
        if "teacher" in parts and self.dc.student_from_teacher:  # DINOv3's resume_from_teacher_chkpt
            copy_weights(teacher["backbone"], self.backbone)
            copy_weights(teacher["head"], self.student.head)
            if self.student.ibot_head is not None:  # the teacher's own iBOT head, or its shared one
                copy_weights(teacher["ibot_head"] if "ibot_head" in teacher else teacher["head"], self.student.ibot_head)
            lines.append("dino.student_from_teacher: the student's backbone and heads start as the kept teacher's")
        gram = self.gram_teacher
        if gram is not None and "teacher" in parts and "gram_teacher" not in parts:
            copy_weights(teacher["backbone"], gram)
            lines.append("checkpoint.init_parts: the Gram teacher starts as the kept teacher's backbone")
        return lines

    def clip_parts(self) -> list[nn.Module]:
        """The backbone, the DINO head and the iBOT head each on its own, as DINOv2 and DINOv3 clip the
        student's modules (``dinov2/train/train.py`` lines 257-259, ``dinov3/train/train.py`` lines 488-493)."""
        return [m for m in (self.backbone, self.student.head, self.student.ibot_head) if m is not None]

    def evaluated(self) -> dict[str, nn.Module]:
        """The teacher's backbone, evaluated beside the student's (``dino.evaluate_teacher``): DINOv2 and
        DINOv3 evaluate the teacher (``dinov2/eval/setup.py`` ``build_model_for_eval`` loads ``teacher``)."""
        return {"teacher": self.teacher["backbone"]} if self.dc.evaluate_teacher else {}

    def layout_plan(self) -> PartsPlan:
        """Under torchrun: each head split over the TP ranks (:func:`~vitscale.tasks.dino_layout.head_plan`,
        its prototypes on their rows), then each head an FSDP2 unit, sharded as its teacher copy (the teacher's backbone is laid out as the student's already)."""
        s, t = self.student, self.teacher
        heads = [h for h in (s.head, s.ibot_head, t["head"], t["ibot_head"] if "ibot_head" in t else None) if h is not None]
        return PartsPlan(tp=[(h, head_plan(), h.row_names) for h in heads],
                         fsdp=[m for m in (s.head, s.ibot_head, t["head"], t["ibot_head"] if "ibot_head" in t else None)
                               if m is not None])  # fmt: skip


class DinoTask(PretrainingTask):
    name = "dino"
    bench_step, bench_hint = "DINO's crops, teacher and heads", "time a DINO step with `vitscale train`"
    config = DinoPretrainingConfig
    reads_labels = False  # its loss reads the images alone (vitscale.tasks.base.Task.reads_labels)
    weight_sets = DinoModule.weight_sets

    def __init__(self, cfg, model, num_classes, dp_group=None, class_names=None):
        super().__init__(cfg, model, num_classes, dp_group, class_names)
        self.model, self.dc, self.seed = model, cfg.dino, cfg.train.seed
        self.accum = cfg.train.grad_accum
        self.mean, self.std = list(cfg.data.mean), list(cfg.data.std)
        self.ibot = cfg.dino.ibot_loss_weight > 0
        self.rank = RankWatch(dp_group, "the teacher's class tokens of the first global crops")
        self.watch = TeacherWatch(dp_group)
        self.iteration = 0
        self.module: DinoModule | None = None

    # ------------------------------------------------------------------------------------- setup
    @classmethod
    def views(cls, cfg):
        from vitscale.models.registry import resolve_model

        return dino_views(cfg.dino, resolve_model(cfg.model.name, **cfg.model.overrides).cfg.patch_dim)

    @classmethod
    def check(cls, cfg, model, dims, purpose):
        """Refused before any data is read or model built, each in one line: a layout the heads cannot
        take, crops that are not whole patches, KoLeo without a neighbour, a weight-decay end without a
        start, a backbone that pools nothing."""
        super().check(cfg, model, dims, purpose)
        if purpose != "train":
            return
        check_layout(cfg.dino, dims)
        dc, mcfg, name = cfg.dino, model.cfg, model.name
        if not model.family.model_cls.supports_tokens:
            raise ConfigError(f"train.task=dino: model {name} does not declare its tokens (supports_tokens): use a ViT "
                              "(`vitscale models`)")  # fmt: skip
        p = mcfg.patch_dim
        mixed = bool(dc.global_local_crop_pairs_ratios)
        for g, loc, _ in dc.pairs():
            for key, size in (("global_crops_size", g), ("local_crops_size", loc)):
                if key == "local_crops_size" and dc.local_crops_number == 0:
                    continue
                if size < p or size % p:
                    shown = f"dino.{key}s has {size}, which" if mixed else f"dino.{key}={size}"
                    fix = f"{max(p, size // p * p)}" if mixed else f"dino.{key}={max(p, size // p * p)}"
                    raise ConfigError(f"{shown} must be a multiple of the patch ({p} pixels of {name}), at least "
                                     f"one patch: e.g. {fix}")  # fmt: skip
        for size in dc.gram_crops():
            if size is not None and (size < p or size % p):
                key = "gram_teacher_crops_sizes has" if dc.gram_teacher_crops_sizes else "gram_teacher_crops_size="
                raise ConfigError(f"dino.{key}{' ' if key[-1] == 's' else ''}{size}{', which' if key[-1] == 's' else ''} must be "
                                  f"a multiple of the patch ({p} pixels of {name}), at least one patch: e.g. "
                                  f"{max(p, size // p * p)} (the Gram teacher's patch grid is resized to the student's)")  # fmt: skip
        micro = cfg.train.batch_size // max(dims.dp_size * cfg.train.grad_accum, 1)
        if dc.koleo_loss_weight > 0 and micro < 2:
            raise ConfigError(f"dino.koleo_loss_weight={dc.koleo_loss_weight} with {micro} image per rank and "
                             "micro-step: KoLeo needs a nearest neighbour (one image gives NaN); raise train.batch_size "
                             "or set dino.koleo_loss_weight=0")  # fmt: skip
        if dc.weight_decay_end is not None and cfg.optim.weight_decay <= 0:
            raise ConfigError(f"dino.weight_decay_end={dc.weight_decay_end} needs a start: set optim.weight_decay > 0 "
                             "(DINOv2: 0.04 -> 0.4)")  # fmt: skip
        steps = cfg.train.max_steps
        if steps and dc.freeze_backbone_steps >= steps:  # an epoch-long run is checked once its length is known
            raise ConfigError(f"dino.freeze_backbone_steps={dc.freeze_backbone_steps} freezes the backbone for the whole "
                              f"{steps}-step run: lower it (e.g. {max(steps // 10, 1)})")  # fmt: skip
        if steps:
            check_schedules(dc, steps)
        if dc.student_from_teacher and "teacher" not in cfg.checkpoint.init_parts:
            raise ConfigError("dino.student_from_teacher=true starts the student from the previous stage's teacher: keep it "
                             "with checkpoint.init_parts=[teacher] (and checkpoint.init_from that stage's run folder)")  # fmt: skip
        if getattr(mcfg, "pool", None) == "none":
            raise ConfigError("train.task=dino with model.pool=none: DINO's head reads one feature vector per image; "
                             "use pool token, avg or map")  # fmt: skip

    @classmethod
    def model_defaults(cls, cfg, model_cfg):
        """iBOT masks the student's patches with the backbone's own mask token (``mask_token``)."""
        return {"mask_token": True} if cfg.dino.ibot_loss_weight > 0 and hasattr(model_cfg, "mask_token") else {}

    held_parts = ("teacher", "gram_teacher")  # the teacher's backbone and heads; the Gram teacher's backbone

    @classmethod
    def parts_on_meta(cls, group, backbone):
        """``student`` (its heads: trained), ``teacher`` (a copy of the backbone and the heads) and
        ``centres``, and with a Gram teacher of its own ``gram_teacher`` (another copy of the backbone)."""
        dc = group if group is not None else DinoConfig()
        with torch.device("meta"):
            student = DinoStudent(backbone.num_features, dc, dc.ibot_loss_weight > 0)
            centres = DinoCentres(dc.head_n_prototypes)
        teacher = nn.ModuleDict({"backbone": backbone, "head": student.head})
        if student.ibot_head is not None:
            teacher["ibot_head"] = student.ibot_head
        parts = {"student": student, "teacher": teacher, "centres": centres}
        if dc.gram_loss_weight > 0 and not dc.gram_ema_teacher:
            parts["gram_teacher"] = backbone
        return parts

    def build(self, run):
        model, dc = self.model, self.dc
        keep_root_gathered(run, model)
        self.wd0 = run.cfg.optim.weight_decay
        per_epoch, self.total = run.steps_per_epoch, run.total_steps  # the run's length as the run layer resolved it
        self.rank.for_run(self.total)
        self.watch.for_run(self.total)
        self.temp_warmup = round(dc.warmup_teacher_temp_epochs * per_epoch)
        self.freeze_steps = round(dc.freeze_last_layer_epochs * per_epoch)
        if dc.freeze_backbone_steps >= self.total:
            raise ConfigError(f"dino.freeze_backbone_steps={dc.freeze_backbone_steps} freezes the backbone for the whole "
                              f"{self.total}-step run: lower it (e.g. {max(self.total // 10, 1)})")  # fmt: skip
        check_schedules(dc, self.total)
        device = next(model.parameters()).device
        unreached = self._freeze_unreached(device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(keyed.key(self.seed, STREAM_DINO_INIT))
            student = DinoStudent(model.num_features, dc, self.ibot).to(device)
        teacher = nn.ModuleDict({"backbone": teacher_backbone(run, model), "head": copy.deepcopy(student.head)})
        keep_root_gathered(run, teacher["backbone"])
        if student.ibot_head is not None:
            teacher["ibot_head"] = copy.deepcopy(student.ibot_head)
        teacher.requires_grad_(False)
        n_params = sum(q.numel() for q in student.parameters())
        frozen = ([f"dino: {len(unreached)} tensors the objective does not reach are frozen: {', '.join(unreached[:3])}"
                   f"{', ...' if len(unreached) > 3 else ''}"] if unreached else [])  # fmt: skip
        crops = (f"2 global crops of {dc.global_crops_size} px, {dc.local_crops_number} local of {dc.local_crops_size} px"
                 if not dc.global_local_crop_pairs_ratios else
                 f"2 global and {dc.local_crops_number} local crops a step at one of the sizes "
                 + ", ".join(f"{g}/{loc} px ({w:g})" for g, loc, w in dc.pairs()) + " (global/local, share of the steps)")  # fmt: skip
        notices = [*frozen, f"dino: {crops}; head {dc.head_nlayers} layers -> {dc.head_bottleneck_dim} -> "
                   f"{dc.head_n_prototypes} prototypes ({dc.head_last_layer}{', batch norm' if dc.head_use_bn else ''}; "
                   f"{n_params / 1e6:.2f}M params, not exported); "
                   f"centring {dc.centering}; teacher temperature "
                   + (f"{dc.warmup_teacher_temp} -> {dc.teacher_temp} over {self.temp_warmup} steps" if self.temp_warmup
                      else f"{dc.teacher_temp} from the start") + f", momentum {dc.momentum_teacher} -> {dc.final_momentum_teacher} over {self.total}; "
                   f"prototypes frozen for {self.freeze_steps} steps; iBOT {'on' if self.ibot else 'off'}, KoLeo "
                   f"{dc.koleo_loss_weight}; patch embedding at {dc.patch_embed_lr_mult:g} x the learning rate"
                   + (f"; the backbone frozen for {dc.freeze_backbone_steps} steps (the heads warm up)"
                      if dc.freeze_backbone_steps else ""),
                   "dino: the k-NN and probe evaluations read the student's backbone"]  # fmt: skip
        gram = None
        weight = (f"weight {dc.gram_loss_weight}" if not dc.gram_loss_weight_schedule else
                  "weight " + _shown_schedule(dc.gram_loss_weight_schedule))  # fmt: skip
        if dc.gram_loss_weight > 0 and not dc.gram_ema_teacher:  # laid out as the teacher, starting as it does
            gram = teacher_backbone(run, model).requires_grad_(False)
            keep_root_gathered(run, gram)
            sizes = dc.gram_crops()
            crops = ("on the global crops" if sizes[0] is None else
                     f"on crops of its own ({'/'.join(str(v) for v in sizes)} px, "
                     f"{'undistorted' if dc.gram_teacher_no_distortions else 'distorted as the global crops'}; its patch "
                     f"features resized {dc.gram_global_teacher_resize_method}"
                     f"{' antialiased' if dc.gram_global_teacher_resize_antialias else ''} to the student's grid)")  # fmt: skip
            notices.append(f"dino: Gram anchoring (DINOv3), {weight}: the Gram teacher {crops}, loaded from "
                           f"the EMA teacher after update {dc.gram_it_load_ema_teacher}"
                           + (f", refreshed every {dc.gram_update_frequency} from update {dc.gram_it_first_update}"
                              + (f" ({dc.gram_max_updates} times at most)" if dc.gram_max_updates is not None else "")
                              if dc.gram_rep_update else ""))  # fmt: skip
        elif dc.gram_loss_weight > 0:
            notices.append(f"dino: Gram anchoring (DINOv3), {weight}, against the EMA teacher")
        if dc.local_loss_weight_schedule:
            notices.append("dino: the DINO loss's local-crop terms weighted " + _shown_schedule(dc.local_loss_weight_schedule))
        schedules = {"dc": dc, "total": self.total, "freeze_steps": self.freeze_steps, "wd0": self.wd0}
        module = DinoModule(model, student, teacher, DinoCentres(dc.head_n_prototypes).to(device), schedules, notices,
                            gram)  # fmt: skip
        parallelize_parts(module.layout_plan(), run.dims, run.cfg.precision)  # under torchrun: the heads split over TP, each an FSDP2 unit
        self.module = module
        return module

    # the module's parts, as the loss reads them
    @property
    def student(self) -> DinoStudent:
        return self.module.student

    @property
    def teacher(self) -> nn.ModuleDict:
        return self.module.teacher

    @property
    def centres(self) -> DinoCentres:
        return self.module.centres

    @property
    def ema_pairs(self):
        return self.module.ema_pairs

    def _freeze_unreached(self, device) -> list[str]:
        """Freeze the backbone's parameters DINO's features do not reach (the classifier): one backward
        pass of a blank image (:func:`~vitscale.tasks.module.freeze_unreached`), half its patches masked
        with iBOT, so that the mask token and the patch embedding are both reached."""
        mcfg, n = self.model.cfg, self.model.cfg.num_patches
        x = torch.zeros(1, mcfg.num_channels, mcfg.img_h, mcfg.img_w, device=device)
        half = (torch.arange(n, device=device) % 2 == 0)[None] if self.ibot else None

        def features(model):
            t = model(x, tokens=True, keep=torch.arange(n, device=device)[None], mask=half)
            return t.pooled.float().sum() + t.patches.float().sum()

        return freeze_unreached(self.model, features)

    def _targets(self, logits: torch.Tensor, temp: float, centre: torch.Tensor) -> torch.Tensor:
        dc = self.dc
        if dc.centering == "sinkhorn_knopp":
            return sinkhorn_knopp(logits, temp, group=self.dp_group)
        out = softmax_centered(logits, centre, temp)
        update_center(centre, logits, dc.center_momentum, self.dp_group)
        return out

    def loss(self, model, batch, step):
        dc = self.dc
        it = step // self.accum  # the optimizer update this micro-step belongs to (0-based)
        self.iteration = it
        temp = teacher_temp_at(it, dc.warmup_teacher_temp, dc.teacher_temp, self.temp_warmup)
        glob, loc = batch["global"], batch.get("local")  # cut by the loader (vitscale.data.views)
        images, B = glob, glob.shape[0] // 2
        p = self.model.cfg.patch_dim
        n = (glob.shape[-2] // p) * (glob.shape[-1] // p)  # the step's global crops (a mixture: its pair's size)
        every = torch.arange(n, device=images.device)[None].expand(2 * B, -1)
        teacher = self.teacher
        teacher.eval()
        if dc.head_use_bn:  # DINO v1 never sets its teacher to eval: its head normalises by the batch's statistics
            teacher["head"].train()
        masks = None
        if self.ibot:  # drawn on the host, with the masked rows' indices and weights (no read-back)
            cpu = batch.get("host", batch)["masks"]
        if self.ibot and cpu.any():  # no masked patch in this batch: no iBOT term, the centre unmoved
            idx = cpu.flatten().nonzero().flatten()
            weights = (1 / cpu.sum(-1).clamp(min=1).float())[:, None].expand_as(cpu)[cpu]
            masks, idx, weights = (t.to(images.device, non_blocking=True) for t in (cpu, idx, weights))
        with torch.no_grad(), self.autocast():
            t_tok = teacher["backbone"](glob, tokens=True, keep=every)  # vitscale.models.contract.Tokens
            t_cls = t_tok.pooled
            t_targets = self._targets(teacher["head"](t_cls), temp, self.centres.cls)
            if masks is not None:
                t_patch = t_tok.patches.flatten(0, 1).index_select(0, idx)
                t_head = teacher["ibot_head"] if "ibot_head" in teacher else teacher["head"]
                t_logits = t_head(t_patch)
                if dc.centering == "sinkhorn_knopp":
                    count = torch.tensor(float(idx.shape[0]), device=images.device)
                    t_patch_targets = sinkhorn_knopp(t_logits, temp, group=self.dp_group, count=count)
                else:
                    t_patch_targets = softmax_centered(t_logits, self.centres.patch, temp)
                    update_center(self.centres.patch, t_logits, dc.center_momentum, self.dp_group)
            release(teacher["backbone"])
        with self.autocast():
            s_tok = model(glob, tokens=True, keep=every, mask=masks)  # iBOT: the backbone's mask token in place
            s_cls = s_tok.pooled
            s_loc = None
            if loc is None:
                s_glob = self.student.head(s_cls)
            else:  # one head pass over every crop's class token (DINO's MultiCropWrapper, utils.py lines 610-629;
                # DINOv3 ssl_meta_arch.py lines 557-565): a batch-normalised head sees the batch DINO's does
                m = (loc.shape[-2] // p) * (loc.shape[-1] // p)
                s_loc_tok = model(loc, tokens=True, keep=torch.arange(m, device=images.device)[None].expand(loc.shape[0], -1))
                s_glob, s_loc = self.student.head(torch.cat([s_cls, s_loc_tok.pooled])).split([2 * B, loc.shape[0]])
            if masks is not None:
                s_patch = s_tok.patches.flatten(0, 1).index_select(0, idx)
                s_head = self.student.ibot_head if self.student.ibot_head is not None else self.student.head
                s_patch_logits = s_head(s_patch)
        t_list = [t_targets[:B], t_targets[B:]]
        w_local = warmup_cosine_at(it, dc.local_loss_weight_schedule, self.total) if dc.local_loss_weight_schedule else 1.0
        l_dino = dino_loss([s_glob[:B], s_glob[B:]], list(s_loc.chunk(dc.local_crops_number)) if s_loc is not None else [],
                           t_list, dc.student_temp, local_weight=w_local)  # fmt: skip
        total = dc.loss_weight * l_dino
        metrics = {"train_dino_loss": l_dino.detach()}
        if dc.local_loss_weight_schedule:  # DINOv3 logs it as dino_local_loss_weight (ssl_meta_arch.py line 623)
            metrics["train_dino_local_weight"] = torch.tensor(w_local, device=images.device)
        if dc.koleo_loss_weight > 0:
            l_koleo = sum(koleo_loss(c) for c in s_cls.chunk(2))
            total = total + dc.koleo_loss_weight * l_koleo
            metrics["train_koleo_loss"] = l_koleo.detach() / 2
        if masks is not None:
            l_ibot = ibot_loss(s_patch_logits, t_patch_targets, weights, 2 * B, dc.student_temp)
            total = total + dc.ibot_loss_weight * l_ibot
            metrics["train_ibot_loss"] = l_ibot.detach()
        w_gram = (warmup_cosine_at(it, dc.gram_loss_weight_schedule, self.total) if dc.gram_loss_weight_schedule
                  else dc.gram_loss_weight)  # fmt: skip
        if self.module.gram_active(it) and w_gram > 0:  # DINOv3's Gram anchoring of the global crops' patch features
            # (a scheduled weight of 0 skips the Gram teacher's pass: DINOv3 computes the loss and adds it times 0)
            g_net = teacher["backbone"] if dc.gram_ema_teacher else self.module.gram_teacher
            with torch.no_grad(), self.autocast():
                if dc.gram_ema_teacher:
                    g_patch = t_tok.patches
                else:  # its own crops (the views' "gram", cut from the global crops' boxes), else the global crops
                    g_in = batch.get("gram", glob)
                    g_grid = (g_in.shape[-2] // p, g_in.shape[-1] // p)
                    g_keep = torch.arange(g_grid[0] * g_grid[1], device=images.device)[None].expand(2 * B, -1)
                    g_patch = g_net(g_in, tokens=True, keep=g_keep).patches
                    release(g_net)
                    s_grid = (glob.shape[-2] // p, glob.shape[-1] // p)
                    if g_grid != s_grid:  # to the student's grid (ssl_meta_arch.py lines 493-510)
                        g_patch = resize_patches(g_patch, g_grid, s_grid, dc.gram_global_teacher_resize_method,
                                                 dc.gram_global_teacher_resize_antialias)  # fmt: skip
            with self.autocast():
                s_all = s_tok.patches  # (2B, N, D), the student's on its (masked) crops
            if dc.gram_tokens_used != "all":  # the patches the iBOT masks cover, or the others
                chosen = masks if masks is not None else torch.zeros(s_all.shape[:2], dtype=torch.bool, device=images.device)
                chosen = chosen if dc.gram_tokens_used == "masked" else ~chosen
                s_all, g_patch = s_all[chosen], g_patch[chosen]
            l_gram = gram_loss(s_all, g_patch, normalized=dc.gram_normalized, img_level=dc.gram_img_level,
                               remove_neg=dc.gram_remove_neg, remove_only_teacher_neg=dc.gram_remove_only_teacher_neg)  # fmt: skip
            total = total + w_gram * l_gram
            metrics["train_gram_loss"] = l_gram.detach()
        if dc.gram_loss_weight_schedule:  # DINOv3 logs it as gram_loss_weight (ssl_meta_arch.py line 664)
            metrics["train_gram_loss_weight"] = torch.tensor(float(w_gram), device=images.device)
        metrics["train_teacher_temp"] = torch.tensor(temp, device=images.device)
        self.rank.keep(t_cls[:B].float())
        self.watch.keep(t_targets)
        return total, metrics

    def log_metrics(self, step):
        m1, w1 = self.rank.read(step)
        m2, w2 = self.watch.read(step)
        return {**m1, **m2}, [*w1, *w2]



def check_schedules(dc: DinoConfig, total: int) -> None:
    """A loss-weight schedule that does not fit the run is refused in one line (DINOv3 asserts it,
    ``dinov3/train/cosine_lr_scheduler.py`` line 83)."""
    for key in ("local_loss_weight_schedule", "gram_loss_weight_schedule"):
        v = getattr(dc, key)
        if v and int(v[3]) + (int(v[4]) if len(v) > 4 else 0) > total:
            raise ConfigError(f"dino.{key}={_listed(v)} lasts {int(v[3]) + (int(v[4]) if len(v) > 4 else 0)} steps (warm-up "
                              f"and cosine), longer than the {total}-step run: shorten them")  # fmt: skip


def _listed(v) -> str:
    return "[" + ", ".join(f"{x:g}" for x in v) + "]"


def _shown_schedule(v) -> str:
    start, peak, end, warmup = v[0], v[1], v[2], int(v[3])
    cosine = f"over {int(v[4])} steps" if len(v) > 4 else "over the rest of the run"
    if start == peak == end:
        return f"{end:g} throughout"
    return f"{start:g} -> {peak:g} over {warmup} steps, then a cosine to {end:g} {cosine}"


register_task(DinoTask)

__all__ = ["DinoCentres", "DinoModule", "DinoStudent", "DinoTask"]
