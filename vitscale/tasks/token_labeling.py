"""Token labeling (Jiang et al. 2021, "All Tokens Matter"): class-token CE + beta x token-level soft CE
against a teacher's dense labels, with MixToken.

Per micro-batch:
1. the top-k teacher logit maps of the batch's samples are read from the label folder (one
   ``vitscale label-tokens`` wrote, :class:`vitscale.data.token_labels.TokenLabelStore`, or
   TokenLabeling's per-image files, :class:`vitscale.data.token_label_files.LabelFileFolder`) and
   turned into targets as the reference code does (:mod:`vitscale.data.token_label_targets`): dense
   targets on the student's token grid and the crop's class target (``token_label.cls_target``),
   optionally mixed with the label (``token_label.ground_truth_mix``);
2. MixToken (keyed by (seed, step)): a CutMix box on the token grid — area ratio ~ Beta(a, a) —
   takes the tokens inside it from the reversed batch; the dense targets inside the box are swapped
   the same way and the class target is mixed by the box's area;
3. loss = cls_weight x CE(class logits, class target) + beta x mean over tokens of
   CE(token logits, dense target).

Students and teachers: any model that declares dense per-token logits in the model contract
(``supports_dense``; :mod:`vitscale.models.contract`) — VOLO, whose ``aux_head`` classifies every
token, and the ViT, whose own classifier is applied to every patch token (pre-logits features ->
head); a ViT's MixToken swaps the pixels of whole patches, which is the same as swapping patch
tokens because ViT patches do not overlap.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitscale.data import keyed
from vitscale.data.mixup import smooth_one_hot
from vitscale.data.token_label_files import LabelFileFolder, WithLabelFiles, label_format
from vitscale.data.token_label_targets import mix_ground_truth, teacher_class_target, token_label_targets
from vitscale.data.token_labels import TokenLabelStore
from vitscale.errors import CheckError
from vitscale.models.common.token_mix import TokenMix, apply_token_mix

from .base import Task, register_task
from .module import TrainModule
from .token_labeling_config import TokenLabelingConfig

STREAM_MIX_TOKEN = keyed.STREAM_MIX_TOKEN  # allotted in vitscale.data.keyed
NEEDS_LABELS = "train.task=token_labeling needs token_label.path (a folder from `vitscale label-tokens`)"


# ------------------------------------------------------------------------------ dense model outputs
def dense_forward(model: nn.Module, images: torch.Tensor, mix: TokenMix | None = None):
    """``(class logits (B, C), token logits (B, gh, gw, C))`` of a model with dense outputs.

    Goes through ``model.__call__`` so FSDP's hooks gather the parameters.
    """
    if not model.supports_dense:
        raise NotImplementedError(
            f"{type(model).__name__} gives no per-token class logits: token labeling needs a ViT or VOLO model"
        )
    return model(images, dense=True, mix=mix)


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
def _check_cls_target(tl, label_format: str) -> None:
    if tl.cls_target == "teacher" and label_format != "vitscale":
        raise CheckError(f"token_label.cls_target=teacher: the label files at {tl.path} (TokenLabeling's) hold no "
                         "class-token prediction; use token_label.cls_target=crop (the reference's)")  # fmt: skip


class TokenLabelingTask(Task):
    """Evaluates as a classifier (``val_top1``, ``val_top5``, ``val_loss``); the bench times softmax
    cross-entropy. ``teacher`` is the group of ``vitscale label-tokens``, which writes its labels."""

    name = "token_labeling"
    config = TokenLabelingConfig

    def __init__(self, cfg, model: nn.Module, num_classes: int | None, dp_group=None, class_names=None):
        super().__init__(cfg, model, num_classes, dp_group, class_names)
        tl = cfg.token_label
        if not tl.path:
            raise ValueError(NEEDS_LABELS)
        self.tl = tl
        if label_format(tl.path, tl.format) == "vitscale":
            self.store = TokenLabelStore(tl.path, tl.split)
            self.num_classes = num_classes or self.store.num_classes
            if self.store.num_classes != self.num_classes:
                raise ValueError(f"token labels have {self.store.num_classes} classes but the model {self.num_classes}")
        else:
            if not num_classes:
                raise ValueError("TokenLabeling's label files hold no class count: the run must give one")
            self.store = LabelFileFolder(tl.path, num_classes)
        _check_cls_target(tl, self.store.format)
        self.smoothing = cfg.train.label_smoothing
        self.seed = cfg.train.seed

    def build(self, run) -> TrainModule:
        """TokenLabeling's label files are found by image file: bound to the training images, the first
        read (a missing or malformed folder is refused before the first step), then read with each
        sample in the DataLoader workers (the training source wrapped: :class:`WithLabelFiles`)."""
        if not isinstance(self.store, LabelFileFolder):
            return TrainModule(self.model)
        source = run.loaders.train.dataset.source
        paths = getattr(source, "paths", None)
        if paths is None:
            raise CheckError(f"token_label.path={self.tl.path} holds TokenLabeling's <class>/<image>.pt files, found by "
                             f"image file: train on an image folder (data.format=imagefolder), not {run.cfg.data.format}")  # fmt: skip
        self.store.bind(paths)
        self.store.topk_maps(torch.zeros(1, dtype=torch.long))  # sets the folder's map shape before any worker starts
        run.loaders.train.dataset.source = WithLabelFiles(source, self.store)
        k, h, w = self.store.shape
        return TrainModule(self.model, notices=[f"token labels: TokenLabeling's files at {self.tl.path} (top-{k} logits on {h}x{w})"])

    @classmethod
    def check(cls, cfg, model, dims, purpose):
        """Training needs the teacher's labels (``token_label.path``, a folder of a known format) and a
        model with per-token class logits (``supports_dense``: ViT, VOLO): refused before any data is
        read or model built."""
        super().check(cfg, model, dims, purpose)
        if purpose != "train":
            return
        if not cfg.token_label.path:
            raise CheckError(NEEDS_LABELS)
        model_cls = model.family.model_cls
        if not getattr(model_cls, "supports_dense", False):
            raise CheckError(f"train.task=token_labeling needs a model with per-token class logits (a ViT or VOLO): "
                             f"{cfg.model.name} ({model_cls.__name__}) gives none; choose such a model.name or another train.task")  # fmt: skip
        _check_cls_target(cfg.token_label, label_format(cfg.token_label.path, cfg.token_label.format))

    @classmethod
    def for_evaluation(cls, cfg, model: nn.Module, num_classes: int | None, dp_group=None, class_names=None) -> Task:
        """Trained weights evaluate as a classifier (no token labels needed)."""
        from .classification import ClassificationTask

        return ClassificationTask(cfg, model, num_classes, dp_group, class_names)

    @classmethod
    def default_evals(cls, cfg):
        return [{"kind": "classification", "name": "val", "every": cfg.eval.every}]

    def targets(self, batch: dict, grid: tuple[int, int], device) -> tuple[torch.Tensor, torch.Tensor]:
        """Class targets ``(B, C)`` and dense targets ``(B, gh, gw, C)`` on the token ``grid`` (before MixToken)."""
        labels = batch["label"]
        # rows are read on the host (never by a device copy); by sample key for streamed shards
        host = batch.get("host", batch)
        index = self.store.rows(host["index"], batch.get("key"), host.get("label"))  # each row checked against its sample
        B, C, tl = labels.shape[0], self.num_classes, self.tl
        maps = batch.get("token_label_maps")  # TokenLabeling's files, read with the samples (WithLabelFiles)
        if maps is not None:
            errors = [e for e in batch["token_label_error"] if e]
            if errors:
                raise CheckError(errors[0])
            values, indices = maps[:, 0].float(), maps[:, 1].long()  # (B, k, th, tw): the image
        else:
            values, indices = (t.to(device, non_blocking=True) for t in self.store.topk_maps(index))
        crop = batch.get("crop")
        if crop is None:
            crop = torch.zeros(B, 4, device=device)
            crop[:, 2:] = 1.0  # the whole image (top, left, h, w): filled on the device, nothing copied there
        flip = batch.get("flip")
        if flip is None:
            flip = torch.zeros(B, dtype=torch.bool, device=device)
        cls, tok = token_label_targets(
            values, indices, C, crop, flip, grid, view=self.store.view_boxes(index, device), smoothing=self.smoothing,
            reference_box=tl.reference_box, sampling_ratio=tl.sampling_ratio,
        )  # fmt: skip
        if tl.cls_target == "teacher":
            cls = teacher_class_target(*self.store.cls_topk(index, device), C, self.smoothing)
        elif tl.cls_target == "ground_truth":
            cls = smooth_one_hot(labels, C, self.smoothing)
        if tl.ground_truth_mix:
            cls = mix_ground_truth(cls, labels, self.smoothing)
        return cls, tok

    def loss(self, model, batch, step):
        images, labels = batch["image"], batch["label"]
        device = images.device
        grid = model.token_grid(tuple(images.shape[-2:]))
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


register_task(TokenLabelingTask)
