"""Zero-shot classification with a CLIP model: class names x prompt templates -> a text classifier.

As open_clip's ``build_zero_shot_classifier``: every prompt is embedded and L2-normalised, the
prompts of a class are averaged and the mean normalised again; an image is assigned the class whose
embedding is closest. Embeddings of a (per-rank sharded) loader are gathered over ranks in dataset
order, so the metrics are those of the whole split.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def readable_class_names(names: list[str] | tuple[str, ...]) -> list[str]:
    """Names for prompts: digits '0'..'9' become number words, underscores become spaces."""
    out = []
    for n in names:
        n = str(n)
        out.append(NUMBER_WORDS[int(n)] if n.isdigit() and int(n) < 10 else n.replace("_", " "))
    return out


def _embed(model: nn.Module, images=None, tokens=None) -> torch.Tensor:
    """Embeddings through ``forward`` (not ``encode_*``), so FSDP2's root unit gathers its parameters."""
    out = model(images, tokens, output_dict=True)
    return out["image_features"] if images is not None else out["text_features"]


@torch.no_grad()
def zeroshot_classifier(
    model: nn.Module, tokenizer, class_names, templates, device, autocast=contextlib.nullcontext
) -> torch.Tensor:
    """``(output_dim, num_classes)`` classifier: the normalised mean prompt embedding per class."""
    weights = []
    for name in class_names:
        tokens = tokenizer([t.format(name) for t in templates]).to(device)  # (T, L)
        with autocast():
            emb = _embed(model, tokens=tokens)
        emb = F.normalize(emb.float(), dim=-1).mean(0)
        weights.append(F.normalize(emb, dim=-1))
    return torch.stack(weights, dim=1)  # (E, K)


def _gather_ordered(t: torch.Tensor, index: torch.Tensor, group=None) -> torch.Tensor:
    """Concatenate every data-parallel rank's rows and sort them by dataset index (ranks may hold
    unequal counts). ``group``: the data-parallel group (None = the world)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return t[index.argsort()]
    world = dist.get_world_size(group)
    n = torch.tensor([t.shape[0]], device=t.device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n, group=group)
    m = int(max(s.item() for s in sizes))
    pad = torch.zeros((m - t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    ipad = torch.full((m - t.shape[0],), -1, dtype=index.dtype, device=t.device)
    parts = [torch.empty((m, *t.shape[1:]), dtype=t.dtype, device=t.device) for _ in range(world)]
    iparts = [torch.empty(m, dtype=index.dtype, device=t.device) for _ in range(world)]
    dist.all_gather(parts, torch.cat([t, pad]), group=group)
    dist.all_gather(iparts, torch.cat([index.to(t.device), ipad]), group=group)
    allt, alli = torch.cat(parts), torch.cat(iparts)
    keep = alli >= 0
    allt, alli = allt[keep], alli[keep]
    return allt[alli.argsort()]


@torch.no_grad()
def collect_embeddings(
    model: nn.Module, loader, device, autocast=contextlib.nullcontext, text_transform=None, group=None
) -> dict[str, torch.Tensor]:
    """Normalised image (and, when batches carry ``text`` tokens, text) embeddings and labels of the
    whole split, gathered over the data-parallel ranks (``group``; None = the world) in dataset order."""
    was_training = model.training
    model.eval()
    img, txt, labels, index = [], [], [], []
    for batch in loader:
        images = batch["image"].to(device, non_blocking=True)
        with autocast():
            img.append(F.normalize(_embed(model, images=images).float(), dim=-1))
            if "text" in batch:
                tokens = batch["text"].to(device)
                if text_transform is not None:
                    tokens = text_transform(tokens)
                txt.append(F.normalize(_embed(model, tokens=tokens).float(), dim=-1))
        labels.append(batch["label"].to(device))
        index.append(batch["index"].to(device))
    model.train(was_training)
    if not img:
        return {}
    idx = torch.cat(index)
    out = {
        "image": _gather_ordered(torch.cat(img), idx, group),
        "label": _gather_ordered(torch.cat(labels), idx, group),
    }
    if txt:
        out["text"] = _gather_ordered(torch.cat(txt), idx, group)
    return out


def zeroshot_accuracy(
    image_features: torch.Tensor, labels: torch.Tensor, classifier: torch.Tensor
) -> dict[str, float]:
    """``{"zeroshot_top1", "zeroshot_top5"}`` in percent (open_clip reports fractions; vitscale writes
    every accuracy in percent, ``vitscale.tools.units``)."""
    logits = image_features @ classifier  # (N, K)
    k = min(5, logits.shape[1])
    topk = logits.topk(k, dim=-1).indices
    hit = topk == labels.unsqueeze(1)
    return {
        "zeroshot_top1": 100.0 * hit[:, 0].sum().item() / hit.shape[0],
        "zeroshot_top5": 100.0 * hit.any(1).sum().item() / hit.shape[0],
    }


@torch.no_grad()
def evaluate_zeroshot(
    model: nn.Module, loader, class_names, templates, device, autocast=contextlib.nullcontext, tokenizer=None
) -> dict[str, float]:
    """Zero-shot top-1 / top-5 of ``model`` on ``loader`` (batches with ``image`` and ``label``)."""
    if tokenizer is None:
        from vitscale.models.clip.tokenizer import create_tokenizer

        tokenizer = create_tokenizer("clip")
    emb = collect_embeddings(model, loader, device, autocast)
    clf = zeroshot_classifier(model, tokenizer, class_names, templates, device, autocast)
    return zeroshot_accuracy(emb["image"], emb["label"], clf)


__all__ = [
    "collect_embeddings",
    "evaluate_zeroshot",
    "readable_class_names",
    "zeroshot_accuracy",
    "zeroshot_classifier",
]
