"""Token labeling (Jiang et al. 2021, "All Tokens Matter"): class-token CE + beta x token-level soft CE
against a teacher's dense labels, with MixToken.

Per micro-batch:
1. the dense top-k maps of the batch's samples are read from the label folder
   (:class:`vitscale.data.token_labels.TokenLabelStore`), scattered to distributions, cut to the
   image's random crop and resampled to the student's token grid (RoIAlign), flipped with the image;
2. MixToken (keyed by (seed, step)): a CutMix box on the token grid — area ratio ~ Beta(a, a) —
   takes the tokens inside it from the reversed batch; the dense targets inside the box are swapped
   the same way and the class target is mixed by the box's area;
3. loss = cls_weight x CE(class logits, class target) + beta x mean over tokens of
   CE(token logits, dense target).

Students: any model whose ``forward(x, dense=True, mix=TokenMix)`` returns (class logits, token
logits (B, gh, gw, C)) — VOLO, whose ``aux_head`` classifies every token. A ViT has no aux head:
its own classifier is applied to every patch token (pre-logits features -> head), which is also how
a ViT teacher labels tokens; MixToken then swaps the pixels of whole patches, which is the same as
swapping patch tokens because ViT patches do not overlap.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from vitscale.data.token_labels import TokenLabelStore, align_dense_labels
from vitscale.eval.classification import evaluate_classification
from vitscale.models.volo.model import TokenMix, apply_token_mix

from .base import Task, register_task

STREAM_MIX_TOKEN = 11  # keyed-randomness stream tag (vitscale.data.keyed uses 1-7)


# ------------------------------------------------------------------------------ dense model outputs
def token_grid(model: nn.Module, img_hw: tuple[int, int]) -> tuple[int, int]:
    """The grid of the model's per-token logits for an image of ``img_hw``."""
    cfg = model.cfg
    stride = getattr(cfg, "token_stride", None) or cfg.patch_dim
    return img_hw[0] // stride, img_hw[1] // stride


def dense_forward(model: nn.Module, images: torch.Tensor, mix: TokenMix | None = None):
    """``(class logits (B, C), token logits (B, gh, gw, C))`` of a VOLO-like or ViT model.

    Always goes through ``model.__call__`` so FSDP's hooks gather the parameters.
    """
    if getattr(model, "supports_dense", False):
        return model(images, dense=True, mix=mix)
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(cfg, "pool") or not hasattr(cfg, "patch_dim"):
        raise TypeError(f"{type(model).__name__} gives no per-token logits (needs a VOLO- or ViT-like model)")
    p = cfg.patch_dim
    B, _, H, W = images.shape
    gh, gw = H // p, W // p
    if mix is not None:  # swap whole patches = swap patch tokens (ViT patches do not overlap)
        images = apply_token_mix(images.permute(0, 2, 3, 1), mix, p).permute(0, 3, 1, 2)
    model.cfg = replace(cfg, pool="none")  # the head over every token: (B, prefix + N, C)
    try:
        out = model(images)
    finally:
        model.cfg = cfg
    prefix = cfg.class_token_length
    tok = out[:, prefix:].reshape(B, gh, gw, -1)  # (B, gh, gw, C)
    cls = out[:, 0] if cfg.pool == "token" else model(images)
    return cls, tok


# ------------------------------------------------------------------------------ MixToken
def draw_mix_token(grid: tuple[int, int], batch: int, alpha: float, prob: float, seed: int, step: int):
    """A MixToken box on ``grid`` keyed by (seed, step): ``(TokenMix or None, lam)`` where ``lam`` is
    the fraction of tokens kept from each sample."""
    from vitscale.data.keyed import torch_gen

    g = torch_gen(seed, step, STREAM_MIX_TOKEN)
    if batch < 2 or torch.rand((), generator=g).item() >= prob:
        return None, 1.0
    lam = _beta(g, alpha)
    gh, gw = grid
    cut = (1.0 - lam) ** 0.5
    ch, cw = int(gh * cut), int(gw * cut)
    cy = int(torch.randint(gh, (), generator=g))
    cx = int(torch.randint(gw, (), generator=g))
    top, bottom = max(cy - ch // 2, 0), min(cy + (ch + 1) // 2, gh)
    left, right = max(cx - cw // 2, 0), min(cx + (cw + 1) // 2, gw)
    if bottom <= top or right <= left:
        return None, 1.0
    lam = 1.0 - (bottom - top) * (right - left) / (gh * gw)
    perm = torch.arange(batch - 1, -1, -1)  # the reversed batch, as the reference
    return TokenMix((top, left, bottom, right), perm), lam


def _beta(g: torch.Generator, alpha: float) -> float:
    """Beta(alpha, alpha) from two keyed Gamma(alpha) draws."""
    a = torch._standard_gamma(torch.full((2,), float(alpha)), generator=g)
    return float(a[0] / a.sum().clamp_min(1e-12))


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over all leading dims of -sum_c target * log_softmax(logits)."""
    return -(target * F.log_softmax(logits.float(), dim=-1)).sum(-1).mean()


# ------------------------------------------------------------------------------ the task
class TokenLabelingTask(Task):
    name = "token_labeling"

    def __init__(self, cfg, model: nn.Module, num_classes: int | None):
        super().__init__(cfg, model, num_classes)
        tl = cfg.token_label
        if not tl.path:
            raise ValueError("train.task=token_labeling needs token_label.path (a folder from `vitscale label-tokens`)")
        if tl.cls_target not in ("ground_truth", "teacher"):
            raise ValueError(f"token_label.cls_target must be ground_truth or teacher, got {tl.cls_target!r}")
        self.tl = tl
        self.store = TokenLabelStore(tl.path, tl.split)
        self.num_classes = num_classes or self.store.num_classes
        if self.store.num_classes != self.num_classes:
            raise ValueError(f"token labels have {self.store.num_classes} classes but the model {self.num_classes}")
        self.smoothing = cfg.train.label_smoothing
        self.seed = cfg.train.seed

    def targets(self, batch: dict, grid: tuple[int, int], device) -> tuple[torch.Tensor, torch.Tensor]:
        """Class targets ``(B, C)`` and aligned dense targets ``(B, gh, gw, C)`` (before MixToken)."""
        labels = batch["label"]
        index = batch.get("host", batch)["index"]  # rows are read on the host: never by a device copy
        B, C = labels.shape[0], self.num_classes
        dense = self.store.dense(index, C, device)  # (B, C, th, tw) over the whole image
        crop = batch.get("crop")
        if crop is None:
            crop = torch.zeros(B, 4, device=device)
            crop[:, 2:] = 1.0  # the whole image (top, left, h, w): filled on the device, nothing copied there
        flip = batch.get("flip")
        if flip is None:
            flip = torch.zeros(B, dtype=torch.bool, device=device)
        view = self.store.view_boxes(index, device)
        tok = align_dense_labels(dense, crop, flip, grid, self.tl.sampling_ratio, view)
        if self.tl.cls_target == "teacher":
            cls = self.store.cls_targets(index, C, device)
        else:
            off = self.smoothing / C
            cls = torch.full((B, C), off, device=device).scatter_(1, labels.view(B, 1), 1.0 - self.smoothing + off)
        return cls, tok

    def loss(self, model, batch, step):
        images, labels = batch["image"], batch["label"]
        device = images.device
        grid = token_grid(model, tuple(images.shape[-2:]))
        cls_t, tok_t = self.targets(batch, grid, device)
        mix, lam = None, 1.0
        if self.tl.mix_token:
            mix, lam = draw_mix_token(grid, images.shape[0], self.tl.mix_token_alpha, self.tl.mix_token_prob, self.seed, step)
        if mix is not None:
            mix = TokenMix(mix.box, mix.perm.to(device, non_blocking=True))
            tok_t = apply_token_mix(tok_t, mix)
            cls_t = lam * cls_t + (1.0 - lam) * cls_t[mix.perm]
        with self.autocast():
            cls_logits, tok_logits = dense_forward(model, images, mix)
        cls_loss = soft_cross_entropy(cls_logits, cls_t)
        tok_loss = soft_cross_entropy(tok_logits, tok_t)
        loss = self.tl.cls_weight * cls_loss + self.tl.beta * tok_loss
        metrics = {"train_cls_loss": cls_loss.detach(), "train_token_loss": tok_loss.detach()}
        if mix is None:
            metrics["train_top1"] = (cls_logits.detach().argmax(-1) == labels).float().mean() * 100
        return loss, metrics

    def evaluate(self, model, loader):
        return evaluate_classification(model, loader, self.device, autocast=self.autocast)


register_task("token_labeling", TokenLabelingTask)
