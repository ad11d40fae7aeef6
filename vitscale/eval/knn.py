"""Weighted k-nearest-neighbour classification of frozen features: the ``knn`` evaluator (an entry of
``evals:``), DINO's protocol (Caron et al. 2021, arXiv 2104.14294, section 4.1; facebookresearch/dino
``eval_knn.py`` at 7c446df, ``knn_classifier`` lines 143-182).

The features are those of the probes (:func:`vitscale.eval.probe.extract_features`: the model's
pre-logits representation, the train and scored splits with the evaluation transform, gathered over
the data-parallel ranks in dataset order), L2-normalised (``eval_knn.py`` lines 81-82). The
``fit_split`` (train) is the bank, every image of ``split`` (val) a query: its ``k`` most
cosine-similar bank images vote for their class with weight ``exp(similarity / temperature)``
(lines 159-171); the classes ordered by their summed votes give top-1 and top-5 (top-5 among the
first ``min(5, k)``, line 178). ``k`` = 20 and ``temperature`` = 0.07: DINO's reported setting
(``eval_knn.py`` lines 194-197: "20 is usually working the best", ``--temperature`` 0.07).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from .evaluator import EvaluatorConfig, register_evaluator
from .probe import _Probe

QUERY_CHUNK = 1024  # queries scored at once (a (chunk, bank) similarity matrix)


def knn_classify(bank: torch.Tensor, bank_labels: torch.Tensor, queries: torch.Tensor, query_labels: torch.Tensor,
                 num_classes: int, k: int = 20, temperature: float = 0.07) -> dict[str, float]:  # fmt: skip
    """Top-1 / top-5 (percent) of DINO's weighted k-NN vote (module docstring); float64 on the CPU."""
    dtype = torch.float64 if bank.device.type == "cpu" else torch.float32
    bank = F.normalize(bank.to(dtype), dim=1)
    queries = F.normalize(queries.to(dtype), dim=1)
    k = min(k, bank.shape[0])
    top = min(5, k, num_classes)
    correct1 = correct5 = 0
    for start in range(0, queries.shape[0], QUERY_CHUNK):
        q, y = queries[start : start + QUERY_CHUNK], query_labels[start : start + QUERY_CHUNK]
        sim, idx = (q @ bank.T).topk(k, dim=1)  # (c, k) the nearest bank images
        votes = torch.zeros(q.shape[0], num_classes, dtype=dtype, device=q.device)
        votes.scatter_add_(1, bank_labels[idx], (sim / temperature).exp())
        ranked = votes.argsort(dim=1, descending=True)[:, :top]  # (c, top)
        hit = ranked == y[:, None]
        correct1 += int(hit[:, 0].sum())
        correct5 += int(hit.any(dim=1).sum())
    n = max(queries.shape[0], 1)
    return {"top1": 100.0 * correct1 / n, "top5": 100.0 * correct5 / n}


@dataclass
class KnnConfig(EvaluatorConfig):
    """``kind: knn``: DINO's weighted k-NN classifier, the ``fit_split`` as the bank, scored on ``split``."""

    RANGES: ClassVar[dict[str, tuple]] = {"k": (1, 1 << 16), "temperature": (0.0, 1e3)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    fit_split: Literal["train", "val"] = "train"
    """The split whose features are the bank of labelled neighbours (DINO: ImageNet train)."""
    k: int = 20
    """Neighbours that vote (DINO ``eval_knn.py`` ``--nb_knn``; 20 is its reported setting)."""
    temperature: float = 0.07
    """Each neighbour votes with ``exp(cosine similarity / temperature)`` (DINO ``--temperature`` 0.07)."""

    def __post_init__(self):
        super().__post_init__()
        if self.k < 1:
            raise ValueError(f"k={self.k} must be >= 1 (neighbours that vote; DINO: 20)")
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature} must be > 0 (DINO: 0.07)")


class Knn(_Probe):
    config = KnnConfig
    default_name = "knn"

    def fit(self, xtr, ytr, xva, yva, num_classes):
        return knn_classify(xtr, ytr, xva, yva, num_classes, self.cfg.k, self.cfg.temperature)


register_evaluator("knn", Knn)

__all__ = ["Knn", "KnnConfig", "knn_classify"]
