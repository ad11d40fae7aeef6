"""Contrastive image-text training (CLIP InfoNCE / SigLIP) and its evaluation (zero-shot, retrieval).

Captions come from the batch (``batch["text"]``: token ids from caption datasets — webdataset, csv)
or, for datasets that only have class labels (digits, image folders), from ``clip.caption_templates``
filled with the class name; the template of a sample is keyed by (seed, micro-step, sample index).
The loss is ``train.loss``: ``softmax`` (InfoNCE, with ``clip.local_loss`` / ``clip.gather_with_grad``)
or ``sigmoid`` (SigLIP), computed over the whole data-parallel batch (features exchanged between
data-parallel ranks; tensor-parallel ranks of one replica hold the same features).
"""

from __future__ import annotations

import torch
from torch import nn

from vitscale.eval.retrieval import retrieval_recall
from vitscale.eval.zeroshot import (
    collect_embeddings,
    readable_class_names,
    zeroshot_accuracy,
    zeroshot_classifier,
)
from vitscale.models.registry import family_of
from vitscale.tasks.contrastive_loss import build_contrastive_loss

from .base import Task, register_task


def dataset_class_names(cfg) -> list[str] | None:
    """Readable class names of the run's dataset (``clip.class_names`` first)."""
    if cfg.clip.class_names:
        return list(cfg.clip.class_names)
    fmt = cfg.data.format
    if fmt == "digits":
        from vitscale.data.digits import CLASS_NAMES

        return readable_class_names(CLASS_NAMES)
    if fmt == "imagefolder" and cfg.data.train_path:
        from vitscale.data.imagefolder import find_classes

        return readable_class_names(find_classes(cfg.data.train_path))
    if fmt == "synthetic":
        return [str(i) for i in range(cfg.data.num_classes or 1000)]
    if fmt in ("webdataset", "csv") and cfg.data.train_path:
        from vitscale.data.captions import class_names_for

        names = class_names_for(cfg.data)
        return readable_class_names(names) if names else None
    return None


class ContrastiveTask(Task):
    name = "contrastive"

    def __init__(self, cfg, model: nn.Module, num_classes: int | None, dp_group=None):
        super().__init__(cfg, model, num_classes, dp_group)
        cc = cfg.clip
        self.seed = cfg.train.seed
        self.tokenizer = family_of(model).create_tokenizer(cc.context_length)  # the model family's
        self.loss_fn = build_contrastive_loss(
            cfg.train.loss,
            local_loss=cc.local_loss,
            gather_with_grad=cc.gather_with_grad,
            group=dp_group,  # the data-parallel ranks: the loss spans their whole batch
        )
        self.class_names = dataset_class_names(cfg)
        self.templates = list(cc.caption_templates)
        self._caption_tokens = None  # (K, T, L) tokens of every (class, template), built on first use

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
        with torch.no_grad():
            sim = img.float() @ txt.float().t()
            acc = (sim.argmax(-1) == torch.arange(sim.shape[0], device=sim.device)).float().mean()
        return loss, {"logit_scale": out["logit_scale"].detach().float(), "train_i2t_top1": acc * 100}

    # ------------------------------------------------------------------ eval
    @torch.no_grad()
    def evaluate(self, model, loader):
        emb = collect_embeddings(
            model, loader, self.device, self.autocast, text_transform=self.fit_context, group=self.dp_group
        )
        if not emb:
            return {}
        res: dict[str, float] = {}
        labels = emb["label"]
        if self.cfg.clip.zeroshot and self.class_names and bool((labels >= 0).all()):
            was_training = model.training
            model.eval()
            clf = zeroshot_classifier(
                model,
                self.tokenizer,
                self.class_names,
                self.cfg.clip.zeroshot_templates,
                self.device,
                self.autocast,
            )
            model.train(was_training)
            res.update(zeroshot_accuracy(emb["image"], labels, clf))
        if self.cfg.clip.retrieval and "text" in emb:
            res.update(retrieval_recall(emb["image"], emb["text"]))
        return res


register_task("contrastive", ContrastiveTask)
