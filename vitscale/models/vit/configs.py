"""ViT configuration (NeMo field names) and the variant table."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..common.rope import ROPE_TYPES

POOLS = ("token", "avg", "map", "none")
NORMS = ("layernorm", "rmsnorm")
PATCH_INITS = ("normal", "fan_in")
POS_EMBEDS = ("learned", "rope", "none")
MLP_TYPES = ("mlp", "swiglu")


@dataclass(frozen=True)
class ViTConfig:
    """A Vision Transformer. Field names follow NeMo's ViT config where NeMo has the field."""

    img_h: int = 224
    """Input image height in pixels (NeMo ``img_h``)."""
    img_w: int = 224
    """Input image width in pixels (NeMo ``img_w``)."""
    patch_dim: int = 16
    """Side of the square patches (NeMo ``patch_dim``)."""
    num_channels: int = 3
    """Input image channels (NeMo ``num_channels``)."""
    num_layers: int = 12
    """Transformer blocks (NeMo ``num_layers``)."""
    hidden_size: int = 768
    """Token width (NeMo ``hidden_size``)."""
    ffn_hidden_size: int = 3072
    """MLP hidden width (NeMo ``ffn_hidden_size``)."""
    num_attention_heads: int = 12
    """Attention heads (NeMo ``num_attention_heads``)."""
    hidden_dropout: float = 0.0
    """Dropout on embeddings and on the attention / MLP outputs (NeMo ``hidden_dropout``)."""
    attention_dropout: float = 0.0
    """Dropout on the attention probabilities (NeMo ``attention_dropout``)."""
    num_classes: int = 1000
    """Classifier outputs; 0 removes the classifier (features only)."""
    drop_path_rate: float = 0.0
    """Stochastic depth: the last block drops its branches with this rate, the first with 0 (rising
    linearly; ``drop_path_constant``: every block with this rate)."""
    drop_path_constant: bool = False
    """Every block drops its branches with ``drop_path_rate`` (DeiT III, facebookresearch/deit
    ``models_v2.py``: ``dpr_constant=True``) instead of the linear rise from 0 (timm)."""
    drop_patch_rate: float = 0.0
    """Patch dropout: fraction of patch tokens dropped during training (NeMo CLIP ``drop_patch_rate``)."""
    class_token_length: int = 1
    """Learnable prefix tokens: 0 = none, 1 = a class token, >1 = class token plus registers."""
    class_token: bool = True
    """Whether the first prefix token is a class token. False: all ``class_token_length`` prefix tokens
    are register tokens (timm ``class_token=False, reg_tokens=N``). The model computes the same either
    way; the flag names the tokens for conversion and rules out ``pool='token'``."""
    pool: str = "token"
    """Head pooling: ``token`` (first prefix token), ``avg`` (mean of patch tokens, the pooled
    classifier), ``map`` (multihead attention pooling) or ``none`` (all tokens)."""
    fc_norm: bool | None = None
    """Apply the final LayerNorm after pooling instead of before; None = only for ``avg`` pooling."""
    final_norm: bool = True
    """A LayerNorm after the last block (or after pooling with ``fc_norm``)."""
    pre_norm: bool = False
    """A LayerNorm on the embedded tokens before the first block (CLIP's ``ln_pre``)."""
    pre_logits: bool = False
    """NeMo's classify head: a hidden->hidden Linear + tanh before the classifier."""
    head_dropout: float = 0.0
    """Dropout on the pooled features before the classifier."""
    head_bias_init: float = 0.0
    """Initial classifier bias (e.g. -6.9 for sigmoid cross-entropy over many classes)."""
    parallel_block: bool = False
    """ViT-22B block: attention and MLP in parallel from one LayerNorm, QKV and fc1 fused into one
    matmul, the two output projections fused into another."""
    qk_norm: bool = False
    """LayerNorm on queries and keys before the dot product (ViT-22B)."""
    qkv_bias: bool = True
    """Bias on the QKV projection (ViT-22B: False)."""
    proj_bias: bool = True
    """Bias on the attention output projection."""
    mlp_bias: bool = True
    """Bias on the MLP layers (ViT-22B keeps them)."""
    norm_type: str = "layernorm"
    """Every norm of the model (blocks, QK norms, pre / final / fc norm, MAP head): ``layernorm`` or
    ``rmsnorm`` (root-mean-square norm with a scale only, as timm's ``RmsNorm``)."""
    norm_bias: bool = True
    """LayerNorms with a bias (ViT-22B: False); an RMSNorm never has one."""
    patch_bias: bool = True
    """Bias on the patch-embedding projection (OpenAI CLIP: False)."""
    patch_init: str = "normal"
    """Initialisation of the patch-embedding projection: ``normal`` (truncated normal, std 0.02, zero
    bias, like every other weight matrix here) or ``fan_in`` (PyTorch's ``Conv2d`` default, weight and
    bias uniform in +-1/sqrt(C*p*p), which timm's ``VisionTransformer`` keeps for its patch projection;
    std 0.083 instead of 0.02 at patch 4 on 3 channels)."""
    norm_eps: float = 1e-6
    """LayerNorm epsilon."""
    activation: str = "gelu"
    """MLP activation: gelu, gelu_tanh, quick_gelu, relu, silu."""
    layer_scale_init: float | None = None
    """LayerScale on each residual branch with this start value; None = off."""
    pos_embed_prefix: bool = True
    """Whether the prefix tokens get position embeddings too (timm ``no_embed_class=False``)."""
    distill_token: bool = False
    """DeiT's distillation token (Touvron et al. 2021, arXiv 2012.12877, section 4): one more prefix
    token after the class token(s), with its own classifier (``head_dist``) that the distillation loss
    trains (``distill.*``); at evaluation (and in any plain forward call) the logits are the mean of
    the class and distillation heads, as DeiT and timm's ``VisionTransformerDistilled``."""
    mask_token: bool = False
    """A learned mask token ``(1, D)``, initialised to zeros (DINOv2, facebookresearch/dinov2
    ``dinov2/models/vision_transformer.py`` line 169), that ``model(x, tokens=True, mask=...)`` puts in
    place of the masked patches' embeddings before their position embeddings are added (iBOT's masked
    patches, DINOv2 lines 218-221). Training-only: timm's ViTs have none (timm drops DINOv2's on loading,
    ``timm/models/vision_transformer.py`` ``_convert_dinov2``), so timm weights are written without it,
    weights without one leave it at its init, and a model without one ignores one in its weights."""

    pos_embed: str = "learned"
    """Position information: ``learned`` (a learned table added to the tokens, resampled for other
    image sizes), ``rope`` (2D rotary embeddings of the patch tokens' queries and keys in every
    attention layer, nothing learned: timm's EVA family, DINOv3) or ``none``."""
    pos_embed_sincos: bool = False
    """With ``pos_embed='learned'``: the table holds fixed 2-D sin-cos embeddings of the patch grid (zeros
    for the prefix tokens) and is never trained, as MAE's encoder (facebookresearch/mae ``models_mae.py``
    lines 37 and 68-69, ``util/pos_embed.py``). It is still the model's ``pos_embed``: saved, loaded,
    resampled and converted as a learned table is (a timm or transformers ViT reads it as its learned
    one; a model without the flag that loads it trains it, as MAE's fine-tuning does)."""
    rope_type: str = "axial"
    """With ``pos_embed='rope'``, the positions: ``axial`` (patch indices, timm's ``RotaryEmbeddingCat``
    as EVA-02 and ``vit_*_rope_*`` use it), ``dinov3`` (patch centres normalised to [-1, 1] per axis,
    angles 2 pi coord / period: DINOv3, arXiv 2508.10104) or ``mixed`` (RoPE-Mixed, arXiv 2403.13298:
    every head of every block learns its own 2D frequencies, ``attn.rope_freqs``, on patch indices).
    See ``vitscale/models/common/rope.py``."""
    rope_temperature: float = 10000.0
    """RoPE frequency base: frequency f of Dh/4 is temperature^(-f/(Dh/4)) (``dinov3``: the periods
    are temperature^(f/(Dh/4)); DINOv3 uses 100; ``mixed``: the magnitudes the learned frequencies start
    from, RoPE-Mixed uses 10)."""
    rope_rotate_half: bool = False
    """RoPE channel pairs: False = neighbours (x0, x1), (x2, x3)...; True = x_i with x_(i+Dh/2)
    (DINOv3's layout)."""
    rope_grid_offset: float = 0.0
    """Added to every RoPE patch position (timm ``rope_grid_offset``)."""
    rope_ref_grid: tuple[int, int] | None = None
    """``axial`` only: patch indices rescaled onto this (height, width) grid, index * ref / side, so
    other image sizes span the same positions (EVA's ``ref_feat_shape``); None = raw indices."""
    mlp_type: str = "mlp"
    """The blocks' MLP: ``mlp`` (fc1 -> ``activation`` -> fc2) or ``swiglu`` (fc2(silu(fc1_g x) * fc1_x x),
    ``ffn_hidden_size`` units in each of its two input projections: DINOv3's S+/H+/7B)."""
    key_bias: bool = True
    """With ``qkv_bias``: whether the keys get a bias too. False: only queries and values do, as
    separate ``attn.q_bias`` / ``attn.v_bias`` parameters (timm's EVA, DINOv3's masked key bias). Without
    RoPE a key bias cannot change attention; with it, it can."""

    # EVA-02 (Fang et al. 2023, arXiv 2303.11331) and RoPE-ViT (Heo et al. 2024, arXiv 2403.13298) as
    # timm 1.0.31 builds them (timm/models/eva.py: eva02_* lines 2069-2250, vit_*_patch16_rope_* lines
    # 2689-2980); rope_type='mixed' is one more value of rope_type.
    rope_ape: bool = False
    """With ``pos_embed='rope'``: a learned position table added to the tokens too, exactly as
    ``pos_embed='learned'`` adds one (``pos_embed_prefix``, resampled for other image sizes) — absolute
    and rotary positions together: EVA-02's ``use_abs_pos_emb`` beside its RoPE, RoPE-ViT's ``+ APE``
    models (timm ``vit_*_patch16_rope_ape_224``, ``..._rope_mixed_ape_224``)."""
    attn_inner_norm: bool = False
    """A norm over the attention's concatenated head outputs before its output projection (timm
    ``scale_attn_inner``: EVA-02-CLIP's ``eva02_base_patch16_clip_224``, arXiv 2303.15389)."""
    mlp_inner_norm: bool = False
    """``mlp_type='swiglu'`` only: a norm over the gated hidden units before ``fc2`` (EVA-02's sub-LN in
    its B and L SwiGLU, timm ``scale_mlp``)."""
    qkv_fused: bool = True
    """How a library's checkpoint stores the attention's input projections: True one fused ``attn.qkv``,
    False three (``attn.q_proj`` with the query bias, ``k_proj`` without one, ``v_proj``: timm's ``Eva``
    with ``qkv_fused=False``, EVA-02 B and L). The network is the same either way — vitscale computes
    one fused projection (``attn.qkv_per_head``) — so this only says which layout ``from_timm`` read and
    ``to_timm`` writes."""
    swiglu_packed: bool = False
    """``mlp_type='swiglu'`` only: how a library's checkpoint stores the gate and value projections: True
    one packed ``mlp.fc1``, the gate's rows first (timm ``GluMlp`` with ``gate_last=False``, its
    ``SwiGLUPacked``: EVA-02 Ti and S), False two (``fc1_g``, ``fc1_x``). The same network either way —
    vitscale keeps the two — so, like ``qkv_fused``, only the layout ``to_timm`` writes."""

    def _check_eva_options(self) -> None:
        """Refusals of the EVA-02 / RoPE-ViT options above (and of ``rope_type='mixed'``)."""
        if self.rope_ape and self.pos_embed != "rope":
            raise ValueError(f"rope_ape=True adds a learned table beside RoPE: it needs pos_embed='rope', not {self.pos_embed!r}")
        if self.pos_embed == "rope" and self.rope_type == "mixed" and self.parallel_block:
            raise ValueError("rope_type='mixed' is not supported with parallel_block (its frequencies live in the attention layer)")
        if self.mlp_inner_norm and self.mlp_type != "swiglu":
            raise ValueError("mlp_inner_norm=True is a norm inside the SwiGLU MLP (EVA-02's): it needs mlp_type='swiglu'")
        if self.swiglu_packed and self.mlp_type != "swiglu":
            raise ValueError("swiglu_packed=True is a layout of the SwiGLU's fc1: it needs mlp_type='swiglu'")
        if self.parallel_block and (self.attn_inner_norm or not self.qkv_fused):
            raise ValueError("attn_inner_norm and qkv_fused=False are not supported with parallel_block")

    @property
    def learned_pos_table(self) -> bool:
        """Whether the model has a learned position table: ``pos_embed='learned'``, or ``'rope'`` with ``rope_ape``."""
        return self.pos_embed == "learned" or (self.pos_embed == "rope" and self.rope_ape)

    @property
    def learned_rope_freqs(self) -> bool:
        """Whether the attention layers learn RoPE frequencies: ``pos_embed='rope'`` with ``rope_type='mixed'``."""
        return self.pos_embed == "rope" and self.rope_type == "mixed"

    def __post_init__(self) -> None:
        if self.rope_ref_grid is not None and not isinstance(self.rope_ref_grid, tuple):
            object.__setattr__(self, "rope_ref_grid", tuple(self.rope_ref_grid))  # a YAML list
        if self.pos_embed not in POS_EMBEDS:
            raise ValueError(f"pos_embed must be one of {POS_EMBEDS}, got {self.pos_embed!r}")
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type must be one of {ROPE_TYPES}, got {self.rope_type!r}")
        if self.pos_embed_sincos and (self.pos_embed != "learned" or self.hidden_size % 4):
            raise ValueError(f"pos_embed_sincos=True fills the position table (pos_embed='learned', got {self.pos_embed!r}) "
                             f"with a sin and a cos of each axis: hidden_size divisible by 4, got {self.hidden_size}")  # fmt: skip
        if self.pos_embed == "rope":
            if (self.hidden_size // self.num_attention_heads) % 4:
                raise ValueError(
                    f"pos_embed='rope' needs a head dimension (hidden_size / num_attention_heads = "
                    f"{self.hidden_size // self.num_attention_heads}) divisible by 4"
                )
            if self.drop_patch_rate > 0:
                raise ValueError("pos_embed='rope' with drop_patch_rate > 0 is not supported: set drop_patch_rate=0")
            if self.rope_ref_grid is not None and (len(self.rope_ref_grid) != 2 or self.rope_type != "axial"):
                raise ValueError("rope_ref_grid is a (height, width) pair, for rope_type='axial' only")
        if self.pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {self.pool!r}")
        if isinstance(self.class_token_length, bool) or not isinstance(self.class_token_length, int) or self.class_token_length < 0:
            raise ValueError(f"class_token_length must be a count of prefix tokens, 0 or more, got {self.class_token_length!r}")
        if self.pool == "token" and (self.class_token_length < 1 or not self.class_token):
            raise ValueError("pool='token' needs a class token (class_token_length >= 1, class_token=True)")
        if self.norm_type not in NORMS:
            raise ValueError(f"norm_type must be one of {NORMS}, got {self.norm_type!r}")
        if self.patch_init not in PATCH_INITS:
            raise ValueError(f"patch_init must be one of {PATCH_INITS}, got {self.patch_init!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be divisible by num_attention_heads {self.num_attention_heads}"
            )
        if self.img_h % self.patch_dim or self.img_w % self.patch_dim:
            raise ValueError(f"image {self.img_h}x{self.img_w} is not divisible by patch_dim {self.patch_dim}")
        if self.parallel_block and self.ffn_hidden_size % self.num_attention_heads:
            raise ValueError("parallel_block needs ffn_hidden_size divisible by num_attention_heads")
        if self.distill_token and (self.class_token_length < 1 or not self.class_token):
            raise ValueError("distill_token needs a class token (class_token_length >= 1, class_token=True), as DeiT")
        if self.distill_token and self.pool == "none":
            raise ValueError("distill_token needs pooled logits (pool token, avg or map), not pool='none'")
        if self.mlp_type not in MLP_TYPES:
            raise ValueError(f"mlp_type must be one of {MLP_TYPES}, got {self.mlp_type!r}")
        if self.parallel_block and self.mlp_type != "mlp":
            raise ValueError("mlp_type='swiglu' is not supported with parallel_block")
        if self.parallel_block and not self.key_bias:
            raise ValueError("key_bias=False is not supported with parallel_block")
        if self.parallel_block and self.qkv_bias and not self.mlp_bias:
            raise ValueError("parallel_block with qkv_bias=True needs mlp_bias=True (one fused bias)")
        self._check_eva_options()

    @property
    def grid(self) -> tuple[int, int]:
        return self.img_h // self.patch_dim, self.img_w // self.patch_dim

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def num_prefix_tokens(self) -> int:
        """Class token(s) and registers, plus the distillation token."""
        return self.class_token_length + int(self.distill_token)

    @property
    def use_fc_norm(self) -> bool:
        return (self.pool == "avg") if self.fc_norm is None else self.fc_norm

    def with_image_size(self, img_h: int, img_w: int | None = None) -> ViTConfig:
        return replace(self, img_h=img_h, img_w=img_w if img_w is not None else img_h)


def eva_options(cfg: ViTConfig, layouts: bool = True) -> list[str]:
    """The EVA-02 / RoPE-ViT options ``cfg`` sets, one phrase each (empty: none): what a conversion to a
    library model without them (timm's ``VisionTransformer``, transformers, open_clip) refuses.
    ``layouts``: also the checkpoint-layout flags (``qkv_fused=False``, ``swiglu_packed``), which change
    only how timm's ``Eva`` stores the same network."""
    rope = cfg.pos_embed == "rope"
    out = [
        *(["a learned position table beside RoPE (rope_ape)"] if rope and cfg.rope_ape else []),
        *(["mixed RoPE's learned frequencies (rope_type='mixed')"] if rope and cfg.rope_type == "mixed" else []),
        *(["a norm inside the attention (attn_inner_norm)"] if cfg.attn_inner_norm else []),
        *(["a norm inside the SwiGLU (mlp_inner_norm)"] if cfg.mlp_inner_norm else []),
    ]
    if layouts:
        out += ["unfused q / k / v projections (qkv_fused=False)"] if not cfg.qkv_fused else []
        out += ["a packed SwiGLU fc1 (swiglu_packed)"] if cfg.swiglu_packed else []
    return out


def _vit(hidden, ffn, heads, layers, patch, **kw) -> ViTConfig:
    return ViTConfig(
        hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads, num_layers=layers, patch_dim=patch, **kw
    )


_DINOV3 = dict(
    img_h=256, img_w=256, num_classes=0, class_token_length=5, pool="avg", fc_norm=False, qkv_bias=False, layer_scale_init=1e-5, norm_eps=1e-5,
    pos_embed="rope", rope_type="dinov3", rope_temperature=100.0, rope_rotate_half=True,
)

# DINOv2 (Oquab et al. 2023, arXiv 2304.07193) as timm registers it (timm/models/vision_transformer.py,
# vit_{small,base,large}_patch14_dinov2 and ..._reg4_dinov2): 518 px (a 37 x 37 grid), patch 14, LayerScale
# 1e-5, class-token pooling, no classifier; the reg4 ones add 4 registers after the class token (Darcet et
# al. 2023, arXiv 2309.16588) and give position embeddings to the patches only (timm's no_embed_class).
_DINOV2 = dict(img_h=518, img_w=518, num_classes=0, layer_scale_init=1e-5)

# EVA-02 (Fang et al. 2023, arXiv 2303.11331) as timm 1.0.31 registers it (timm/models/eva.py lines 2069-2122,
# eva02_{tiny,small,base}_patch14_224; line 2231, eva02_base_patch16_clip_224): 224 px, a class token, a
# learned position table beside axial RoPE on patch indices rescaled to a 16 x 16 grid (base 10000), a
# SwiGLU 8/3 D wide, q / v biases, mean pooling with fc norm, no classifier.
_EVA02 = dict(num_classes=0, pool="avg", key_bias=False, mlp_type="swiglu", pos_embed="rope", rope_ref_grid=(16, 16), rope_ape=True)
# RoPE-ViT (Heo et al. 2024, arXiv 2403.13298; naver-ai/rope-vit) as timm registers it (timm/models/eva.py
# lines 2689-2980, vit_{small,base}_patch16_rope{,_mixed}{,_ape}_224): 224 px, a class token, LayerScale 1e-5,
# q / k / v biases, class-token pooling after the final norm; axial RoPE base 100 (timm's 'xy' grid:
# timm_eva.py swaps each head's query / key halves) or mixed RoPE, learned, from base 10; the _ape ones add
# a learned table on the patches (no_embed_class).
_ROPEVIT = dict(layer_scale_init=1e-5, pos_embed="rope", rope_temperature=100.0)
_MIXED = dict(_ROPEVIT, rope_type="mixed", rope_temperature=10.0)
_APE = dict(rope_ape=True, pos_embed_prefix=False)
_REG4 = dict(class_token_length=5, pos_embed_prefix=False)

# Sizes. B/16 … G/14: the model table of NeMo's ViT documentation ("Model size (M) / Hidden size /
# FFN_dim / Attention heads / Number of layers / PatchDim";
# docs.nvidia.com/nemo-framework/user-guide/latest/nemotoolkit/vision/vit.html). Ti, S, B/32: the
# original ViT / DeiT papers.
VARIANTS: dict[str, ViTConfig] = {
    # tiny, for tests and the CPU demo
    "vit_debug": _vit(64, 128, 4, 2, 8, img_h=32, img_w=32, num_classes=10),
    # DeiT-Ti / ViT-S (Touvron et al. 2021, Table 1) and ViT-B/32 (Dosovitskiy et al. 2021, Table 1)
    "vit_ti16": _vit(192, 768, 3, 12, 16),
    "vit_s16": _vit(384, 1536, 6, 12, 16),
    "vit_b32": _vit(768, 3072, 12, 12, 32),
    # NeMo table: B/16 86M, 768 / 3072 / 12 heads / 12 layers / patch 16
    "vit_b16": _vit(768, 3072, 12, 12, 16),
    # NeMo table: L/16 303M, 1024 / 4096 / 16 / 24 / 16
    "vit_l16": _vit(1024, 4096, 16, 24, 16),
    # NeMo table: H/16 632M, 1280 / 5120 / 16 / 32 / 16
    "vit_h16": _vit(1280, 5120, 16, 32, 16),
    # NeMo table: H/14 632M, 1280 / 5120 / 16 / 32 / 14
    "vit_h14": _vit(1280, 5120, 16, 32, 14),
    # NeMo table: g/14 1011M, 1408 / 6144 / 16 / 40 / 14
    "vit_g14": _vit(1408, 6144, 16, 40, 14),
    # NeMo table: G/14 1843M, 1664 / 8192 / 16 / 48 / 14
    "vit_bigg14": _vit(1664, 8192, 16, 48, 14),
    # ViT-22B (Dehghani et al. 2023, arXiv:2302.05442, Table 1): 6144 / 24576 / 48 heads / 48 layers,
    # patch 14, parallel block, QK LayerNorm, no QKV or LayerNorm biases, MAP head; 21.7B parameters.
    "vit_22b": _vit(
        6144, 24576, 48, 48, 14,
        class_token_length=0, pool="map", parallel_block=True, qk_norm=True, qkv_bias=False,
        norm_bias=False,
    ),
    # DINOv3 (Siméoni et al. 2025, arXiv 2508.10104) as timm registers it (timm/models/eva.py,
    # vit_{small,base,large}_patch16_dinov3): 1 class + 4 register tokens, LayerScale 1e-5, no QKV bias,
    # LayerNorm eps 1e-5, RoPE on patch centres in [-1, 1] with periods 100^(f/(Dh/4)), half-split pairs;
    # timm's default head: mean of the patch tokens after the final norm (DINOv3 itself: the class token).
    "vit_s16_dinov3": _vit(384, 1536, 6, 12, 16, **_DINOV3),
    "vit_b16_dinov3": _vit(768, 3072, 12, 12, 16, **_DINOV3),
    "vit_l16_dinov3": _vit(1024, 4096, 16, 24, 16, **_DINOV3),
    # ... and the SwiGLU ones (vit_small_plus / huge_plus / 7b_patch16_dinov3): MLP width int(D * ratio)
    # rounded up to a multiple of 8 (S+, H+: ratio 4) or 64 (7B: ratio 2)
    "vit_splus16_dinov3": _vit(384, 1536, 6, 12, 16, mlp_type="swiglu", **_DINOV3),
    "vit_hplus16_dinov3": _vit(1280, 5120, 20, 32, 16, mlp_type="swiglu", **_DINOV3),
    "vit_7b16_dinov3": _vit(4096, 8192, 32, 40, 16, mlp_type="swiglu", **_DINOV3),
    # DINOv2 S/B/L (patch 14; the giant uses a packed SwiGLU, which the ViT family does not express)
    "vit_s14_dinov2": _vit(384, 1536, 6, 12, 14, **_DINOV2),
    "vit_b14_dinov2": _vit(768, 3072, 12, 12, 14, **_DINOV2),
    "vit_l14_dinov2": _vit(1024, 4096, 16, 24, 14, **_DINOV2),
    "vit_s14_reg4_dinov2": _vit(384, 1536, 6, 12, 14, **_DINOV2, **_REG4),
    "vit_b14_reg4_dinov2": _vit(768, 3072, 12, 12, 14, **_DINOV2, **_REG4),
    "vit_l14_reg4_dinov2": _vit(1024, 4096, 16, 24, 14, **_DINOV2, **_REG4),
    # timm's SBB ViT-B/16 with RoPE (timm/models/eva.py, vit_base_patch16_rope_reg1_gap_256): 256 px, one
    # register and no class token, mean pooling with fc norm, LayerScale 1e-5, q/v biases, axial RoPE on
    # patch indices rescaled to a 16 x 16 grid, base 10000.
    "vit_b16_rope_reg1_gap_256": _vit(
        768, 3072, 12, 12, 16,
        img_h=256, img_w=256, class_token=False, class_token_length=1, pool="avg", layer_scale_init=1e-5,
        key_bias=False, pos_embed="rope", rope_ref_grid=(16, 16),
    ),
    # EVA-02 Ti / S / B (eva02_{tiny,small,base}_patch14_224; the _336 / _448 ones are the same at another
    # image size): Ti and S store the SwiGLU packed (timm GluMlp), B has its sub-LN inside the SwiGLU and
    # unfused q / k / v projections; EVA-02-CLIP B/16's image tower (eva02_base_patch16_clip_224) adds a norm
    # inside the attention, pools the class token after the final norm, and its "classifier" is the 512-wide
    # CLIP projection.
    "vit_ti14_eva02": _vit(192, 512, 3, 12, 14, **_EVA02, swiglu_packed=True),
    "vit_s14_eva02": _vit(384, 1024, 6, 12, 14, **_EVA02, swiglu_packed=True),
    "vit_b14_eva02": _vit(768, 2048, 12, 12, 14, **_EVA02, mlp_inner_norm=True, qkv_fused=False),
    "vit_b16_eva02_clip": _vit(
        768, 2048, 12, 12, 16, **{**_EVA02, "pool": "token", "num_classes": 512},
        mlp_inner_norm=True, qkv_fused=False, attn_inner_norm=True,
    ),
    # RoPE-ViT S / B: RoPE-Axial, + APE, RoPE-Mixed, RoPE-Mixed + APE
    "vit_s16_rope": _vit(384, 1536, 6, 12, 16, **_ROPEVIT),
    "vit_b16_rope": _vit(768, 3072, 12, 12, 16, **_ROPEVIT),
    "vit_s16_rope_ape": _vit(384, 1536, 6, 12, 16, **_ROPEVIT, **_APE),
    "vit_b16_rope_ape": _vit(768, 3072, 12, 12, 16, **_ROPEVIT, **_APE),
    "vit_s16_rope_mixed": _vit(384, 1536, 6, 12, 16, **_MIXED),
    "vit_b16_rope_mixed": _vit(768, 3072, 12, 12, 16, **_MIXED),
    "vit_s16_rope_mixed_ape": _vit(384, 1536, 6, 12, 16, **_MIXED, **_APE),
    "vit_b16_rope_mixed_ape": _vit(768, 3072, 12, 12, 16, **_MIXED, **_APE),
}  # fmt: skip
