"""CLIP's serving graphs (its ``FamilySpec.serving``): the image tower and the text tower apart.

``vitscale export`` writes one graph each: images -> L2-normalised image embeddings, token ids ->
L2-normalised text embeddings (open_clip's ``encode_image`` / ``encode_text`` with ``normalize=True``),
and records the embedding width and the learned logit scale beside them.
"""

from __future__ import annotations

import torch
from torch import nn

from ..spec import Serving, ServingGraph
from .model import CLIP


class ClipImageEncoder(nn.Module):
    """CLIP's image tower alone (``visual`` + ``image_proj``): images -> L2-normalised embeddings."""

    def __init__(self, clip: CLIP):
        super().__init__()
        self.visual, self.image_proj = clip.visual, clip.image_proj

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return CLIP.encode_image(self, images, normalize=True)  # the model's own method, on these submodules only


class ClipTextEncoder(nn.Module):
    """CLIP's text tower alone (``text`` + ``text_proj``): token ids -> L2-normalised embeddings."""

    def __init__(self, clip: CLIP):
        super().__init__()
        self.text, self.text_proj = clip.text, clip.text_proj

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return CLIP.encode_text(self, tokens, normalize=True)


def serving(model: CLIP) -> Serving:
    """The image and text graphs of a trained CLIP, its embedding width and logit scale."""
    with torch.no_grad():
        scale = float(model.get_logit_scale())
    image = ServingGraph("image", ClipImageEncoder(model), "image", "image_embeds",
                         "L2-normalised image embedding (B, output_dim)", lambda x: model.encode_image(x, normalize=True))  # fmt: skip
    text = ServingGraph("text", ClipTextEncoder(model), "tokens", "text_embeds",
                        "L2-normalised text embedding (B, output_dim)", lambda t: model.encode_text(t, normalize=True))  # fmt: skip
    info = {"embedding_dim": int(model.cfg.output_dim), "logit_scale": scale}
    return Serving([image, text], info, text_length=int(model.cfg.text.encoder_seq_length))


__all__ = ["ClipImageEncoder", "ClipTextEncoder", "serving"]
