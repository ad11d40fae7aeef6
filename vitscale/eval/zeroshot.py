"""Zero-shot classification with a CLIP model: class names x prompt templates -> a text classifier.

As open_clip's ``build_zero_shot_classifier``: every prompt is embedded and L2-normalised, the
prompts of a class are averaged and the mean normalised again; an image is assigned the class whose
embedding is closest. Embeddings of a (per-rank sharded) loader are gathered over ranks in dataset
order, so the metrics are those of the whole split.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import string
from dataclasses import dataclass
from importlib import resources

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .evaluator import Evaluator, EvaluatorConfig, register_evaluator
from .gather import gather_ordered

CLASSNAME_SETS = ("imagenet",)  # vitscale/eval/classnames/<name>.json
_WNID = re.compile(r"^n\d{8}$")


@functools.cache
def classname_set(name: str) -> dict:
    """A shipped set of class names and prompt templates (``eval.classnames``): ``{"class_names",
    "templates", "wnids", "source"}``. ``imagenet``: the 1,000 ImageNet classes and the 80 prompt
    templates of the CLIP paper's zero-shot ImageNet evaluation (arXiv 2103.00020), with the WordNet
    ids in class-index order (``scripts/make_imagenet_classnames.py`` wrote the file)."""
    if name not in CLASSNAME_SETS:
        raise ConfigError(f"eval.classnames must be one of {', '.join(CLASSNAME_SETS)} (a set vitscale ships); got {name!r}")
    return json.loads(resources.files("vitscale.eval").joinpath("classnames", f"{name}.json").read_text())


def check_data_classes(name: str, data_classes: list[str]) -> None:
    """The run's data must be the set's classes in its order: as many classes, and WordNet-id folder
    names (an ImageNet image folder) equal to the set's in order. One line when not."""
    want = classname_set(name)
    if len(data_classes) != len(want["class_names"]):
        raise ConfigError(f"eval.classnames={name}: the val data has {len(data_classes)} classes, the set "
                          f"{len(want['class_names'])}: point data.val_path at the {name} validation images")  # fmt: skip
    if all(_WNID.match(str(c)) for c in data_classes) and list(data_classes) != want["wnids"]:
        i = next(i for i, (a, b) in enumerate(zip(data_classes, want["wnids"])) if a != b)
        raise ConfigError(f"eval.classnames={name}: the val data's class {i} is {data_classes[i]}, the set's "
                          f"{want['wnids'][i]}: the classes are not in the set's order")  # fmt: skip


def check_templates(where: str, templates) -> None:
    """Each prompt template holds the class name's place exactly once, as ``{}``: a template without it
    gives every class the same prompt (a classifier of identical rows), ``{1}`` / ``{name}`` / a second
    ``{}`` fail at the first evaluation, mid-run. One line naming the template."""
    if not templates:
        raise ConfigError(f"{where} is empty: give at least one template holding {{}} (the class name's place)")
    for t in templates:
        try:
            fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(str(t)) if f is not None]
        except ValueError as e:  # a lone brace
            raise ConfigError(f"{where}: template {t!r} is not a format string ({e}): write the class name's place as "
                              f"{{}} and a literal brace as {{{{ or }}}}") from None  # fmt: skip
        if fields != [("", "", None)]:
            raise ConfigError(f"{where}: template {t!r} must hold the class name's place exactly once, as {{}} "
                              f"(it has {len(fields)} place(s): {', '.join('{' + f + '}' for f, _, _ in fields) or 'none'})")  # fmt: skip


def check_class_names(where: str, names, data_names, num_classes: int | None = None) -> None:
    """Class names given for prompts or captions, against the data they describe: one a class (the
    data's count, when known), none twice, and — when the data names its classes and these are the
    same names — in the data's order. One line when not (3 or 12 names for 10 classes were used as they
    came: a prompt per name, labels read against the wrong rows)."""
    names = [str(n) for n in names]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"{where} names {twice!r} twice: each class needs a name of its own")
    count = len(data_names) if data_names else num_classes
    if count and len(names) != count:
        raise ConfigError(f"{where} has {len(names)} names but the data has {count} classes"
                          + (f" ({', '.join(map(str, list(data_names)[:5]))}{', ...' if len(data_names) > 5 else ''})" if data_names else "")
                          + ": give one name a class, in label order, or leave it out for the data's own")  # fmt: skip
    if data_names:
        for theirs in (list(map(str, data_names)), readable_class_names(list(data_names))):
            if set(theirs) == set(names) and theirs != names:
                i = next(i for i, (a, b) in enumerate(zip(names, theirs)) if a != b)
                raise ConfigError(f"{where} names the data's classes in another order (class {i} is {theirs[i]!r} in "
                                  f"the data, {names[i]!r} here): give them in label order, or leave it out")  # fmt: skip


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


def round_embeddings(model: nn.Module, loader, ctx) -> dict[str, torch.Tensor]:
    """:func:`collect_embeddings` of ``loader``, computed once per evaluation round for the evaluators
    that share it (zero-shot and retrieval on the same split)."""
    return ctx.cached(("embeddings", id(model), id(loader)), lambda: collect_embeddings(
        model, loader, ctx.device, ctx.autocast, text_transform=ctx.fit_text, group=ctx.group))  # fmt: skip


@dataclass
class ZeroShotConfig(EvaluatorConfig):
    """``kind: zeroshot``: zero-shot top-1 / top-5 of an image-text model (class names x prompt templates)."""

    templates: tuple[str, ...] = ("a photo of a {}.",)
    """Prompt templates, ``{}`` = the class name; a class's text embedding is their normalised mean
    (the CLIP paper's default prompt, arXiv 2103.00020)."""
    class_names: tuple[str, ...] | None = None
    """Class names for the prompts, in label order; None = its data's (digits '0'..'9' become words)."""
    classnames: str | None = None
    """A set vitscale ships, in place of ``class_names`` and ``templates``: ``imagenet`` = the 1,000
    ImageNet class names and the 80 templates of the CLIP paper's zero-shot ImageNet evaluation (the
    val data must hold those 1,000 classes in ImageNet's order); None = neither."""

    def __post_init__(self):
        super().__post_init__()
        check_templates("zeroshot.templates", self.templates)


def prompt_classes(cfg, ctx, name: str) -> tuple[list[str], tuple[str, ...]]:
    """The class names and prompt templates of a zero-shot classifier for the data of the evaluator
    entry ``cfg`` (its ``classnames`` set, else its ``class_names`` checked against the data, else the
    data's own, made readable; and its ``templates``). ``name``: the entry's metric prefix (messages)."""
    if cfg.classnames:
        if cfg.class_names:
            raise ConfigError(f"{name}: classnames={cfg.classnames} names the classes already: drop class_names")
        named = classname_set(cfg.classnames)
        check_data_classes(cfg.classnames, list(ctx.data.classes(cfg.data)[1]))
        return list(named["class_names"]), tuple(named["templates"])
    count, data_names = ctx.data.classes(cfg.data)
    if cfg.class_names:  # checked against the data before use
        check_class_names(f"{name}.class_names", cfg.class_names, data_names, count)
    return (list(cfg.class_names) if cfg.class_names else readable_class_names(data_names)), tuple(cfg.templates)


class ZeroShotEvaluator(Evaluator):
    config = ZeroShotConfig
    default_name = "zeroshot"

    def __init__(self, cfg: ZeroShotConfig, ctx):
        super().__init__(cfg, ctx)
        if ctx.tokenizer is None:
            raise ConfigError("evals: zeroshot needs an image-text model (a CLIP) and its tokenizer")
        self.loader = ctx.data.loader(cfg.data, cfg.split, cfg.batch_size)
        self.names, self.templates = prompt_classes(cfg, ctx, self.name)

    @torch.no_grad()
    def __call__(self, model):
        c = self.ctx
        emb = round_embeddings(model, self.loader, c)
        if not emb or not self.names or not bool((emb["label"] >= 0).all()):  # captions without class labels
            return {}
        was_training = model.training
        model.eval()
        clf = zeroshot_classifier(model, c.tokenizer, self.names, self.templates, c.device, c.autocast)
        model.train(was_training)
        return {k.removeprefix("zeroshot_"): v for k, v in zeroshot_accuracy(emb["image"], emb["label"], clf).items()}


register_evaluator("zeroshot", ZeroShotEvaluator)

__all__ = [
    "ZeroShotConfig", "ZeroShotEvaluator", "check_class_names", "check_templates", "collect_embeddings", "prompt_classes",
    "readable_class_names", "round_embeddings",
    "zeroshot_accuracy", "zeroshot_classifier",
]  # fmt: skip
