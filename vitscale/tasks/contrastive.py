"""Contrastive image-text training (CLIP InfoNCE / SigLIP), its config group (``clip``) and its
default evaluations (zero-shot and retrieval).

Captions come from the batch (``batch["text"]``: token ids from caption datasets — webdataset, csv)
or, for datasets that only have class labels (digits, image folders), from ``clip.caption_templates``
filled with the class name (``clip.class_names``, else the run's data's, digits '0'..'9' as words);
the template of a sample is keyed by (seed, micro-step, sample index).
The loss is ``train.loss``: ``softmax`` (InfoNCE, with ``clip.local_loss`` / ``clip.gather_with_grad``)
or ``sigmoid`` (SigLIP), computed over the whole data-parallel batch (features exchanged between
data-parallel ranks; tensor-parallel ranks of one replica hold the same features).

Fine-tuning: ``clip.lock_image`` / ``clip.lock_text`` freeze a tower as open_clip's ``--lock-image``
/ ``--lock-text`` do (the model's ``lock_image_tower`` / ``lock_text_tower``), before the optimizer is
built; ``distill.teacher`` adds open_clip's ``--distill-model`` loss (:mod:`vitscale.tasks.distill`).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from vitscale.eval.zeroshot import check_class_names, readable_class_names
from vitscale.models.registry import family_of
from vitscale.tasks.contrastive_loss import build_contrastive_loss

from .base import Task, register_task
from .contrastive_config import ContrastiveConfig
from .module import TrainModule


class ContrastiveTask(Task):
    name = "contrastive"
    config = ContrastiveConfig

    def __init__(self, cfg, model: nn.Module, num_classes: int | None, dp_group=None, class_names=None):
        super().__init__(cfg, model, num_classes, dp_group, class_names)
        cc = cfg.clip
        self.seed = cfg.train.seed
        self.tokenizer = family_of(model).create_tokenizer(cc.context_length)  # the model family's
        self.loss_fn = build_contrastive_loss(
            cfg.train.loss,
            local_loss=cc.local_loss,
            gather_with_grad=cc.gather_with_grad,
            group=dp_group,  # the data-parallel ranks: the loss spans their whole batch
        )
        if cc.class_names:  # against the data they describe, before use (a wrong count: IndexError at step 1)
            check_class_names("clip.class_names", cc.class_names, self.class_names, num_classes)
        self.class_names = list(cc.class_names) if cc.class_names else readable_class_names(self.class_names)
        self.templates = list(cc.caption_templates)
        self._caption_tokens = None  # (K, T, L) tokens of every (class, template), built on first use
        self.model, self.distill = model, None

    # SigLIP's start (Zhai et al. 2023, arXiv 2303.15343, section 3.1: t' = log 10, b = -10; big_vision
    # ``models/proj/image_text/two_towers.py``; open_clip's ``init_logit_scale`` / ``init_logit_bias``
    # with ``--siglip``)
    SIGLIP_INIT = {"logit_scale_init": math.log(10.0), "logit_bias_init": -10.0}

    @classmethod
    def model_defaults(cls, cfg, model_cfg):
        """``train.loss=sigmoid``: SigLIP's initial temperature and bias (on a model config that has
        them), unless ``model.logit_scale_init`` / ``model.logit_bias_init`` are set."""
        if cfg.train.loss != "sigmoid":
            return {}
        have = {f.name for f in dataclasses.fields(model_cfg)} if dataclasses.is_dataclass(model_cfg) else set()
        return {k: v for k, v in cls.SIGLIP_INIT.items() if k in have}

    def build(self, run):
        """The model with open_clip's tower locks (``clip.lock_image`` / ``clip.lock_text``), then the distillation
        teacher (``distill.teacher``, a CLIP)."""
        cc, lines = self.cfg.clip, []
        siglip = {k: v for k, v in self.model_defaults(self.cfg, run.model_cfg).items() if k not in self.cfg.model.overrides}
        if siglip:
            lines.append(f"train.loss=sigmoid: SigLIP's initialisation (arXiv 2303.15343): temperature exp({siglip.get('logit_scale_init', 0):.4g}) = 10, "
                         f"bias {siglip.get('logit_bias_init')}; set model.logit_scale_init / model.logit_bias_init to change it")  # fmt: skip
        for on, lock, unlocked, key in ((cc.lock_image, self.model.lock_image_tower, cc.lock_image_unlocked_groups, "lock_image"),
                                        (cc.lock_text, self.model.lock_text_tower, cc.lock_text_unlocked_layers, "lock_text")):  # fmt: skip
            if on:
                before = sum(p.numel() for p in self.model.parameters() if not p.requires_grad)
                frozen = lock(unlocked)
                n = sum(p.numel() for p in self.model.parameters() if not p.requires_grad) - before
                lines.append(f"clip.{key}: {n / 1e6:.2f}M parameters frozen ({len(frozen)} tensors now frozen in all), "
                             f"the last {unlocked} layer groups of the tower trainable")  # fmt: skip
        if self.cfg.distill.teacher:
            from .distill import build

            self.distill = build(run, self.cfg.distill, self.autocast, classes=False)
            lines += self.distill.lines
        return TrainModule(self.model, notices=lines)

    def step_times(self):
        return self.distill.step_times() if self.distill is not None else {}

    # ------------------------------------------------------------------ captions
    def caption_tokens(self, labels: torch.Tensor, index: torch.Tensor, step: int) -> torch.Tensor:
        """Tokens of templated captions for labelled images: template keyed by (seed, step, index)."""
        if self._caption_tokens is None:
            if not self.class_names:
                raise ValueError(
                    "batches have no captions and the dataset has no class names (set clip.class_names)"
                )
            texts = [t.format(n) for n in self.class_names for t in self.templates]
            K, T = len(self.class_names), len(self.templates)
            self._caption_tokens = self.tokenizer(texts).view(K, T, -1).to(self.device)  # (K, T, L)
        T = self._caption_tokens.shape[1]
        key = (index.long() * 0x9E3779B1 + step * 0x85EBCA77 + self.seed * 0xC2B2AE3D) % 2_147_483_647
        which = (key ^ (key >> 13)) % T  # (B,)
        return self._caption_tokens[labels.to(self.device), which.to(self.device)]  # (B, L)

    def fit_context(self, tokens: torch.Tensor) -> torch.Tensor:
        """Cut token rows longer than ``clip.context_length`` as open_clip does: the last kept token
        becomes the end-of-text token when the text was longer."""
        L = self.cfg.clip.context_length
        if tokens.shape[1] <= L:
            return tokens
        eot = self.tokenizer.eot_token_id
        cut = tokens[:, :L].clone()
        too_long = tokens.argmax(dim=-1) >= L  # the end-of-text token (highest id) was cut off
        cut[:, L - 1] = torch.where(too_long, eot, cut[:, L - 1])  # no boolean-mask indexing: no host sync
        return cut

    # ------------------------------------------------------------------ loss
    def loss(self, model, batch, step):
        images = batch["image"]
        tokens = batch.get("text")
        if tokens is None:
            tokens = self.caption_tokens(batch["label"], batch["index"], step)
        tokens = self.fit_context(tokens)
        with self.autocast():
            out = model(images, tokens, output_dict=True)
        img, txt = out["image_features"], out["text_features"]
        loss = self.loss_fn(img, txt, out["logit_scale"], out.get("logit_bias"))
        extra = {}
        if self.distill is not None:  # open_clip's --distill-model: contrastive + weight x distillation
            d = self.distill.clip_loss(out, images, tokens, self.dp_group)
            loss = loss + self.cfg.distill.clip_weight * d
            extra["train_distill_loss"] = d.detach()
        with torch.no_grad():
            sim = img.float() @ txt.float().t()
            acc = (sim.argmax(-1) == torch.arange(sim.shape[0], device=sim.device)).float().mean()
        return loss, {"logit_scale": out["logit_scale"].detach().float(), "train_i2t_top1": acc * 100, **extra}

    # ------------------------------------------------------------------ evaluations, bench
    @classmethod
    def default_evals(cls, cfg):
        cc, every = cfg.clip, cfg.eval.every
        out = []
        if cc.zeroshot:
            named = cfg.eval.classnames  # a shipped set (names and templates) in place of clip.*'s
            out.append({"kind": "zeroshot", "name": "zeroshot", "every": every, "templates": list(cc.zeroshot_templates),
                        "class_names": list(cc.class_names) if cc.class_names and not named else None,
                        "classnames": named})  # fmt: skip
        if cc.retrieval:
            out.append({"kind": "retrieval", "name": "", "every": every})
        return out

    @staticmethod
    def bench_loss(out, labels):
        """Symmetric InfoNCE on (image_features, text_features, logit_scale), ours or open_clip's."""
        if isinstance(out, dict):
            img, txt, scale = out["image_features"], out["text_features"], out.get("logit_scale")
        else:
            img, txt = out[0], out[1]
            scale = out[2] if len(out) > 2 else None
        logits = F.normalize(img.float(), dim=-1) @ F.normalize(txt.float(), dim=-1).t()  # (B, B)
        if torch.is_tensor(scale):
            logits = logits * scale.float()
        target = torch.arange(logits.shape[0], device=logits.device)
        return (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2


register_task(ContrastiveTask)
