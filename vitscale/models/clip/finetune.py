"""What fine-tuning asks of the CLIP family (its ``FamilySpec`` slots): whether a state dict's names
are vitscale's CLIP naming, which architecture a state dict shows, the layers of layer-wise LR
decay; and open_clip's tower locks (``lock_image_tower`` / ``lock_text_tower`` on the model)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..spec import keys_have
from ..vit.finetune import _block_count, vit_architecture, vit_layer_exponents

RECOGNIZES = keys_have("visual.patch_embed.proj.weight")
"""vitscale's CLIP naming (open_clip's: ``visual.conv1.weight``)."""


def architecture(sd: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The :class:`~vitscale.models.clip.configs.CLIPConfig` fields a CLIP state dict (our naming)
    shows: the image tower's as ``vision.*`` (its image size resampled), the text tower's as
    ``text.*``, the embedding width."""
    out: dict[str, Any] = {}
    vision = vit_architecture(sd, "visual.")
    vision.pop("num_classes", None)
    out.update({f"vision.{k}": v for k, v in vision.items()})
    tok = sd.get("text.token_embedding.weight")
    if tok is not None:  # (vocab, D)
        out.update({"text.hidden_size": int(tok.shape[1]), "text.vocab_size": int(tok.shape[0])})
    layers = _block_count(sd, "text.blocks.")
    if layers is not None:
        out["text.num_layers"] = layers
    fc1 = sd.get("text.blocks.0.mlp.fc1.weight")
    if fc1 is not None:
        out["text.ffn_hidden_size"] = int(fc1.shape[0])
    pos = sd.get("text.pos_embed")
    if pos is not None:  # (1, T, D): the context is not resampled
        out["text.encoder_seq_length"] = int(pos.shape[1])
    proj = sd.get("image_proj.weight")
    if proj is not None:  # (E, D)
        out["output_dim"] = int(proj.shape[0])
    return out


def layer_decay(model: nn.Module) -> dict[str, int]:
    """Layer-wise LR decay of each tower by its own depth (the image tower as a ViT; the text tower's
    token and position embeddings ``L + 1`` times, block ``i`` ``L - i`` times); the projections,
    the final norms and the temperature are not decayed."""
    out = vit_layer_exponents(model.visual, "visual.")
    L = len(model.text.blocks)
    out.update({"text.token_embedding": L + 1, "text.pos_embed": L + 1})
    out.update({f"text.blocks.{i}": L - i for i in range(L)})
    return out


__all__ = ["RECOGNIZES", "architecture", "layer_decay"]
