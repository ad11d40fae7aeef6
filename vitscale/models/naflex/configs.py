"""NaFlex ViT configuration (a :class:`ViTConfig` plus its position-embedding grid) and the variant table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..vit.configs import ViTConfig

POS_EMBED_TYPES = ("learned", "factorized")
POS_EMBED_INTERPS = ("bicubic", "bilinear")
ATTN_IMPLS = ("sdpa", "flex")


@dataclass(frozen=True)
class NaFlexConfig(ViTConfig):
    """A ViT that takes variable-length patch sequences at native aspect ratio (NaViT, arXiv
    2307.06304; FlexiViT, arXiv 2212.08013; SigLIP 2's NaFlex, arXiv 2502.14786), as timm's
    ``NaFlexVit`` (``timm/models/naflexvit.py``) and big_vision's ``naflex_vit.py``.

    Every :class:`ViTConfig` field means the same here; the image size (``img_h``, ``img_w``) is only
    the default for plain image batches and ``example_inputs``: a NaFlex batch brings each image's own
    patch grid, to which the learned grid of ``pos_embed_grid`` is resampled.
    """

    class_token_length: int = 0
    """Learnable prefix tokens: 0 = none (timm's NaFlex default), 1 = a class token (``class_token``)
    or one register, more = class token and registers or registers only."""
    pool: str = "map"
    """Head pooling over the valid patch tokens: ``map`` (timm's NaFlex default), ``avg``, ``token`` or
    ``none``. Padding tokens never enter the pool."""
    pos_embed_prefix: bool = False
    """Always False: NaFlex prefix tokens take no position embedding (timm's ``NaFlexEmbeds``; a classic
    checkpoint's prefix embeddings are folded into the tokens on loading, which computes the same)."""
    pos_embed_grid: tuple[int, int] | None = None
    """Rows and columns ``(gh, gw)`` of the learned position-embedding grid (timm
    ``pos_embed_grid_size``, big_vision ``posemb="learn_2d(n)"``); None = the patch grid of
    ``img_h x img_w``, which the model writes into its ``cfg`` when it is built (a weight shape: a later
    image size leaves it as it is)."""
    pos_embed_type: Literal["learned", "factorized"] = "learned"
    """``learned``: one embedding per grid cell ``(1, gh, gw, D)``; ``factorized``: a row and a column
    table ``(1, gh, D)`` + ``(1, gw, D)`` summed (NaViT's factorized embeddings; timm ``pos_embed``)."""
    pos_embed_interp: Literal["bicubic", "bilinear"] = "bicubic"
    """How the learned grid is resampled to an image's grid (antialiased when shrinking, as timm;
    SigLIP 2 / big_vision: ``bilinear``). Factorized tables are always resampled linearly."""
    pos_embed_ar_preserving: bool = False
    """Resample the grid to a square of the image grid's longer side, then crop (timm
    ``pos_embed_ar_preserving``): each row / column keeps its embedding whatever the aspect ratio."""
    attn_impl: Literal["sdpa", "flex"] = "sdpa"
    """Masked attention of NaFlex batches: ``sdpa`` (``F.scaled_dot_product_attention`` with a boolean
    key mask) or ``flex`` (FlexAttention with a block mask, compiled; torch >= 2.5; no attention
    dropout). Plain image batches need no mask and always take SDPA's unmasked path."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pos_embed != "learned":
            raise ValueError(f"pos_embed={self.pos_embed!r}: a NaFlex ViT has learned position embeddings (pos_embed_type)")
        if self.pos_embed_sincos:
            raise ValueError("pos_embed_sincos=True: a NaFlex ViT's position table is learned (pos_embed_type); use a ViT")
        if self.mask_token:
            raise ValueError("mask_token=True: a NaFlex ViT gives no tokens (model(x, tokens=True, mask=...)); use a ViT")
        grid = self.pos_embed_grid
        if grid is not None:  # a YAML list or one side -> (gh, gw)
            grid = tuple(int(g) for g in ((grid, grid) if isinstance(grid, int) else grid))
            if len(grid) != 2 or min(grid) < 1:
                raise ValueError(f"pos_embed_grid must be two positive sides (gh, gw), got {self.pos_embed_grid!r}")
            object.__setattr__(self, "pos_embed_grid", grid)
        if self.pos_embed_prefix:
            raise ValueError("a NaFlex ViT gives its prefix tokens no position embedding: pos_embed_prefix must be False")
        if self.patch_init != "normal":
            raise ValueError("patch_init: a NaFlex ViT's patch projection is a Linear, initialised as every other (normal)")
        if self.pos_embed_type not in POS_EMBED_TYPES:
            raise ValueError(f"pos_embed_type must be one of {POS_EMBED_TYPES}, got {self.pos_embed_type!r}")
        if self.pos_embed_interp not in POS_EMBED_INTERPS:
            raise ValueError(f"pos_embed_interp must be one of {POS_EMBED_INTERPS}, got {self.pos_embed_interp!r}")
        if self.attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl must be one of {ATTN_IMPLS}, got {self.attn_impl!r}")
        if self.attn_impl == "flex" and self.attention_dropout:
            raise ValueError("attn_impl=flex has no attention dropout: set attention_dropout=0 or attn_impl=sdpa")
        if self.drop_patch_rate:
            raise ValueError("a NaFlex ViT has no patch dropout (drop_patch_rate must be 0): its batches come padded")

    @property
    def pos_grid(self) -> tuple[int, int]:
        """The position-embedding grid: ``pos_embed_grid``, or the patch grid of ``img_h x img_w``."""
        return self.pos_embed_grid if self.pos_embed_grid is not None else self.grid

    @property
    def patch_features(self) -> int:
        """Length of one flattened patch, ``patch_dim * patch_dim * num_channels`` (``(ph, pw, C)`` order)."""
        return self.patch_dim * self.patch_dim * self.num_channels


def _naflex(hidden, ffn, heads, layers, **kw) -> NaFlexConfig:
    return NaFlexConfig(
        hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads, num_layers=layers, **kw
    )  # fmt: skip


# timm 1.0.31 ``timm/models/naflexvit.py`` registrations (``naflexvit_*``): patch 16, a 16x16 learned
# grid (``pos_embed_grid_size``), 384 px default input (its ``_cfg``). The two SigLIP 2 towers follow
# big_vision's NaFlex ViT (arXiv 2502.14786): bilinear grid resampling, tanh-GELU, MAP head.
_B16 = dict(patch_dim=16, img_h=384, img_w=384, pos_embed_grid=(16, 16))
_REG4_GAP = dict(_B16, layer_scale_init=1e-5, pool="avg", class_token=False, class_token_length=4, fc_norm=True)
_SO150M2 = dict(_B16, layer_scale_init=1e-5, qkv_bias=False, class_token=False, class_token_length=1)
_SIGLIP = dict(_B16, activation="gelu_tanh", pool="map", pos_embed_interp="bilinear", num_classes=0)

VARIANTS: dict[str, NaFlexConfig] = {
    # tiny, for tests: 2 blocks of width 64, patch 8, a 4x4 grid (32 px), one register, average pool
    "naflex_debug": _naflex(
        64, 128, 4, 2, patch_dim=8, img_h=32, img_w=32, num_classes=10, pool="avg", class_token=False,
        class_token_length=1,
    ),
    # naflexvit_base_patch16_gap: B/16, LayerScale 1e-5, 4 registers, average pool with fc_norm
    "naflex_b16_gap": _naflex(768, 3072, 12, 12, **_REG4_GAP),
    # naflexvit_base_patch16_par_gap: the same, aspect-ratio preserving grid resampling
    "naflex_b16_par_gap": _naflex(768, 3072, 12, 12, **_REG4_GAP, pos_embed_ar_preserving=True),
    # naflexvit_base_patch16_parfac_gap: the same, factorized position embeddings
    "naflex_b16_parfac_gap": _naflex(
        768, 3072, 12, 12, **_REG4_GAP, pos_embed_ar_preserving=True, pos_embed_type="factorized"
    ),
    # naflexvit_base_patch16_map: B/16, LayerScale 1e-5, one register, MAP head
    "naflex_b16_map": _naflex(
        768, 3072, 12, 12, **_B16, layer_scale_init=1e-5, pool="map", class_token=False, class_token_length=1
    ),
    # naflexvit_so150m2_patch16_reg1_gap / _map: width 832, 21 blocks, 13 heads, MLP 2176 (34/13 x 832)
    "naflex_so150m2_16_reg1_gap": _naflex(832, 2176, 13, 21, **_SO150M2, pool="avg", fc_norm=True),
    "naflex_so150m2_16_reg1_map": _naflex(832, 2176, 13, 21, **_SO150M2, pool="map"),
    # naflexvit_base_patch16_siglip: the SigLIP 2 B/16 NaFlex image tower
    "naflex_b16_siglip": _naflex(768, 3072, 12, 12, **_SIGLIP),
    # naflexvit_so400m_patch16_siglip: the SigLIP 2 So400m/16 NaFlex tower (width 1152, MLP 4304, 27 blocks)
    "naflex_so400m16_siglip": _naflex(1152, 4304, 16, 27, **_SIGLIP),
}  # fmt: skip

__all__ = ["NaFlexConfig", "VARIANTS"]
