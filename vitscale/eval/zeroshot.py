"""Zero-shot classification with a CLIP model: class names x prompt templates -> a text classifier.

As open_clip's ``build_zero_shot_classifier``: every prompt is embedded and L2-normalised, the
prompts of a class are averaged and the mean normalised again; an image is assigned the class whose
embedding is closest. Embeddings of a (per-rank sharded) loader are gathered over ranks in dataset
order, so the metrics are those of the whole split.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from .gather import gather_ordered

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
        "image": gather_ordered(torch.cat(img), idx, group),
        "label": gather_ordered(torch.cat(labels), idx, group),
    }
    if txt:
        out["text"] = gather_ordered(torch.cat(txt), idx, group)
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
        from vitscale.models.registry import family_of

        tokenizer = family_of(model).create_tokenizer()  # the model family's
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
