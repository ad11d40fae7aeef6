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
call runs the root module's hooks that gather its parameters. So are a backbone's tokens
(self-supervised tasks: DINO, MAE), ``model(images, tokens=True, keep=..., mask=...)`` ->
:class:`Tokens`, and the tokens of its last blocks (DINOv2's linear probe), ``model(images,
intermediates=n)``; ``supports_tokens`` / ``supports_intermediates`` declare them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from torch.utils import _pytree as pytree


@dataclass
class Tokens:
    """A backbone's tokens for images ``(B, C, H, W)``, from ``model(images, tokens=True, keep=keep,
    mask=mask)`` (:meth:`Model.forward_tokens`), each normalised as the backbone normalises: by its
    final ``norm``, or by ``fc_norm`` where it normalises after pooling (``pool=avg``), as DINOv2's
    ``x_norm_clstoken`` / ``x_norm_patchtokens`` (facebookresearch/dinov2,
    ``dinov2/models/vision_transformer.py``, ``forward_features``). ``K`` is the patch count ``N``
    (``gh * gw``), or ``keep``'s."""

    pooled: torch.Tensor
    """``(B, D)``: the pooled, normalised features exactly as ``model(images, pre_logits=True)`` gives
    them — the class token (``pool=token``), ``fc_norm`` of the mean patch token (``avg``), the
    attention pool's output (``map``); with ``pool=none`` every token's ``(B, P + K, D)``."""
    prefix: torch.Tensor
    """``(B, P, D)``: the prefix tokens (class token, registers, a distillation token), normalised."""
    patches: torch.Tensor
    """``(B, K, D)``: the patch tokens (the kept ones with ``keep``, in its order), normalised."""
    sequence: torch.Tensor
    """``(B, P + K, D)``: the blocks' output through the final ``norm`` (not ``fc_norm``), prefix first:
    what ``forward_features`` gives (a model that normalises after pooling: not normalised; MAE's
    decoder reads ``prefix`` and ``patches``, :func:`vitscale.tasks.mae.encoded`)."""
    grid: tuple[int, int]
    """The patch grid ``(gh, gw)`` of the images (``keep`` and ``mask`` index it row-major)."""
    num_prefix: int
    """``P``: the prefix tokens before the patches in ``sequence``."""


# A pytree node (tensors as leaves, grid and prefix count as context): FSDP2 finds a module call's
# output tensors by flattening the output (its pre-backward hooks, which gather the parameters again
# for backward), and torch.compile traces through it.
pytree.register_pytree_node(
    Tokens,
    lambda t: ([t.pooled, t.prefix, t.patches, t.sequence], (t.grid, t.num_prefix)),
    lambda values, context: Tokens(*values, *context),
    serialized_type_name="vitscale.models.contract.Tokens",
)


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
    supports_tokens: bool
    """Whether ``model(images, tokens=True, keep=None, mask=None)`` gives its :class:`Tokens`
    (:meth:`forward_tokens`; self-supervised pretraining: DINO, MAE)."""
    supports_intermediates: bool
    """Whether ``model(images, intermediates=n)`` gives the normalised tokens of its last ``n`` blocks
    (:meth:`forward_intermediates`; DINOv2's linear-probe features). A model that declares it has a
    ViT config: ``cfg.num_layers`` blocks, ``cfg.num_prefix_tokens`` prefix tokens, the first a class
    token when ``cfg.class_token`` and ``cfg.class_token_length > 0``."""
    distill_head: bool
    """Whether ``model(images, distill=True)`` gives ``(class logits, distillation logits)`` from a
    distillation token of its own (DeiT); False: distillation losses use the class logits."""
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

    def forward_tokens(self, x: torch.Tensor, keep: torch.Tensor | None = None,
                       mask: torch.Tensor | None = None) -> Tokens:  # fmt: skip
        """Images ``(B, C, H, W)`` -> the backbone's :class:`Tokens` (run it as ``model(x, tokens=True,
        keep=keep, mask=mask)``). ``keep`` ``(B, K)``: indices (row-major in the patch grid) of the
        patches that go through the blocks, after their position embeddings (MAE's encoder); None:
        every patch (patch dropout applies in training, as in a plain call: pass every index to
        bypass it). ``mask`` ``(B, N)`` bool: the masked patches' embeddings replaced by the model's
        own ``mask_token`` parameter before the position embeddings are added (iBOT, DINOv2's
        ``prepare_tokens_with_masks``); a model built without a mask token refuses a mask."""
        ...

    def forward_intermediates(self, x: torch.Tensor, blocks: int) -> list[torch.Tensor]:
        """Images -> the normalised tokens ``(B, prefix + patches, D)`` after each of the last ``blocks``
        blocks, oldest first (run it as ``model(x, intermediates=blocks)``)."""
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


__all__ = ["INPUT_MODES", "Model", "TokenMixLike", "Tokens", "VariantConfig", "check_input_mode", "check_model", "contract_members"]
