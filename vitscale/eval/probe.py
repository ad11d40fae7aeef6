"""Linear-probe and few-shot evaluation of frozen features: the ``linear_probe`` and ``fewshot``
evaluators (an entry of ``evals:``, or ``vitscale eval … eval.probe=linear|fewshot``).

Features are the model's pre-logits representation through the uniform model API,
``forward_head(forward_features(x), pre_logits=True)``, run as ``model(x, pre_logits=True)``: the
pooled (and ``fc_norm``-ed) tokens of a ViT or VOLO, the image embedding of a CLIP (its
``forward_head`` is ``encode_image``'s projection). They are computed once for the train split
(with the evaluation transform: no augmentation) and the validation split. The linear probe can read
DINOv2's linear-evaluation features instead (``features``, :func:`linear_input`).

- ``linear``: multinomial logistic regression, ``mean cross-entropy + l2 / 2 * |W|^2`` (bias not
  penalised) on features standardised with the train split's mean and std, fitted full-batch with
  ``torch.optim.LBFGS`` (strong-Wolfe line search): the objective of the CLIP paper's probes
  (arXiv:2103.00020, scikit-learn's L-BFGS ``LogisticRegression`` with a searched C) solved by
  torch, so that it runs where the features are (a GPU for ImageNet-sized feature sets) in float64
  on CPU; ``tests/unit/test_probe.py`` checks it against scikit-learn. The penalty is chosen from
  ``l2`` (``eval.probe_l2``) on a held-out part of the train split, then refit on the whole split.
- ``fewshot``: big_vision's few-shot evaluator (``big_vision/evaluators/fewshot_lsr.py``): for each
  of ``seeds`` (``eval.fewshot_seeds``) draws, ``k`` train images per class, features whitened with their mean
  and std, a constant bias feature of 100 appended, closed-form ridge regression (penalty
  ``l2``, ``eval.fewshot_l2``) onto one-hot targets in {-1, 1}, top-1 of the argmax on the validation split.

On several processes (``torchrun … -m vitscale eval``) each rank extracts the features of its shard of
both splits; they are gathered in dataset order, and every rank fits the same probe on all of them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from vitscale.data import keyed
from vitscale.errors import ConfigError

from ..config.evals import ProbeFeatures
from .evaluator import Evaluator, EvaluatorConfig, MissingSplit, register_evaluator
from .gather import gather_ordered

STREAM_PROBE_SPLIT = 101
STREAM_FEWSHOT = 102
BIAS_FEATURE = 100.0  # big_vision's constant bias feature: large, so the bias is barely penalised
SMALL_PROBLEM = 1 << 22  # feature matrices with fewer elements are fitted on one CPU thread


# ----------------------------------------------------------------------------------------- features
def linear_input(tokens: list[torch.Tensor], prefix: int, patch_mean: bool) -> torch.Tensor:
    """DINOv2's linear-evaluation features (``create_linear_input``, facebookresearch/dinov2
    ``dinov2/eval/linear.py`` lines 171-183): the class token (token 0) of each of ``tokens`` (the
    normalised ``(B, T, D)`` tokens of the last blocks, oldest first) concatenated, then with
    ``patch_mean`` the mean of the last block's patch tokens (after the ``prefix`` tokens: class token,
    registers) — ``(B, len(tokens) * D + patch_mean * D)``."""
    out = [t[:, 0] for t in tokens]
    if patch_mean:
        out.append(tokens[-1][:, prefix:].mean(dim=1))
    return torch.cat(out, dim=-1)


def check_token_features(model: nn.Module, features: str, blocks: int) -> None:
    """One line (:class:`ConfigError`) when ``model`` cannot give ``features`` of its last ``blocks``
    blocks: it must declare ``supports_intermediates`` (the model contract, whose ViT config then
    names its blocks and class token)."""
    if features == "pooled":
        return
    if not model.supports_intermediates:
        raise ConfigError(f"linear probe features={features} reads the tokens of a ViT's last blocks: "
                          f"{type(model).__name__} does not give them; use features=pooled")  # fmt: skip
    cfg = model.cfg
    if not (cfg.class_token and cfg.class_token_length > 0):
        raise ConfigError(f"linear probe features={features} reads the class token: this ViT has none "
                          "(class_token=false or class_token_length=0); use features=pooled")  # fmt: skip
    if blocks > cfg.num_layers:
        raise ConfigError(f"linear probe blocks={blocks}: the model has {cfg.num_layers} blocks; "
                          f"read {cfg.num_layers} or fewer")  # fmt: skip


def read_features(model: nn.Module, images: torch.Tensor, features: str = "pooled", blocks: int = 1) -> torch.Tensor:
    """The ``(B, D')`` features the probes read: the pre-logits representation (``pooled``), or
    DINOv2's (:func:`linear_input`) from the normalised tokens of the model's last ``blocks`` blocks:
    their class tokens (``class_token``), and the last block's mean patch token
    (``class_token_patch_mean``). Through the call: FSDP2 gathers the root's parameters."""
    if features == "pooled":
        return model(images, pre_logits=True)
    tokens = model(images, intermediates=blocks)
    return linear_input(tokens, model.cfg.num_prefix_tokens, features == "class_token_patch_mean")


@torch.no_grad()
def extract_features(model: nn.Module, loader, device, autocast=contextlib.nullcontext, group=None,
                     features: str = "pooled", blocks: int = 1):  # fmt: skip
    """``(features float32 (N, D), labels (N,))`` of the whole split on ``device``, in dataset order:
    this rank's shard gathered with the other data-parallel ranks' (``group``; None = the world).
    ``features``, ``blocks``: which (:func:`read_features`)."""
    check_token_features(model, features, blocks)
    was_training = model.training
    model.eval()
    feats, labels, index = [], [], []
    for batch in loader:
        images = batch["image"].to(device, non_blocking=True)
        with autocast():
            f = read_features(model, images, features, blocks)
        feats.append(f.float())
        labels.append(batch["label"].to(device))
        index.append(batch["index"].to(device))
    model.train(was_training)
    idx = torch.cat(index)
    return gather_ordered(torch.cat(feats), idx, group), gather_ordered(torch.cat(labels), idx, group)


# ----------------------------------------------------------------------------------------- linear
def _standardize(ref: torch.Tensor, *xs: torch.Tensor) -> list[torch.Tensor]:
    mean, std = ref.mean(0, keepdim=True), ref.std(0, unbiased=False, keepdim=True) + 1e-5
    return [(x - mean) / std for x in xs]


def fit_logistic(x: torch.Tensor, y: torch.Tensor, num_classes: int, l2: float, max_iter: int = 1000, init=None):
    """Minimise ``mean CE(x @ W + b, y) + l2 / 2 * |W|^2`` with L-BFGS; returns ``(W (D, C), b (C,))``."""
    w = torch.zeros(x.shape[1], num_classes, dtype=x.dtype, device=x.device) if init is None else init[0].clone()
    b = torch.zeros(num_classes, dtype=x.dtype, device=x.device) if init is None else init[1].clone()
    w.requires_grad_(True)
    b.requires_grad_(True)
    tol = 1e-7 if x.dtype == torch.float64 else 1e-5  # on the largest gradient entry (scikit-learn's tol: 1e-4)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=tol, tolerance_change=tol * 1e-3)  # fmt: skip

    onehot = F.one_hot(y, num_classes).to(x.dtype)
    n = x.shape[0]

    def closure():  # the loss and its gradient in closed form (softmax - one-hot): no autograd graph per evaluation
        with torch.no_grad():
            logits = torch.addmm(b, x, w)
            logp = logits.log_softmax(1)
            loss = -(logp * onehot).sum() / n + 0.5 * l2 * (w * w).sum()
            d = (logp.exp() - onehot) / n
            w.grad = torch.addmm(w, x.T, d, beta=l2)  # x^T d + l2 w
            b.grad = d.sum(0)
        return loss

    with _threads_for(x):
        opt.step(closure)
    return w.detach(), b.detach()


@contextlib.contextmanager
def _threads_for(x: torch.Tensor):
    """One intra-op thread for a small CPU problem: an L-BFGS iteration of a few microseconds' work
    does not pay for waking threads (2 threads on a busy 2-core machine were ~60x slower)."""
    threads = torch.get_num_threads()
    small = x.device.type == "cpu" and x.numel() < SMALL_PROBLEM
    if small:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if small:
            torch.set_num_threads(threads)


def _topk(logits: torch.Tensor, y: torch.Tensor, k: int) -> float:
    k = min(k, logits.shape[1])
    return 100.0 * float((logits.topk(k, dim=1).indices == y[:, None]).any(1).double().mean())


def holdout_split(y: torch.Tensor, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fit, held_out)`` indices: ``round(n_c * fraction)`` of every class ``c`` (at least one when
    it has two or more), chosen by a permutation keyed by (seed, class)."""
    fit, held = [], []
    y_cpu = y.cpu()
    for c in torch.unique(y_cpu).tolist():
        idx = torch.nonzero(y_cpu == c).flatten()
        perm = idx[torch.randperm(len(idx), generator=keyed.torch_gen(seed, c, STREAM_PROBE_SPLIT))]
        k = min(max(int(round(len(idx) * fraction)), 1), len(idx) - 1) if len(idx) > 1 else 0
        held.append(perm[:k])
        fit.append(perm[k:])
    return torch.cat(fit).sort().values.to(y.device), torch.cat(held).sort().values.to(y.device)


def linear_probe(xtr, ytr, xva, yva, num_classes: int, l2s, holdout: float, max_iter: int, seed: int) -> dict:
    """The linear probe (module docstring); top-1 / top-5 in percent."""
    dtype = torch.float64 if xtr.device.type == "cpu" else torch.float32
    xtr, xva = xtr.to(dtype), xva.to(dtype)
    l2s = sorted({float(v) for v in l2s}, reverse=True)  # strong -> weak: each fit warm-starts the next
    out: dict = {}
    init = None
    if len(l2s) > 1:
        fit, held = holdout_split(ytr, holdout, seed)
        xf, xh = _standardize(xtr[fit], xtr[fit], xtr[held])
        scores = {}
        for l2 in l2s:
            init = fit_logistic(xf, ytr[fit], num_classes, l2, max_iter, init)
            scores[l2] = _topk(xh @ init[0] + init[1], ytr[held], 1)
        best = max(l2s, key=lambda v: (scores[v], v))  # ties: the stronger penalty
        out["linear_probe_holdout_top1"] = {f"{v:g}": s for v, s in scores.items()}
        out["linear_probe_holdout_images"] = int(len(held))
    else:
        best = l2s[0]
    xs, xv = _standardize(xtr, xtr, xva)
    w, b = fit_logistic(xs, ytr, num_classes, best, max_iter)
    logits = xv @ w + b
    out = {"linear_probe_top1": _topk(logits, yva, 1), "linear_probe_top5": _topk(logits, yva, 5),
           "linear_probe_l2": best, **out}  # fmt: skip
    return out


# ----------------------------------------------------------------------------------------- few-shot
def ridge_accuracy(x, y, x_test, y_test, num_classes: int, l2: float) -> float:
    """Top-1 (percent) of closed-form ridge regression from ``(x, y)``, big_vision style."""
    x, x_test = x.double(), x_test.double()
    x, x_test = _standardize(x, x, x_test)
    pad = lambda t: torch.cat([t, torch.full((t.shape[0], 1), BIAS_FEATURE, dtype=t.dtype, device=t.device)], 1)  # noqa: E731
    x, x_test = pad(x), pad(x_test)  # (N, D + 1)
    target = 2.0 * F.one_hot(y, num_classes).double() - 1.0  # (N, C) in {-1, 1}
    n, d = x.shape
    eye = lambda m: torch.eye(m, dtype=x.dtype, device=x.device)  # noqa: E731
    if n >= d:  # (x^T x + l2 I)^-1 x^T t
        w = torch.linalg.solve(x.T @ x + l2 * eye(d), x.T @ target)
    else:  # x^T (x x^T + l2 I)^-1 t: the same solution through the smaller system
        w = x.T @ torch.linalg.solve(x @ x.T + l2 * eye(n), target)
    return _topk(x_test @ w, y_test, 1)


def fewshot(xtr, ytr, xva, yva, num_classes: int, shots, seeds: int, l2: float, seed: int) -> dict:
    """k-shot top-1 (percent) averaged over ``seeds`` keyed draws of k train images per class."""
    by_class = [torch.nonzero(ytr == c).flatten() for c in range(num_classes)]
    per_seed: dict[int, list[float]] = {int(k): [] for k in shots}
    for s in range(seeds):
        perms = [idx[torch.randperm(len(idx), generator=keyed.torch_gen(seed, s, c, STREAM_FEWSHOT)).to(idx.device)]
                 for c, idx in enumerate(by_class)]  # fmt: skip
        for k in per_seed:
            pick = torch.cat([p[:k] for p in perms])
            per_seed[k].append(ridge_accuracy(xtr[pick], ytr[pick], xva, yva, num_classes, l2))
    out: dict = {}
    for k, accs in per_seed.items():
        out[f"fewshot_{k}shot_top1"] = sum(accs) / len(accs)
        out[f"fewshot_{k}shot_top1_seeds"] = accs
    fewest = min(len(i) for i in by_class)
    if fewest < max(per_seed):
        out["fewshot_note"] = f"a class has only {fewest} train images: larger k use all of them"
    return out


# ----------------------------------------------------------------------------------------- evaluators
@dataclass
class LinearProbeConfig(EvaluatorConfig):
    """``kind: linear_probe``: logistic regression on frozen features of ``fit_split``, scored on ``split``."""

    RANGES: ClassVar[dict[str, tuple]] = {"l2": (0.0, 1e12), "holdout": (0.0, 1.0), "max_iter": (1, 1 << 20), "blocks": (1, 1024)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    fit_split: Literal["train", "val"] = "train"
    """The split of its data the probe is fitted on (its features computed once per evaluation)."""
    l2: tuple[float, ...] = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
    """The L2 penalties tried (as ``eval.probe_l2``); one value = no search."""
    holdout: float = 0.2
    """Fraction of each class of the fit split held out to choose ``l2`` (as ``eval.probe_holdout``)."""
    max_iter: int = 1000
    """L-BFGS iterations per fit (at most)."""
    features: ProbeFeatures = "pooled"
    """What the probe reads (as ``eval.probe_features``): ``pooled`` = the pre-logits representation;
    DINOv2's linear-evaluation features (``dinov2/eval/linear.py`` ``create_linear_input``), from the
    normalised tokens of the ViT's last ``blocks`` blocks: ``class_token`` = their class tokens
    concatenated, ``class_token_patch_mean`` = those and the last block's mean patch token."""
    blocks: int = 1
    """With ``features`` other than ``pooled``: the last blocks whose class tokens are read (as
    ``eval.probe_blocks``; DINOv2 evaluates 1 and 4)."""

    def __post_init__(self):
        super().__post_init__()
        if self.blocks < 1:
            raise ValueError(f"blocks={self.blocks} must be >= 1 (the last blocks whose class tokens the probe reads; DINOv2: 1 or 4)")


@dataclass
class FewShotConfig(EvaluatorConfig):
    """``kind: fewshot``: big_vision's few-shot ridge regression on k frozen features per class."""

    RANGES: ClassVar[dict[str, tuple]] = {"shots": (1, 1 << 16), "seeds": (1, 1024), "l2": (0.0, 1e12)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    fit_split: Literal["train", "val"] = "train"
    """The split the k images per class are drawn from."""
    shots: tuple[int, ...] = (1, 5, 10, 25)
    """Images per class (as ``eval.shots``)."""
    seeds: int = 3
    """Draws of the k images per class, averaged (as ``eval.fewshot_seeds``)."""
    l2: float = 1024.0
    """Ridge penalty on whitened features (as ``eval.fewshot_l2``)."""


class _Probe(Evaluator):
    """Features of the fit and scored splits (gathered over the ranks in dataset order), then a fit
    that every rank computes alike, on ``train.cpu_threads`` threads on the CPU as training."""

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        from vitscale.data.dataset import KeyedDataset

        self.fit_loader = ctx.data.loader(cfg.data, cfg.fit_split, cfg.batch_size)
        self.loader = ctx.data.loader(cfg.data, cfg.split, cfg.batch_size)
        if not isinstance(getattr(self.fit_loader, "dataset", None), KeyedDataset):
            raise ValueError("probes read the whole train split: not available for data.webdataset_mode=stream")
        self.num_classes = ctx.data.classes(cfg.data)[0]
        if not self.num_classes:  # unlabelled samples (label -1): no class to fit or score
            raise MissingSplit(f"evals: {self.name} ({cfg.kind}) fits and scores class labels, and its data has none: "
                               "give it labelled data (data.val_path of data.format=images, or the entry's own data: "
                               "{format: imagefolder, ...})")  # fmt: skip

    def __call__(self, model):
        c = self.ctx
        threads = torch.get_num_threads()
        if c.device.type == "cpu" and c.cpu_threads > 0:  # as training does (tiny models: 1)
            torch.set_num_threads(c.cpu_threads)
        which = self.reads()
        try:
            xtr, ytr = extract_features(model, self.fit_loader, c.device, c.autocast, c.group, **which)
            xva, yva = extract_features(model, self.loader, c.device, c.autocast, c.group, **which)
            num_classes = int(max(self.num_classes, int(ytr.max()) + 1, int(yva.max()) + 1))
            info = {"feature_dim": int(xtr.shape[1]), "train_images": int(len(ytr)), "val_images": int(len(yva))}
            bad = int((~torch.isfinite(xtr).all(1)).sum()) + int((~torch.isfinite(xva).all(1)).sum())
            if bad:  # a fit of NaN features scored 9.67%: no metric, and the reason
                return {**info, "note": f"the features of {bad} of {len(ytr) + len(yva)} images are not finite "
                                        f"(weights that overflow?): no {self.name} metric"}  # fmt: skip
            out = {**self.fit(xtr, ytr, xva, yva, num_classes), **info}
            seen = int(torch.unique(ytr).numel())
            if seen < 2 or int(torch.unique(yva).numel()) < 2:  # 100% by construction
                out["note"] = (f"the {self.cfg.fit_split} split holds {seen} class(es) and the {self.cfg.split} split "
                               f"{int(torch.unique(yva).numel())}: with one class every prediction is right, the "
                               f"accuracy says nothing")  # fmt: skip
            return out
        finally:
            torch.set_num_threads(threads)

    def reads(self) -> dict:
        """Which features (:func:`read_features`): the pre-logits representation."""
        return {}


class LinearProbe(_Probe):
    config = LinearProbeConfig
    default_name = "linear_probe"

    def reads(self) -> dict:
        return {"features": self.cfg.features, "blocks": self.cfg.blocks}

    def fit(self, xtr, ytr, xva, yva, num_classes):
        e = self.cfg
        res = linear_probe(xtr, ytr, xva, yva, num_classes, e.l2, e.holdout, e.max_iter, self.ctx.seed)
        return {k.removeprefix("linear_probe_"): v for k, v in res.items()}


class FewShot(_Probe):
    config = FewShotConfig
    default_name = "fewshot"

    def fit(self, xtr, ytr, xva, yva, num_classes):
        e = self.cfg
        res = fewshot(xtr, ytr, xva, yva, num_classes, e.shots, e.seeds, e.l2, self.ctx.seed)
        return {k.removeprefix("fewshot_"): v for k, v in res.items()}


def probe_entry(ec) -> EvaluatorConfig:
    """The evaluation of ``eval.probe`` (``vitscale eval``) from the ``eval.*`` keys."""
    if ec.probe == "linear":
        return LinearProbeConfig(kind="linear_probe", l2=ec.probe_l2, holdout=ec.probe_holdout, max_iter=ec.probe_max_iter,
                                 features=ec.probe_features, blocks=ec.probe_blocks)  # fmt: skip
    return FewShotConfig(kind="fewshot", shots=ec.shots, seeds=ec.fewshot_seeds, l2=ec.fewshot_l2)


register_evaluator("linear_probe", LinearProbe)
register_evaluator("fewshot", FewShot)
