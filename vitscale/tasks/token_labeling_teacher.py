"""The teacher's pass of token labeling: a split's dense top-k labels, written for ``train.task=token_labeling``.

:func:`label_split` runs a teacher with dense outputs (:func:`vitscale.tasks.token_labeling.dense_forward`,
the outputs the token-labeling loss trains a student on) over a loader and writes, per image, its
top-k class logits at every token location and its class-token top-k logits (as TokenLabeling's
``generate_label.py`` stores them)
(:class:`vitscale.data.token_labels.TokenLabelWriter`; the format is described there). It also
counts the teacher's class top-1 and the fraction of locations whose top class is the image label.

The caller supplies the model and the loader (``vitscale.tasks.token_labeling_job`` assembles the
teacher's run for ``vitscale label-tokens``). Under torchrun each data-parallel rank labels whole
batches of the split into the same files, and every rank returns the summary of the whole split.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn

from vitscale.data.token_labels import TokenLabelWriter, unique_keys

from .token_labeling import dense_forward


def label_split(
    teacher: nn.Module,
    loader,
    out: str,
    split: str,
    *,
    topk: int,
    info: dict,
    device: torch.device,
    autocast=contextlib.nullcontext,
    group=None,
    writes: bool = True,
) -> dict:
    """Write ``split``'s dense labels under ``out``; returns ``{images, grid, topk, teacher_top1,
    teacher_token_top1, seconds}`` (accuracies in percent, over the whole split).

    ``topk`` is cut to the teacher's class count; ``writes=False`` for a rank that labels the same
    samples as another (a tensor-parallel peer); under torchrun the counts are summed over ``group``
    (the data-parallel ranks; None = the world), as ``vitscale.eval.classification`` does."""
    num_classes = teacher.num_classes
    n = len(loader.dataset)
    writer = None
    source = loader.dataset.source
    keys = getattr(source, "keys", None)  # shards: rows also found by sample key
    if keys is not None:  # before any work: a key two samples hold could not find its labels
        places = [getattr(m, "url", "") or getattr(m, "shard", "?") for m in getattr(source, "images", keys)]
        unique_keys(keys, places, what=f"label-tokens {split!r}")
    counts = torch.zeros(3, dtype=torch.float64, device=device)  # images, class top-1, token top-1
    t0 = time.perf_counter()
    with torch.no_grad():
        for batch in loader:
            with autocast():
                cls, tok = dense_forward(teacher, batch["image"])  # (B, C), (B, gh, gw, C)
            cls_p, tok_p = cls.float().softmax(-1), tok.float().softmax(-1)
            if writer is None:
                writer = TokenLabelWriter(out, split, n, tuple(tok.shape[1:3]), min(topk, num_classes), num_classes,
                                          info, writes=writes, keys=keys)  # fmt: skip
            writer.write(batch["index"], tok, cls, batch.get("crop"), batch["label"])
            real = (batch["index"] >= 0).to(device)  # padding samples (index -1) do not count
            labels = batch["label"].to(device)
            tok_hit = (tok_p.argmax(-1) == labels.view(-1, 1, 1)).double().mean((1, 2))  # (B,)
            counts += torch.stack([real.sum().double(), ((cls_p.argmax(-1) == labels) & real).sum().double(),
                                   torch.where(real, tok_hit, 0.0).sum()])  # fmt: skip
    if writer is None:
        raise ValueError(f"the {split!r} split has no images to label")
    writer.close()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(counts, group=group)
    seen, correct, tok_correct = counts.tolist()
    return {
        "images": n, "grid": list(writer.grid), "topk": writer.topk, "teacher_top1": 100.0 * correct / max(seen, 1),
        "teacher_token_top1": 100.0 * tok_correct / max(seen, 1), "seconds": round(time.perf_counter() - t0, 2),
    }  # fmt: skip


__all__ = ["label_split"]
