"""Image <-> text retrieval recall@K (open_clip's ``image_retrieval_recall@k`` / ``text_retrieval_recall@k``).

Pair i of the split is image i with caption i. ``text_retrieval_recall@k`` (image -> text): the
percentage of images whose own caption is among the k most similar captions; ``image_retrieval_recall@k``
(text -> image) the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .evaluator import Evaluator, EvaluatorConfig, register_evaluator
from .zeroshot import round_embeddings


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


@dataclass
class RetrievalConfig(EvaluatorConfig):
    """``kind: retrieval``: image <-> text recall@K of an image-text model on captioned data."""

    RANGES: ClassVar[dict[str, tuple]] = {"ks": (1, 1 << 20)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    ks: tuple[int, ...] = (1, 5, 10)
    """The K of recall@K."""


class RetrievalEvaluator(Evaluator):
    config = RetrievalConfig
    default_name = ""  # its metric names say what they are: text_retrieval_recall@K, image_retrieval_recall@K

    def __init__(self, cfg: RetrievalConfig, ctx):
        super().__init__(cfg, ctx)
        self.loader = ctx.data.loader(cfg.data, cfg.split, cfg.batch_size)

    @torch.no_grad()
    def __call__(self, model):
        emb = round_embeddings(model, self.loader, self.ctx)
        if "text" not in emb:  # the split has no captions
            return {}
        return retrieval_recall(emb["image"], emb["text"], self.cfg.ks)


register_evaluator("retrieval", RetrievalEvaluator)

__all__ = ["RetrievalConfig", "RetrievalEvaluator", "retrieval_recall"]
