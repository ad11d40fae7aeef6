"""Config group ``mae`` of masked-autoencoder pretraining (``train.task=mae``, :mod:`vitscale.tasks.mae`).

A field of the MAE task's run config (:class:`MaePretrainingConfig`, ``MaeTask.config``). The
defaults are the paper's (He et al. 2021, arXiv 2111.06377) as its reference code sets them
(facebookresearch/mae at efb2a80: ``main_pretrain.py``, ``models_mae.py``, ``PRETRAIN.md``); a small
recipe sets its own decoder (``configs/digits_mae.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from vitscale.config.schema import Config


@dataclass
class MaeConfig:
    """MAE: which patches the encoder sees, the light decoder that predicts the others, the target."""

    RANGES: ClassVar[dict[str, tuple]] = {"mask_ratio": (0.0, 1.0), "decoder_width": (1, 1 << 16), "decoder_depth": (1, 1024), "decoder_heads": (1, 1024), "decoder_mlp_ratio": (0.0, 64.0)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    mask_ratio: float = 0.75
    """Fraction of each image's patches removed before the encoder, drawn per sample (facebookresearch/mae
    ``main_pretrain.py`` line 53, ``--mask_ratio`` default 0.75; the paper's section 4, Figure 5). The
    encoder sees ``int(N * (1 - mask_ratio))`` patches (``models_mae.py`` line 130); must lie in (0, 1)."""
    norm_pix_loss: bool = True
    """Targets are each patch's pixels normalised by that patch's mean and variance
    (``models_mae.py`` lines 205-208, ``(x - mean) / (var + 1e-6) ** 0.5``); the reference recipe turns
    it on (``PRETRAIN.md`` line 11, ``--norm_pix_loss``: "for better representation learning"; its code
    default, ``main_pretrain.py`` line 58, is off). False: the raw (normalised-image) pixels."""
    decoder_width: int = 512
    """Width of the decoder's tokens (``models_mae.py`` line 27, ``decoder_embed_dim=512``)."""
    decoder_depth: int = 8
    """Transformer blocks of the decoder (``models_mae.py`` line 27, ``decoder_depth=8``)."""
    decoder_heads: int = 16
    """Attention heads of the decoder's blocks (``models_mae.py`` line 27, ``decoder_num_heads=16``)."""
    decoder_mlp_ratio: float = 4.0
    """MLP hidden width of the decoder's blocks over ``decoder_width`` (``models_mae.py`` line 227,
    ``mlp_ratio=4``: MAE's decoder blocks take the encoder's ratio, lines 39-40 and 53-54, 4 in every
    published model; a backbone of another ratio sets its own, as ``configs/digits_mae.yaml``)."""

    def __post_init__(self):
        if not 0.0 < self.mask_ratio < 1.0:
            raise ValueError(f"mask_ratio={self.mask_ratio} must lie in (0, 1): the fraction of patches removed "
                             "(MAE: 0.75)")  # fmt: skip
        for key in ("decoder_width", "decoder_depth", "decoder_heads"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 1")
        if self.decoder_width % self.decoder_heads:
            raise ValueError(
                f"decoder_width={self.decoder_width} must be divisible by decoder_heads={self.decoder_heads}"
            )
        if self.decoder_mlp_ratio <= 0:
            raise ValueError(f"decoder_mlp_ratio={self.decoder_mlp_ratio} must be > 0")


@dataclass
class MaePretrainingConfig(Config):
    """A whole run of ``train.task=mae``: the common groups and ``mae``."""

    mae: MaeConfig = field(default_factory=MaeConfig)
    """Masked-autoencoder pretraining: mask ratio, pixel-loss normalisation, the decoder."""
