"""Self-distillation with no labels, DINOv2's way (``train.task=dino``): Oquab et al. 2023, "DINOv2:
Learning Robust Visual Features without Supervision", arXiv 2304.07193; reference code
facebookresearch/dinov2 at b8931f7 (``dinov2/train/ssl_meta_arch.py``, ``dinov2/loss/``,
``dinov2/layers/dino_head.py``, ``dinov2/data/``; lines cited in each part). Labels are ignored.

- **Views** (:mod:`vitscale.tasks.dino_crops`, cut by the loader's workers: :mod:`vitscale.data.views`):
  2 global and ``dino.local_crops_number`` local crops of each image with DINOv2's colour jitter, blur
  and solarisation, and iBOT's masks, keyed by (``train.seed``, epoch, the sample's dataset index,
  repeat, view): the same on resume and on any number of ranks.
- **Student and teacher**: the student is the run's model (its backbone) with a DINO head
  (:mod:`vitscale.tasks.dino_head`), and with iBOT an learnt mask token (zeros, DINOv2's
  ``vision_transformer.py`` line 169) put in place of the masked patches' embeddings (line 218) by a
  hook on the patch embedding; the teacher is a copy of both, updated after every optimizer step as
  ``t = m t + (1 - m) s`` (``ssl_meta_arch.py`` lines 356-365) with ``m`` on a cosine from
  ``dino.momentum_teacher`` to ``dino.final_momentum_teacher`` (:func:`~vitscale.tasks.dino_loss.momentum_at`).
  The update of step ``i`` is applied at the start of step ``i + 1`` (before the teacher's forward):
  the same teacher for every step, and a resumed run makes it from the checkpointed student. Both,
  and the running centres, are training-only parts of the model (``model.task_parts.dino_*``,
  :mod:`vitscale.tasks.parts`): trained or carried, checkpointed and resumed with it, left out of
  ``model.safetensors``.
- **The class token** (DINOv2's ``x_norm_clstoken``) is the backbone's own pooled, normalised features
  (its ``pre_logits``, what the k-NN and probes evaluate): the class token for ``pool=token``,
  ``fc_norm`` of the mean patch token for ``avg``, the attention pool's output for ``map``; the patch
  tokens (``x_norm_patchtokens``) are normalised as the backbone normalises (``norm``, or ``fc_norm``
  where it normalises after pooling).
- **Losses** (:mod:`vitscale.tasks.dino_loss`): the DINO class-token cross-entropy between the
  student's crops and the teacher's targets of the other global crops (targets by a running softmax
  centre or Sinkhorn-Knopp, ``dino.centering``, at the teacher temperature of this step), KoLeo on the
  student's class tokens of each global crop, and iBOT's cross-entropy on the masked patches of the
  global crops (``ssl_meta_arch.py`` lines 132-346).
- **The prototypes** have learning rate 0 for the first ``dino.freeze_last_layer_epochs``, as DINOv2's
  ``last_layer_lr_schedule`` (``dinov2/train/train.py`` lines 98-100): their own optimizer groups
  (:data:`vitscale.train.optim.OWN_GROUP`), set by :meth:`DinoTask.schedule_optimizer`; their gradient
  still counts in the clipping norm and AdamW's moments, as there, and no weight decay moves them.
- **Weight decay**: constant ``optim.weight_decay``, or DINOv2's cosine to ``dino.weight_decay_end``
  (:meth:`DinoTask.schedule_optimizer`).
- **Layout** (:mod:`vitscale.tasks.dino_layout`): one process, or FSDP2 data parallelism and tensor
  parallelism under torchrun, with the teacher sharded as the student (the heads' MLPs column / row
  parallel, the prototypes split over the TP ranks, their logits gathered before the targets).
- **Health** at log steps: ``train_rankme`` of the teacher's class tokens and the teacher targets'
  entropy and KL divergence from uniform (:mod:`vitscale.tasks.health`).
- **Not yet**: ``vitscale bench --task dino``.
"""

from __future__ import annotations

import copy
import inspect

import torch
from torch import nn

from vitscale.checkpoint.weights import TASK_PARTS
from vitscale.data import keyed
from vitscale.errors import ConfigError
from vitscale.train.ema import _local
from vitscale.train.optim import OWN_GROUP

from .base import Task, register_task
from .dino_config import DinoConfig, DinoPretrainingConfig
from .dino_crops import STREAM_DINO_INIT, dino_views
from .dino_head import DinoHead
from .dino_layout import check_layout, keep_root_gathered, release, shard_units, split_heads, teacher_backbone
from .dino_loss import (
    dino_loss,
    ibot_loss,
    koleo_loss,
    momentum_at,
    sinkhorn_knopp,
    softmax_centered,
    teacher_temp_at,
    update_center,
)
from .health import RankWatch, TeacherWatch, frozen_backbone_evals
from .parts import attach_part


class DinoStudent(nn.Module):
    """The student's training-only parts: its DINO head, an iBOT head of its own (``ibot_separate_head``)
    and the mask token."""

    def __init__(self, width: int, dc: DinoConfig, ibot: bool):
        super().__init__()
        sizes = dict(nlayers=dc.head_nlayers, hidden_dim=dc.head_hidden_dim, bottleneck_dim=dc.head_bottleneck_dim)
        self.head = DinoHead(width, dc.head_n_prototypes, **sizes)
        self.ibot_head = DinoHead(width, dc.head_n_prototypes, **sizes) if ibot and dc.ibot_separate_head else None
        self.mask_token = nn.Parameter(torch.zeros(width))

    def forward(self, embeddings: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The mask token in place of the masked patches' embeddings (a forward of its own, so that FSDP2
        gathers the token and reduces its gradient)."""
        return torch.where(mask[..., None], self.mask_token.to(embeddings.dtype), embeddings)


class DinoCentres(nn.Module):
    """The running centres of the teacher's class-token and patch logits (``centering: softmax``)."""

    def __init__(self, k: int):
        super().__init__()
        self.register_buffer("cls", torch.zeros(1, k))
        self.register_buffer("patch", torch.zeros(1, k))


class DinoTask(Task):
    name = "dino"
    config = DinoPretrainingConfig

    def __init__(self, cfg, model, num_classes, dp_group=None, class_names=None):
        super().__init__(cfg, model, num_classes, dp_group, class_names)
        self.model, self.dc, self.seed = model, cfg.dino, cfg.train.seed
        self.accum = cfg.train.grad_accum
        self.mean, self.std = list(cfg.data.mean), list(cfg.data.std)
        self.ibot = cfg.dino.ibot_loss_weight > 0
        self.rank = RankWatch(dp_group, "the teacher's class tokens of the first global crops")
        self.watch = TeacherWatch(dp_group)
        self._mask: torch.Tensor | None = None  # (n, N) bool while the student sees masked global crops
        self.iteration = 0

    # ------------------------------------------------------------------------------------- setup
    @classmethod
    def views(cls, cfg):
        from vitscale.models.registry import resolve_model

        return dino_views(cfg.dino, resolve_model(cfg.model.name, **cfg.model.overrides).cfg.patch_dim)

    @classmethod
    def check(cls, cfg, model, dims, purpose):
        super().check(cfg, model, dims, purpose)
        if purpose == "train":
            check_layout(cfg.dino, dims)

    def setup(self, run):
        model, dc = self.model, self.dc
        name = run.cfg.model.name
        if "keep" not in inspect.signature(model.forward).parameters or not hasattr(model, "patch_embed"):
            raise ConfigError(f"train.task=dino: model {name} does not give its tokens (forward(images, keep=...)): "
                              "use a ViT (`vitscale models`)")  # fmt: skip
        keep_root_gathered(run, model)
        p = model.cfg.patch_dim
        for key in ("global_crops_size", "local_crops_size"):
            size = getattr(dc, key)
            if key == "local_crops_size" and dc.local_crops_number == 0:
                continue
            if size < p or size % p:
                raise ConfigError(f"dino.{key}={size} must be a multiple of the patch ({p} pixels of {name}), at least "
                                  f"one patch: e.g. dino.{key}={max(p, size // p * p)}")  # fmt: skip
        if dc.koleo_loss_weight > 0 and run.micro_batch < 2:
            raise ConfigError(f"dino.koleo_loss_weight={dc.koleo_loss_weight} with {run.micro_batch} image per rank and "
                              "micro-step: KoLeo needs a nearest neighbour (one image gives NaN); raise train.batch_size "
                              "or set dino.koleo_loss_weight=0")  # fmt: skip
        if dc.weight_decay_end is not None and run.cfg.optim.weight_decay <= 0:
            raise ConfigError(f"dino.weight_decay_end={dc.weight_decay_end} needs a start: set optim.weight_decay > 0 "
                              "(DINOv2: 0.04 -> 0.4)")  # fmt: skip
        self.wd0 = run.cfg.optim.weight_decay
        per_epoch, self.total = run.steps_per_epoch, run.total_steps  # the run's length as the run layer resolved it
        self.rank.for_run(self.total)
        self.watch.for_run(self.total)
        self.temp_warmup = round(dc.warmup_teacher_temp_epochs * per_epoch)
        self.freeze_steps = round(dc.freeze_last_layer_epochs * per_epoch)
        if model.cfg.pool == "none":
            raise ConfigError("train.task=dino with model.pool=none: DINO's head reads one feature vector per image; "
                              "use pool token, avg or map")  # fmt: skip
        self.prefix = model.num_prefix_tokens
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
        # under torchrun: each head split over the TP ranks (parallel.tp), then each head and the mask
        # token an FSDP2 unit, sharded as its teacher copy
        t_ibot = teacher["ibot_head"] if "ibot_head" in teacher else None
        split_heads(run, [student.head, student.ibot_head, teacher["head"], t_ibot])
        shard_units(run, [student.head, student.ibot_head, student, teacher["head"], t_ibot])
        for head in (student.head, student.ibot_head):  # own optimizer groups: lr 0 while frozen
            for q in head.last_layer_parameters() if head is not None else ():
                setattr(q, OWN_GROUP, "prototypes")
        self.student = attach_part(model, "dino_student", student)
        self.teacher = attach_part(model, "dino_teacher", teacher)
        self.centres = attach_part(model, "dino_centre", DinoCentres(dc.head_n_prototypes).to(device))
        # the pairs the EMA moves: the backbone's own parameters, then the heads'
        own = [(n, q) for n, q in model.named_parameters() if not n.startswith("task_parts.")]
        tb = dict(self.teacher["backbone"].named_parameters())
        self.ema_pairs = [(tb[n], q) for n, q in own]
        for key in ("head", "ibot_head"):
            if key in self.teacher:
                self.ema_pairs += list(zip(self.teacher[key].parameters(), getattr(student, key).parameters(), strict=True))
        if self.ibot:
            model.patch_embed.register_forward_hook(self._mask_hook)
        n_params = sum(q.numel() for q in student.parameters())
        frozen = ([f"dino: {len(unreached)} tensors the objective does not reach are frozen: {', '.join(unreached[:3])}"
                   f"{', ...' if len(unreached) > 3 else ''}"] if unreached else [])  # fmt: skip
        return [*frozen, f"dino: 2 global crops of {dc.global_crops_size} px, {dc.local_crops_number} local of "
                f"{dc.local_crops_size} px; head {dc.head_nlayers} layers -> {dc.head_bottleneck_dim} -> "
                f"{dc.head_n_prototypes} prototypes ({n_params / 1e6:.2f}M params with the mask token, not exported); "
                f"centring {dc.centering}; teacher temperature {dc.warmup_teacher_temp} -> {dc.teacher_temp} over "
                f"{self.temp_warmup} steps, momentum {dc.momentum_teacher} -> {dc.final_momentum_teacher} over {self.total}; "
                f"prototypes frozen for {self.freeze_steps} steps; iBOT {'on' if self.ibot else 'off'}, KoLeo "
                f"{dc.koleo_loss_weight}",
                "dino: the k-NN and probe evaluations read the student's backbone"]  # fmt: skip

    @torch.no_grad()
    def weights_loaded(self) -> None:
        """``checkpoint.init_from`` (timm's DINOv2 weights, a vitscale run): the teacher's backbone
        starts from the same weights as the student's, as DINOv2's teacher starts as a copy of the
        student (``ssl_meta_arch.py`` line 396, ``prepare_for_distributed_training``); the heads stay as drawn."""
        own = {k: v for k, v in self.model.state_dict().items() if not k.startswith(TASK_PARTS + ".")}
        self.teacher["backbone"].load_state_dict(own, strict=True)

    def _freeze_unreached(self, device) -> list[str]:
        """Freeze the backbone's parameters DINO's features do not reach (the classifier), found by one
        backward pass of a blank image in eval mode."""
        model, mcfg = self.model, self.model.cfg
        was = model.training
        model.eval()
        try:
            with torch.enable_grad():
                x = torch.zeros(1, mcfg.num_channels, mcfg.img_h, mcfg.img_w, device=device)
                tokens = model(x, keep=torch.arange(mcfg.num_patches, device=device)[None])
                (self._cls(tokens, model).float().sum() + self._patches(tokens, model).float().sum()).backward()
            unreached = [n for n, q in model.named_parameters() if q.requires_grad and q.grad is None]
        finally:
            model.zero_grad(set_to_none=True)
            model.train(was)
        params = dict(model.named_parameters())
        for n in unreached:
            params[n].requires_grad_(False)
        return unreached

    def schedule_optimizer(self, optimizer, step):
        """DINOv2's schedules at iteration ``step - 1`` (``apply_optim_scheduler``): the prototypes' groups
        at learning rate 0 while frozen (``last_layer_lr``); with ``dino.weight_decay_end``, each group's
        decay scaled by the cosine from ``optim.weight_decay`` to it (``wd x wd_multiplier``)."""
        end = self.dc.weight_decay_end
        f = None if end is None else momentum_at(step - 1, self.wd0, end, self.total) / self.wd0
        for g in optimizer.param_groups:
            if step - 1 < self.freeze_steps and ".prototypes" in g.get("name", ""):
                g["lr"] = 0.0
            if f is not None:
                g["weight_decay"] = g.setdefault("initial_weight_decay", g["weight_decay"]) * f

    def _mask_hook(self, module, args, out):
        """iBOT: the mask token in place of the masked patches' embeddings (DINOv2's
        ``prepare_tokens_with_masks``, ``vision_transformer.py`` line 218), for the student's global crops."""
        if self._mask is None or out.shape[0] != self._mask.shape[0]:
            return out
        return self.student(out, self._mask)

    @torch.no_grad()
    def update_teacher(self, m: float) -> None:
        """``teacher = m teacher + (1 - m) student``, parameter by parameter (local tensors, no
        communication: ``ssl_meta_arch.py`` lines 356-365)."""
        t = [_local(a) for a, _ in self.ema_pairs]  # sharded alike (vitscale.tasks.dino_layout)
        s = [_local(b.detach()) for _, b in self.ema_pairs]
        torch._foreach_mul_(t, m)
        torch._foreach_add_(t, s, alpha=1 - m)

    # ------------------------------------------------------------------------------------- loss
    def _cls(self, tokens: torch.Tensor, net: nn.Module) -> torch.Tensor:
        """The pooled, normalised features of backbone ``net`` (its ``pre_logits``: the class token for
        ``pool=token``; for ``avg``, ``fc_norm`` of the mean patch token; the MAP pool's output)."""
        return net.forward_head(tokens, pre_logits=True)

    def _patches(self, tokens: torch.Tensor, net: nn.Module) -> torch.Tensor:
        """The normalised patch tokens of ``net`` (``fc_norm`` where it normalises after pooling)."""
        return net.fc_norm(tokens[:, self.prefix :])

    def _targets(self, logits: torch.Tensor, temp: float, centre: torch.Tensor) -> torch.Tensor:
        dc = self.dc
        if dc.centering == "sinkhorn_knopp":
            return sinkhorn_knopp(logits, temp, group=self.dp_group)
        out = softmax_centered(logits, centre, temp)
        update_center(centre, logits, dc.center_momentum, self.dp_group)
        return out

    def loss(self, model, batch, step):
        dc = self.dc
        it = step // self.accum
        if step % self.accum == 0 and it > 0:  # the update after optimizer step it - 1
            self.update_teacher(momentum_at(it - 1, dc.momentum_teacher, dc.final_momentum_teacher, self.total))
        self.iteration = it
        temp = teacher_temp_at(it, dc.warmup_teacher_temp, dc.teacher_temp, self.temp_warmup)
        glob, loc = batch["global"], batch.get("local")  # cut by the loader (vitscale.data.views)
        images, B = glob, glob.shape[0] // 2
        p = self.model.cfg.patch_dim
        grid = (dc.global_crops_size // p, dc.global_crops_size // p)
        n = grid[0] * grid[1]
        every = torch.arange(n, device=images.device)[None].expand(2 * B, -1)
        teacher = self.teacher
        teacher.eval()
        masks = None
        if self.ibot:  # drawn on the host, with the masked rows' indices and weights (no read-back)
            cpu = batch.get("host", batch)["masks"]
        if self.ibot and cpu.any():  # no masked patch in this batch: no iBOT term, the centre unmoved
            idx = cpu.flatten().nonzero().flatten()
            weights = (1 / cpu.sum(-1).clamp(min=1).float())[:, None].expand_as(cpu)[cpu]
            masks, idx, weights = (t.to(images.device, non_blocking=True) for t in (cpu, idx, weights))
        with torch.no_grad(), self.autocast():
            t_tok = teacher["backbone"](glob, keep=every)
            t_cls = self._cls(t_tok, teacher["backbone"])
            t_targets = self._targets(teacher["head"](t_cls), temp, self.centres.cls)
            if masks is not None:
                t_patch = self._patches(t_tok, teacher["backbone"]).flatten(0, 1).index_select(0, idx)
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
            self._mask = masks
            try:
                s_tok = model(glob, keep=every)
            finally:
                self._mask = None
            s_cls = self._cls(s_tok, model)
            s_glob = self.student.head(s_cls)
            s_loc = None
            if loc is not None:
                m = (dc.local_crops_size // p) ** 2
                s_loc_tok = model(loc, keep=torch.arange(m, device=images.device)[None].expand(loc.shape[0], -1))
                s_loc = self.student.head(self._cls(s_loc_tok, model))
            if masks is not None:
                s_patch = self._patches(s_tok, model).flatten(0, 1).index_select(0, idx)
                s_head = self.student.ibot_head if self.student.ibot_head is not None else self.student.head
                s_patch_logits = s_head(s_patch)
        t_list = [t_targets[:B], t_targets[B:]]
        l_dino = dino_loss([s_glob[:B], s_glob[B:]], list(s_loc.chunk(dc.local_crops_number)) if s_loc is not None else [],
                           t_list, dc.student_temp)  # fmt: skip
        total = dc.loss_weight * l_dino
        metrics = {"train_dino_loss": l_dino.detach()}
        if dc.koleo_loss_weight > 0:
            l_koleo = sum(koleo_loss(c) for c in s_cls.chunk(2))
            total = total + dc.koleo_loss_weight * l_koleo
            metrics["train_koleo_loss"] = l_koleo.detach() / 2
        if masks is not None:
            l_ibot = ibot_loss(s_patch_logits, t_patch_targets, weights, 2 * B, dc.student_temp)
            total = total + dc.ibot_loss_weight * l_ibot
            metrics["train_ibot_loss"] = l_ibot.detach()
        metrics["train_teacher_temp"] = torch.tensor(temp, device=images.device)
        self.rank.keep(t_cls[:B].float())
        self.watch.keep(t_targets)
        return total, metrics

    def log_metrics(self, step):
        m1, w1 = self.rank.read(step)
        m2, w2 = self.watch.read(step)
        return {**m1, **m2}, [*w1, *w2]

    @staticmethod
    def bench_loss(out, labels):
        raise ConfigError("--task dino: the bench times a loss of the model's output on whole images, not DINO's "
                          "crops, teacher and heads; time a DINO step with `vitscale train`")  # fmt: skip

    @classmethod
    def default_evals(cls, cfg):
        return frozen_backbone_evals(cfg)


register_task(DinoTask)

__all__ = ["DinoCentres", "DinoStudent", "DinoTask"]
