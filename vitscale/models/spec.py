"""What a model family declares: one :class:`FamilySpec` holds everything the rest of vitscale asks.

As torchtitan's ``TrainSpec`` (``torchtitan/protocols/train_spec.py``) bundles a model's builder,
parallelize function, tokenizer and state-dict adapter, a family's spec holds its model class and
variants, the task it trains with, its parallel plan (TP plan, blocks, and the TP plan's own checks),
its state-dict adapters (timm, open_clip), its text tokenizer, its FLOP count, its memory model and
its serving graphs. Interop, ``vitscale memory``, the layout checks, the bench, export and the
trainer ask the spec; none of them branches on a model class.

Every slot but the first four is optional, with a default that serves any family: FLOPs traced on
the meta device, a memory model measured on the meta device, one image graph of class logits, no
adapter, no tokenizer. Slots hold their objects themselves (the family's package imports them): a
family's package is imported only when the family is first asked for (``vitscale.models.registry``),
and no slot's module imports timm or open_clip.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from torch import nn

from .common.flops import image_hw, traced_flops


def keys_have(*any_of: str) -> Callable[[Collection[str]], bool]:
    """A ``recognizes`` predicate: true when a state dict holds at least one of the keys ``any_of``."""
    wanted = frozenset(any_of)
    return lambda keys: not wanted.isdisjoint(keys)


def is_library_model(model: Any, library: str, *class_names: str) -> bool:
    """Whether ``model`` is one of ``class_names`` from the package ``library`` (``timm``,
    ``open_clip``), by its class alone: nothing of the library is imported."""
    cls = type(model)
    return cls.__name__ in class_names and cls.__module__.split(".")[0] == library


def replace_config(cfg: Any, overrides: dict[str, Any]) -> Any:
    """``dataclasses.replace`` that recurses into nested dataclass fields given as dicts and names
    the closest valid field when a key is misspelt."""
    if not overrides:
        return cfg
    valid = {f.name for f in dataclasses.fields(cfg)}
    changes = {}
    for key, value in overrides.items():
        if key not in valid:
            close = difflib.get_close_matches(key, sorted(valid), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{type(cfg).__name__} has no field {key!r}{hint}")
        current = getattr(cfg, key)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            value = replace_config(current, value)
        changes[key] = value
    return dataclasses.replace(cfg, **changes)


# ----------------------------------------------------------------------------- slots


@dataclass(frozen=True)
class StateDictAdapter:
    """A family's two-way converter to another library's models, exact number for number.

    ``vitscale.interop`` (``from_timm``, ``to_timm``, ``from_open_clip``, ...) finds the adapter
    through the family's spec; the conversion itself lives beside the family's model
    (``state_dict_adapter.py``)."""

    library: str
    """The library: ``timm``, ``open_clip`` or ``transformers``."""
    accepts: Callable[[nn.Module], bool]
    """Whether a model of the library is this family's counterpart (decided by its class; imports
    nothing: :func:`is_library_model`)."""
    from_library: Callable[[nn.Module], nn.Module]
    """The library's model -> our model carrying its weights (ValueError naming what our family
    cannot express)."""
    to_library: Callable[[nn.Module], dict[str, torch.Tensor]]
    """Our model -> a state dict that loads with ``strict=True`` into ``create(model)``."""
    library_kwargs: Callable[[Any], dict[str, Any]]
    """Our variant config -> the keyword arguments of the library's model class."""
    create: Callable[..., nn.Module]
    """``create(model, load_weights=True, **library_overrides)``: the library's model of the same
    architecture (with our weights unless ``load_weights=False``)."""
    names: Mapping[str, str] = field(default_factory=dict)
    """Our variant -> the library's registered model of the same architecture (``vit_b16`` ->
    ``vit_base_patch16_224``), for labels and for reading the library's checkpoints by our name."""
    from_state_dict: Callable[[dict[str, torch.Tensor], Any], dict[str, torch.Tensor]] | None = None
    """A state dict in the library's names and layouts -> ours, for our variant config ``cfg`` (the
    config of the model it will load into): what ``checkpoint.init_from`` and ``distill.teacher`` use
    on a file of the library. None: files of the library are not read."""
    recognizes: Callable[[Collection[str]], bool] | None = None
    """Whether a state dict (a mapping of names to tensors: its names, and shapes where a naming shows
    in them) is in the library's naming of this family (``keys_have``): how a file's format is told
    when it carries no vitscale metadata. None: never recognised (the format must be named)."""


def _from_transformers(m: nn.Module) -> nn.Module:
    from vitscale.interop.transformers import from_transformers

    return from_transformers(m)


def _create_transformers(model: nn.Module, load_weights: bool = True, **overrides: Any) -> nn.Module:
    from vitscale.interop.transformers import create_transformers_model

    return create_transformers_model(model, load_weights, **overrides)


def transformers_adapter(*, accepts: Callable[[nn.Module], bool],
                         to_state_dict: Callable[[dict[str, torch.Tensor], Any], dict[str, torch.Tensor]],
                         library_kwargs: Callable[[Any], dict[str, Any]],
                         from_state_dict: Callable[[dict[str, torch.Tensor], Any], dict[str, torch.Tensor]],
                         recognizes: Callable[[Collection[str]], bool]) -> StateDictAdapter:  # fmt: skip
    """A family's adapter to Hugging Face ``transformers``: the family gives its renames both ways
    (``to_state_dict(state_dict, cfg)``, ``from_state_dict``), its config mapping and how it tells
    its classes and files; building and reading the library's models is :mod:`vitscale.interop.transformers`'s,
    the same for every family (imported when first called: no slot imports ``transformers``)."""
    return StateDictAdapter(library="transformers", accepts=accepts, from_library=_from_transformers,
                            to_library=lambda model: to_state_dict(model.state_dict(), model.cfg),
                            library_kwargs=library_kwargs, create=_create_transformers,
                            from_state_dict=from_state_dict, recognizes=recognizes)  # fmt: skip


class Tokenizer(Protocol):
    """A family's text tokenizer (CLIP's: :class:`vitscale.models.clip.tokenizer.CLIPTokenizer`)."""

    context_length: int
    """Tokens per text: every row is padded with 0 or cut to this length."""
    eot_token_id: int
    """The end-of-text id; a cut row ends with it."""

    def __call__(self, texts: str | list[str]) -> torch.Tensor:
        """Texts -> token ids ``(N, context_length)`` (int64)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What a server needs to tokenize as training did (written into an export's ``export.json``)."""
        ...

    def files(self) -> dict[str, Path]:
        """Files a server needs beside the settings (``{"vocab_file": path}``): an export copies each
        beside its graphs and records its name and SHA-256."""
        ...


class MemoryModel(Protocol):
    """How a family's training memory scales (``vitscale memory``, :func:`vitscale.tools.memory.estimate`).

    Both methods get the model built on the meta device at the image size of the estimate and the
    family's :class:`vitscale.distributed.parallelize.ParallelPlan`; the estimate does the rest
    (sharding by the layout, optimizer states, FSDP's gathered units, bytes per element)."""

    def param_counts(self, model: nn.Module, plan: Any) -> tuple[int, int, int]:
        """(all parameters, parameters in tensor-parallel layers, parameters of the largest FSDP unit)."""
        ...

    def activation_elems(self, model: nn.Module, plan: Any, tp: int, ac: str) -> tuple[float, float]:
        """Per training sample: (elements autograd holds at the end of the forward pass, elements
        one block rebuilds during its backward under ``ac="full"``), at tensor-parallel degree ``tp``
        with activation checkpointing ``ac`` (none | full | selective) on every block."""
        ...


@dataclass
class ServingGraph:
    """One graph ``vitscale export`` writes: an input -> an output, checked against eager."""

    name: str
    """File stem and key in ``export.json``: ``image``, ``text``."""
    module: nn.Module
    """What is exported (``module(input) -> output``)."""
    input: Literal["image", "tokens"]
    """What it takes: normalised images ``(B, C, H, W)`` or token ids ``(B, L)`` of the family's
    tokenizer."""
    output: str
    """Name of the output (``logits``, ``image_embeds``, ...)."""
    description: str
    """What the output is, for ``export.json``."""
    reference: Callable[[torch.Tensor], torch.Tensor] | None = None
    """The eager function the written graph is checked against; None = ``module`` itself."""


@dataclass
class Serving:
    """The graphs of a trained model and what a server needs besides them."""

    graphs: list[ServingGraph]
    info: dict[str, Any] = field(default_factory=dict)
    """Entries of ``export.json`` the family adds (CLIP: ``embedding_dim``, ``logit_scale``)."""
    text_length: int | None = None
    """Most tokens the text graph takes (None: no text graph)."""


def classifier_serving(model: nn.Module) -> Serving:
    """The default serving: one graph, normalised images -> class logits."""
    return Serving([ServingGraph("image", model, "image", "logits", "class logits (B, num_classes); softmax gives probabilities")])


# ----------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class FamilySpec:
    """A model family: registered once (``register_family`` in its package's ``__init__.py``); every
    other part of vitscale asks it."""

    name: str
    """Family name: ``vit``, ``clip``, ``volo``."""
    model_cls: type
    """``model_cls(cfg, device=None, dtype=None)`` builds the model (a :class:`~vitscale.models.contract.Model`);
    ``init_weights()`` initialises it."""
    variants: dict[str, Any]
    """Variant name -> frozen config dataclass."""
    parallel_plan: Any
    """The family's :class:`vitscale.distributed.parallelize.ParallelPlan`: its TP
    plan, the checks a layout must pass (``check_tp``), its blocks."""
    task: str = "classification"
    """The task this family trains with by default (classification, contrastive, ...)."""
    adapters: Mapping[str, StateDictAdapter] = field(default_factory=dict)
    """Library (``timm``, ``open_clip``) -> the family's :class:`StateDictAdapter` to it."""
    tokenizer: Callable[..., Tokenizer] | None = None
    """``create(context_length=None) -> Tokenizer`` for families that read text
    (None: no text). The run hands it to the data layer; export describes it."""
    flops: Callable[[Any, tuple[int, int], bool], int] | None = None
    """``flops(cfg, (h, w), training) -> int``: the family's own count of
    :meth:`forward_flops` (e.g. analytic); None = traced by PyTorch's FlopCounterMode on the meta device."""
    memory: MemoryModel | None = None
    """The family's :class:`MemoryModel`; None = measured on the meta device
    (:class:`vitscale.models.memory.MeasuredMemory`)."""
    serving: Callable[[nn.Module], Serving] | None = None
    """``serving(model) -> Serving``: the graphs ``vitscale export`` writes; None =
    one image graph of class logits (:func:`classifier_serving`)."""
    recognizes: Callable[[Mapping[str, Any]], bool] | None = None
    """``recognizes(state_dict) -> bool``: whether a state dict's names (as for
    :attr:`StateDictAdapter.recognizes`; a predicate may read the shapes too) are this family's own
    (vitscale's) naming — how the format of a file without vitscale metadata is told
    (with the adapters' ``recognizes``). None: never recognised by its names."""
    architecture: Callable[[Mapping[str, torch.Tensor]], Mapping[str, Any]] | None = None
    """``architecture(state_dict) -> {field: value}``: the config fields a state
    dict in our naming shows (``hidden_size``, ``num_layers``, nested ones as ``vision.hidden_size``),
    in the order they are compared with the run's model config (``checkpoint.init_from``; the first
    that differs is named). ``num_classes`` and the image size are read but never compared (the
    classifier is re-initialised, position embeddings resampled). None: only the shapes are checked."""
    layer_decay: Callable[[nn.Module], Mapping[str, int]] | None = None
    """``exponents(model) -> {parameter name or prefix: k}``: how many times
    ``optim.layer_decay`` multiplies each parameter's LR (BEiT / timm: the embeddings ``L + 1``, block
    ``i`` ``L - i``; a name matched by no prefix: 0, the head). None: the family refuses
    ``optim.layer_decay``."""

    def variant_config(self, name: str, overrides: Mapping[str, Any] | None = None) -> Any:
        """Variant ``name``'s config with ``overrides`` applied (:func:`replace_config`: TypeError naming
        the closest field for a misspelt one; the config's own checks raise ValueError)."""
        return replace_config(self.variants[name], dict(overrides or {}))

    def plan(self) -> Any:
        """The family's :class:`vitscale.distributed.parallelize.ParallelPlan`."""
        return self.parallel_plan

    def adapter(self, library: str) -> StateDictAdapter:
        """The family's adapter to ``library``; NotImplementedError (one line) if it has none."""
        adapter = self.adapters.get(library)
        if adapter is None:
            others = ", ".join(sorted(self.adapters)) or "none"
            raise NotImplementedError(f"no {library} adapter for family {self.name} (its adapters: {others})")
        return adapter

    def create_tokenizer(self, context_length: int | None = None) -> Tokenizer:
        """The family's text tokenizer (``context_length`` tokens per text; None: its default)."""
        if self.tokenizer is None:
            raise NotImplementedError(f"family {self.name} reads no text: it has no tokenizer")
        return self.tokenizer(context_length=context_length)

    def forward_flops(self, cfg: Any, img_size: int | tuple[int, int] | None = None, *, training: bool = False) -> int:
        """Forward FLOPs of one sample of the variant config ``cfg`` at ``img_size`` (None = the
        config's): every matmul, attention scores and attention x values included, 2 FLOPs per
        multiply-add, elementwise work not counted. ``training``: the forward as a training step runs
        it (patch dropout keeps only its share of the patch tokens); else as inference runs it (every
        patch). One sample of a CLIP is one image and one caption."""
        hw = (cfg.img_h, cfg.img_w) if img_size is None else image_hw(img_size)
        if self.flops is not None:
            return int(self.flops(cfg, hw, training))
        if hw != (cfg.img_h, cfg.img_w):
            cfg = cfg.with_image_size(*hw)
        return traced_flops(self.model_cls, cfg, training=training)

    def memory_model(self) -> MemoryModel:
        """The family's memory model (the measured default when it names none)."""
        if self.memory is None:
            from .memory import MeasuredMemory

            return MeasuredMemory()
        return self.memory

    def serving_graphs(self, model: nn.Module) -> Serving:
        """The graphs ``vitscale export`` writes of ``model`` (in eval mode, with its weights)."""
        return classifier_serving(model) if self.serving is None else self.serving(model)

    def recognizes_own(self, keys: Collection[str]) -> bool:
        """Whether ``keys`` are this family's own naming (False for a family that declares none)."""
        return self.recognizes is not None and bool(self.recognizes(keys))

    def architecture_of(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """The config fields ``state_dict`` (our naming) shows (empty for a family that declares none)."""
        return {} if self.architecture is None else dict(self.architecture(state_dict))

    def layer_decay_exponents(self, model: nn.Module) -> dict[str, int]:
        """``{name or prefix: exponent}`` of ``optim.layer_decay`` (NotImplementedError, one line, for a
        family that declares none)."""
        if self.layer_decay is None:
            raise NotImplementedError(f"family {self.name} declares no layers for optim.layer_decay")
        return dict(self.layer_decay(model))


__all__ = [
    "FamilySpec", "MemoryModel", "Serving", "ServingGraph", "StateDictAdapter", "Tokenizer", "classifier_serving",
    "is_library_model", "keys_have", "replace_config",
]  # fmt: skip
