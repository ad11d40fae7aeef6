"""The contrastive task: templated captions for labelled images, SigLIP / InfoNCE losses, truncation,
zero-shot and retrieval metrics."""

from __future__ import annotations

import torch

import vitscale
from vitscale.config import load_config
from vitscale.data.digits import CLASS_NAMES
from vitscale.eval.retrieval import retrieval_recall
from vitscale.eval.zeroshot import readable_class_names, zeroshot_accuracy
from vitscale.tasks import get_task


def _task(*overrides):
    cfg = load_config("digits_clip", list(overrides))
    model = vitscale.create_model(cfg.model.name, **cfg.model.overrides)
    return cfg, model, get_task("contrastive")(cfg, model, 10, class_names=CLASS_NAMES)  # the run's data's names


def test_templated_captions_losses_and_truncation():
    torch.manual_seed(0)
    for loss in ("softmax", "sigmoid"):
        cfg, model, task = _task(f"train.loss={loss}")
        batch = {"image": torch.randn(6, 3, 16, 16), "label": torch.tensor([0, 1, 2, 7, 7, 7]),
                 "index": torch.arange(6)}  # fmt: skip
        value, metrics = task.loss(model, batch, step=3)
        assert torch.isfinite(value) and value > 0 and "train_i2t_top1" in metrics
        value.backward()
        assert model.text.token_embedding.weight.grad is not None and model.logit_scale.grad is not None
    tok = vitscale.create_tokenizer("clip")
    caps = task.caption_tokens(torch.tensor([7, 7, 7, 7]), torch.tensor([0, 1, 2, 3]), step=0)
    texts = {tok.decode(c[1 : int(c.argmax())]) for c in caps}
    assert all("seven" in t for t in texts) and len(texts) > 1  # class word in several templates
    again = task.caption_tokens(torch.tensor([7, 7, 7, 7]), torch.tensor([0, 1, 2, 3]), step=0)
    assert torch.equal(caps, again)  # keyed, not random
    long = tok(["a very long caption " * 10])
    cut = task.fit_context(long)
    assert cut.shape == (1, cfg.clip.context_length) and cut[0, -1] == tok.eot_token_id


def test_metrics():
    assert readable_class_names(["0", "7", "golden_retriever"]) == ["zero", "seven", "golden retriever"]
    feats = torch.nn.functional.normalize(torch.randn(20, 8), dim=-1)
    r = retrieval_recall(feats, feats)
    assert r["text_retrieval_recall@1"] == 100.0 and r["image_retrieval_recall@10"] == 100.0  # percent
    r = retrieval_recall(feats, feats.roll(1, 0))
    assert r["text_retrieval_recall@1"] < 50.0
    clf = torch.eye(8)[:, :3]  # class k = feature axis k
    x = torch.eye(8)[[0, 1, 2, 2]]
    acc = zeroshot_accuracy(x, torch.tensor([0, 1, 2, 0]), clf)
    assert acc["zeroshot_top1"] == 75.0 and acc["zeroshot_top5"] == 100.0  # percent, as every accuracy
