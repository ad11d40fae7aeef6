"""CLIP configuration (NeMo CLIP field names) and the variant table."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..vit.configs import ViTConfig

# OpenAI CLIP's image normalisation (open_clip OPENAI_DATASET_MEAN / STD).
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class CLIPTextConfig:
    """The causal text transformer. Field names follow NeMo's CLIP ``text`` config."""

    encoder_seq_length: int = 77
    """Context length in tokens (NeMo ``encoder_seq_length``; open_clip ``context_length``)."""
    vocab_size: int = 49408
    """Token vocabulary (open_clip's BPE: 49,152 merges + 256 bytes ... = 49,408)."""
    num_layers: int = 12
    """Transformer blocks (NeMo ``num_layers``)."""
    hidden_size: int = 512
    """Token width (NeMo ``hidden_size``)."""
    ffn_hidden_size: int = 2048
    """MLP hidden width (NeMo ``ffn_hidden_size``)."""
    num_attention_heads: int = 8
    """Attention heads (NeMo ``num_attention_heads``)."""
    hidden_dropout: float = 0.0
    """Dropout on the attention / MLP outputs (NeMo ``hidden_dropout``)."""
    attention_dropout: float = 0.0
    """Dropout on the attention probabilities (NeMo ``attention_dropout``)."""
    drop_path_rate: float = 0.0
    """Stochastic depth of the text blocks (linear rule, as in the vision tower)."""
    norm_eps: float = 1e-5
    """LayerNorm epsilon (open_clip: PyTorch's default 1e-5)."""
    activation: str = "gelu"
    """MLP activation (``quick_gelu`` for OpenAI's original weights)."""
    causal: bool = True
    """Causal self-attention (CLIP); False = bidirectional."""
    pool: str = "argmax"
    """Text features taken at: ``argmax`` (the end-of-text token = highest id, as open_clip),
    ``first`` or ``last`` token."""

    def __post_init__(self) -> None:
        if self.pool not in ("argmax", "first", "last"):
            raise ValueError(f"text pool must be argmax, first or last, got {self.pool!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"text hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}"
            )

    def block_config(self) -> ViTConfig:
        """The same width / depth as a :class:`ViTConfig`, so the text tower reuses the ViT ``Block``."""
        return ViTConfig(
            num_layers=self.num_layers, hidden_size=self.hidden_size, ffn_hidden_size=self.ffn_hidden_size,
            num_attention_heads=self.num_attention_heads, hidden_dropout=self.hidden_dropout,
            attention_dropout=self.attention_dropout, num_classes=0, norm_eps=self.norm_eps,
            activation=self.activation, drop_path_rate=self.drop_path_rate,
        )  # fmt: skip


def _default_vision() -> ViTConfig:
    return _vision(768, 3072, 12, 12, 16)


@dataclass(frozen=True)
class CLIPConfig:
    """A CLIP model: a ViT image tower and a causal text tower projected to ``output_dim``."""

    vision: ViTConfig = field(default_factory=_default_vision)
    """The image tower (a :class:`ViTConfig`; NeMo ``vision``): ``class_token_length``, ``drop_patch_rate``,
    ``drop_path_rate``, ``pool='avg'`` (= NeMo ``global_average_pool: True``) … are its fields."""
    text: CLIPTextConfig = field(default_factory=CLIPTextConfig)
    """The text tower (NeMo ``text``)."""
    output_dim: int = 512
    """Width of the shared image-text embedding (NeMo ``output_dim``; open_clip ``embed_dim``)."""
    image_mean: tuple[float, ...] = OPENAI_MEAN
    """Per-channel mean the images are normalised with (NeMo ``image_mean``)."""
    image_std: tuple[float, ...] = OPENAI_STD
    """Per-channel standard deviation (NeMo ``image_std``)."""
    logit_scale_init: float = math.log(1 / 0.07)
    """Initial log of the learnable temperature (CLIP: log(1/0.07); SigLIP: log(10))."""
    logit_scale_max: float = 100.0
    """The temperature ``exp(logit_scale)`` is clamped at this value."""
    logit_bias_init: float | None = None
    """A learnable logit bias with this start value (SigLIP: -10); None = no bias (CLIP)."""

    def __post_init__(self) -> None:
        if self.vision.num_classes != 0:
            raise ValueError("the CLIP vision tower must have num_classes=0 (it is projected to output_dim)")

    # The image geometry, read by generic code (data loaders, FLOP counters) as on a ViTConfig.
    @property
    def img_h(self) -> int:
        return self.vision.img_h

    @property
    def img_w(self) -> int:
        return self.vision.img_w

    @property
    def num_channels(self) -> int:
        return self.vision.num_channels

    @property
    def patch_dim(self) -> int:
        return self.vision.patch_dim

    def with_image_size(self, img_h: int, img_w: int | None = None) -> CLIPConfig:
        """The same model for images of ``img_h`` x ``img_w`` (the vision tower's size)."""
        return replace(self, vision=self.vision.with_image_size(img_h, img_w))


def _vision(hidden, ffn, heads, layers, patch, **kw) -> ViTConfig:
    """An open_clip-style image tower: conv1 without bias, ln_pre, class token, LayerNorm eps 1e-5."""
    base = dict(
        img_h=224, img_w=224, num_classes=0, class_token_length=1, pool="token", pre_norm=True, patch_bias=False,
        norm_eps=1e-5, activation="gelu",
    )  # fmt: skip
    base.update(kw)
    return ViTConfig(
        hidden_size=hidden,
        ffn_hidden_size=ffn,
        num_attention_heads=heads,
        num_layers=layers,
        patch_dim=patch,
        **base,
    )


def _text(hidden, heads, layers, **kw) -> CLIPTextConfig:
    return CLIPTextConfig(
        hidden_size=hidden, ffn_hidden_size=4 * hidden, num_attention_heads=heads, num_layers=layers, **kw
    )


def _clip(vision: ViTConfig, text: CLIPTextConfig, output_dim: int, **kw) -> CLIPConfig:
    return CLIPConfig(vision=vision, text=text, output_dim=output_dim, **kw)


# Sizes: the architecture columns of the CLIP table of NeMo's documentation (vision hidden (FFN) / heads /
# layers / patch, text hidden / heads / layers, output dim;
# docs.nvidia.com/nemo-framework/user-guide/latest/nemotoolkit/multimodal/vlm/clip.html). Its size column is wrong in places and its
# B/32 and B/16 rows swap the patch sizes; the patch sizes below follow the names, and the parameter
# counts match open_clip's ViT-B-32 … ViT-e-14 within 0.5% (tests/unit/test_clip_model.py).
# NeMo's default class_token_length is 8; open_clip's (and these variants') is 1, so open_clip
# checkpoints load — pass ``vision={"class_token_length": 8}`` for NeMo's layout.
# Head counts follow NeMo (head width 64). open_clip's H/g/bigG/e-14 use head widths 80/88/104/112 (the
# same parameters, a different split): `vitscale.interop.from_open_clip` / `load_open_clip_checkpoint`
# take the head count from the open_clip model, so its checkpoints convert exactly.
VARIANTS: dict[str, CLIPConfig] = {
    # tiny, for tests and the CPU demo (32x32 images, 2+2 blocks of width 64)
    "clip_debug": _clip(
        _vision(64, 128, 4, 2, 8, img_h=32, img_w=32), _text(64, 4, 2), 64
    ),
    # NeMo: B/32 224, vision 768 / 12 heads / 12 layers, text 512 / 8 / 12, output 512 (open_clip ViT-B-32)
    "clip_b32": _clip(_vision(768, 3072, 12, 12, 32), _text(512, 8, 12), 512),
    # NeMo: B/16 224, vision 768 / 12 / 12, text 512 / 8 / 12, output 512 (open_clip ViT-B-16)
    "clip_b16": _clip(_vision(768, 3072, 12, 12, 16), _text(512, 8, 12), 512),
    # NeMo: L/14 224, vision 1024 / 16 / 24, text 768 / 12 / 12, output 768 (open_clip ViT-L-14)
    "clip_l14": _clip(_vision(1024, 4096, 16, 24, 14), _text(768, 12, 12), 768),
    # NeMo: H/14 224, vision 1280 / 20 / 32, text 1024 / 16 / 24, output 1024 (open_clip ViT-H-14)
    "clip_h14": _clip(_vision(1280, 5120, 20, 32, 14), _text(1024, 16, 24), 1024),
    # NeMo: g/14 224, vision 1408 (6144) / 22 / 40, text 1024 / 16 / 24, output 1024 (open_clip ViT-g-14)
    "clip_g14": _clip(_vision(1408, 6144, 22, 40, 14), _text(1024, 16, 24), 1024),
    # NeMo: G/14 224, vision 1664 (8192) / 16 / 48, text 1280 / 20 / 32, output 1280 (open_clip ViT-bigG-14)
    "clip_bigg14": _clip(_vision(1664, 8192, 16, 48, 14), _text(1280, 20, 32), 1280),
    # NeMo: e/14 224, vision 1792 (15360) / 28 / 56, text 1280 / 20 / 36, output 1280 (open_clip ViT-e-14)
    "clip_e14": _clip(_vision(1792, 15360, 28, 56, 14), _text(1280, 20, 36), 1280),
}  # fmt: skip
