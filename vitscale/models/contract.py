"""The model contract: what every family's model offers, and all that callers may rely on.

A registered family's model class implements :class:`Model` (``tests/unit/test_model_contract.py``
checks every family). The trainer, the tasks, evaluation, the bench and ``label-tokens`` use these
members directly — never ``hasattr`` probes. What a family offers besides its model (FLOP count,
memory model, adapters, tokenizer, serving graphs) its :class:`~vitscale.models.spec.FamilySpec` says. A capability a family lacks
is declared (``supports_dense = False``) and its method raises ``NotImplementedError`` naming the
family, as torchtitan's model protocol (``torchtitan/protocols/model.py``) makes every model state
what it offers.

Dense per-token logits (token labeling) are asked through the module call,
``model(images, dense=True, mix=mix)``, not through ``forward_dense``, and the pre-logits features
(probes) as ``model(images, pre_logits=True)``, not through ``forward_head``: under FSDP2 only the
call runs the root module's hooks that gather its parameters.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


class TokenMixLike(Protocol):
    """A MixToken box (:class:`vitscale.models.common.token_mix.TokenMix`)."""

    box: tuple[int, int, int, int]
    perm: torch.Tensor


@runtime_checkable
class VariantConfig(Protocol):
    """What every family's frozen config dataclass offers besides its own fields."""

    @property
    def img_h(self) -> int: ...
    @property
    def img_w(self) -> int: ...
    @property
    def num_channels(self) -> int: ...
    @property
    def patch_dim(self) -> int: ...
    def with_image_size(self, img_h: int, img_w: int | None = None) -> Any:
        """The same config for another input size."""
        ...


@runtime_checkable
class Model(Protocol):
    """The uniform API of every zoo model (an ``nn.Module``; timm's names where timm has one)."""

    cfg: Any
    """The frozen config dataclass the model was built from (a :class:`VariantConfig`)."""
    num_classes: int
    """Outputs of the classifier; 0 = no classifier (features only)."""
    supports_dense: bool
    """Whether ``model(images, dense=True, mix=...)`` gives per-token class logits (token labeling)."""
    input_modes: tuple[str, ...]
    """The inputs the model takes, from :data:`INPUT_MODES` (a class attribute: ask the family's
    ``model_cls`` before building a model; :func:`check_input_mode` refuses the others in one line)."""

    def init_weights(self) -> None:
        """(Re)initialise every parameter and buffer in place; works after ``to_empty()`` and on
        sharded parameters."""
        ...

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``(B, C, H, W)`` -> normalised tokens ``(B, T, D)``."""
        ...

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens -> logits (or the pooled features with ``pre_logits``; run
        ``forward_head(forward_features(x), pre_logits=True)`` as ``model(x, pre_logits=True)``)."""
        ...

    def no_weight_decay(self) -> set[str]:
        """Parameter names (or prefixes) that take no weight decay besides norms and biases."""
        ...

    def head_parameter_names(self) -> set[str]:
        """The classifier's parameters (``optim.head_weight_decay`` applies to them)."""
        ...

    def reset_classifier(self, num_classes: int) -> None:
        """A new classifier with ``num_classes`` outputs (0 removes it)."""
        ...

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in backward (single-device; the trainer applies
        activation checkpointing from outside through the family's parallelize plan)."""
        ...

    def example_inputs(self, batch: int, device: Any = None) -> tuple[torch.Tensor, ...]:
        """Random inputs of the right shapes for one ``model(*inputs)`` call."""
        ...

    def token_grid(self, img_hw: tuple[int, int]) -> tuple[int, int]:
        """The grid ``(gh, gw)`` of the dense per-token logits for images of ``img_hw``."""
        ...

    def forward_dense(self, x: torch.Tensor, mix: TokenMixLike | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Class logits ``(B, classes)`` and per-token logits ``(B, gh, gw, classes)``, with MixToken
        ``mix`` applied to the tokens (run it as ``model(x, dense=True, mix=mix)``)."""
        ...


INPUT_MODES: dict[str, str] = {
    "fixed": "images of one size per run (the configured img_h x img_w)",
    "multi": "images of another size in every batch",
    "naflex": "NaFlex patch sequences at native aspect ratio (patches, patch_coord, patch_valid)",
}
"""Input modes a model may state in ``input_modes``; every model takes ``fixed``. ``multi``: any
multiple of the patch size, the position embeddings resampled to each batch's grid (data.image_sizes);
``naflex``: a dict batch of :mod:`vitscale.models.naflex.patches` (data.seq_lens)."""


def check_input_mode(model: Any, mode: str, setting: str, name: str | None = None) -> None:
    """ConfigError naming what the model takes when it cannot take ``mode`` (a key of
    :data:`INPUT_MODES`) that ``setting`` asks for. ``model``: a model, or its class (a family's
    ``model_cls``, to ask before building); ``name``: the variant name for the message."""
    from vitscale.errors import ConfigError

    if mode not in INPUT_MODES:
        raise ValueError(f"unknown input mode {mode!r}: one of {', '.join(INPUT_MODES)}")
    cls = model if isinstance(model, type) else type(model)
    if mode in cls.input_modes:
        return
    from .registry import families

    able = sorted(f.name for f in families().values() if mode in f.model_cls.input_modes)
    what = " or ".join(INPUT_MODES[m] for m in cls.input_modes)
    raise ConfigError(
        f"{setting} needs {INPUT_MODES[mode]}, which {name or cls.__name__} ({cls.__name__}) cannot take: it takes "
        f"{what}; families that can: {', '.join(able) or 'none'}"
    )


def contract_members() -> list[str]:
    """The names :class:`Model` requires: its attributes, then its methods."""
    methods = [n for n, v in vars(Model).items() if callable(v) and not n.startswith("_")]
    return [*Model.__annotations__, *methods]


def check_model(model: nn.Module) -> None:
    """TypeError naming every contract member ``model`` lacks (a new family's first check)."""
    missing = [name for name in contract_members() if not hasattr(model, name)]
    if missing:
        raise TypeError(f"{type(model).__name__} does not implement the model contract: missing {', '.join(missing)}")


__all__ = ["INPUT_MODES", "Model", "TokenMixLike", "VariantConfig", "check_input_mode", "check_model", "contract_members"]
