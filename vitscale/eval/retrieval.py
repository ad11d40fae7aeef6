"""Image <-> text retrieval recall@K (open_clip's ``image_retrieval_recall@k`` / ``text_retrieval_recall@k``).

Pair i of the split is image i with caption i. ``text_retrieval_recall@k`` (image -> text): the
percentage of images whose own caption is among the k most similar captions; ``image_retrieval_recall@k``
(text -> image) the other way round.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from .zeroshot import collect_embeddings


def retrieval_recall(
    image_features: torch.Tensor, text_features: torch.Tensor, ks=(1, 5, 10)
) -> dict[str, float]:
    """Recall@k both ways for paired, normalised features ``(N, E)``, in percent."""
    sim = image_features @ text_features.t()  # (N, N)
    n = sim.shape[0]
    target = torch.arange(n, device=sim.device)
    # rank of the true partner = number of candidates scoring strictly higher
    pos_i2t = sim[target, target]
    rank_i2t = (sim > pos_i2t.unsqueeze(1)).sum(1)  # image -> text
    rank_t2i = (sim > pos_i2t.unsqueeze(0)).sum(0)  # text -> image
    out = {}
    for k in ks:
        out[f"text_retrieval_recall@{k}"] = 100.0 * (rank_i2t < k).sum().item() / n
        out[f"image_retrieval_recall@{k}"] = 100.0 * (rank_t2i < k).sum().item() / n
    return out


@torch.no_grad()
def evaluate_retrieval(
    model: nn.Module, loader, device, autocast=contextlib.nullcontext, ks=(1, 5, 10)
) -> dict[str, float]:
    """Recall@k of ``model`` on a loader whose batches carry ``image`` and ``text`` tokens."""
    emb = collect_embeddings(model, loader, device, autocast)
    if "text" not in emb:
        raise ValueError("retrieval needs captions: the loader's batches have no 'text'")
    return retrieval_recall(emb["image"], emb["text"], ks)


__all__ = ["evaluate_retrieval", "retrieval_recall"]
