"""VOLO configuration and the variant table (VOLO-D1 … D5 and a tiny debug flavour)."""

from __future__ import annotations

from dataclasses import dataclass, replace

POOLS = ("token", "avg")
OUTLOOK_IMPLS = ("auto", "triton", "eager")


@dataclass(frozen=True)
class VOLOConfig:
    """A Vision Outlooker (Yuan et al. 2021, "VOLO: Vision Outlooker for Visual Recognition").

    Layout: convolutional stem (stride ``patch_dim``) -> ``layers[0]`` outlooker blocks on the fine
    grid (img / patch_dim) -> a stride-``pooling_scale`` patch-merging convolution -> position
    embedding -> ``sum(layers[1:])`` transformer blocks on the coarse grid -> ``num_class_layers``
    class-attention blocks -> LayerNorm -> class head (+ the per-token ``aux_head`` of token labeling).
    """

    img_h: int = 224
    """Input image height in pixels."""
    img_w: int = 224
    """Input image width in pixels."""
    num_channels: int = 3
    """Input image channels."""
    num_classes: int = 1000
    """Classifier outputs; 0 removes the class and aux heads (features only)."""
    layers: tuple[int, ...] = (4, 4, 8, 2)
    """Blocks per stage: ``layers[0]`` outlookers, then transformer stages (paper Table 2)."""
    outlook_dim: int = 192
    """Token width of the outlooker stage."""
    outlook_heads: int = 6
    """Heads of the outlook attention."""
    hidden_size: int = 384
    """Token width of the transformer and class-attention stages."""
    num_heads: int = 12
    """Heads of the transformer and class-attention stages."""
    outlook_mlp_ratio: float = 3.0
    """MLP hidden width / token width in the outlooker stage."""
    mlp_ratio: float = 3.0
    """MLP hidden width / token width in the transformer and class-attention stages."""
    patch_dim: int = 8
    """Total stride of the stem: the outlooker grid is img / patch_dim."""
    stem_hidden: int = 64
    """Channels of the three stem convolutions (128 for VOLO-D5)."""
    stem_stride: int = 2
    """Stride of the first stem convolution; the stem's projection takes the rest of ``patch_dim``."""
    stem_fast: bool = True
    """The stem in ``channels_last`` memory and, under ``train.compile``, compiled on its own beside the
    blocks (the same arithmetic within rounding); false: NCHW and eager, as before (the speed table's
    "before": ``vitscale bench volo_d1 --baseline stem_fast=False``)."""
    pooling_scale: int = 2
    """Patch merging between the outlooker and transformer stages: the coarse grid is img / (patch_dim * pooling_scale)."""
    outlook_kernel: int = 3
    """Local window K of the outlook attention (K x K)."""
    outlook_padding: int = 1
    """Padding of the K x K unfold / fold."""
    outlook_stride: int = 2
    """Stride of the outlook attention: attention weights are generated on a grid average-pooled by
    this stride, and values are unfolded with it. The released VOLO models (and timm) use 2; 1 gives
    one window per fine-grid token."""
    outlook_impl: str = "auto"
    """How outlook attention aggregates its windows: ``triton`` (a fused Triton kernel, forward and
    backward, that never materialises the K^2-times unfolded values; CUDA only, no attention
    dropout), ``eager`` (unfold -> matmul -> fold in PyTorch) or ``auto`` (``triton`` on CUDA when
    Triton is importable and no attention dropout is active, ``eager`` elsewhere). Same outputs
    within rounding; see docs/volo.md."""
    num_class_layers: int = 2
    """Class-attention blocks at the end (CaiT style: only the class token is updated)."""
    qkv_bias: bool = False
    """Bias on the value / QKV / class-attention q, kv projections."""
    drop_path_rate: float = 0.0
    """Stochastic depth: linear in the block index over all stages; as in the reference
    implementation the outlooker and class-attention blocks get none."""
    attention_dropout: float = 0.0
    """Dropout on attention probabilities."""
    pos_dropout: float = 0.0
    """Dropout after adding the position embedding."""
    head_dropout: float = 0.0
    """Dropout on the features before the class and aux heads."""
    aux_head: bool = True
    """A per-token classifier on the coarse tokens (token labeling); at inference its max over
    tokens, times ``aux_weight``, is added to the class logits."""
    aux_weight: float = 0.5
    """Weight of the aux head's max-over-tokens logits in the inference output."""
    pool: str = "token"
    """Head pooling: ``token`` (class token) or ``avg`` (mean of all tokens)."""
    norm_eps: float = 1e-5
    """LayerNorm epsilon (PyTorch's default, as the reference models)."""

    def __post_init__(self) -> None:
        if self.outlook_impl not in OUTLOOK_IMPLS:
            raise ValueError(f"outlook_impl must be one of {OUTLOOK_IMPLS}, got {self.outlook_impl!r}")
        if self.pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {self.pool!r}")
        if len(self.layers) < 2:
            raise ValueError("layers needs an outlooker stage and at least one transformer stage")
        if self.outlook_dim % self.outlook_heads:
            raise ValueError(f"outlook_dim {self.outlook_dim} not divisible by outlook_heads {self.outlook_heads}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} not divisible by num_heads {self.num_heads}")
        if self.patch_dim % self.stem_stride:
            raise ValueError(f"patch_dim {self.patch_dim} not divisible by stem_stride {self.stem_stride}")
        s = self.token_stride
        if self.img_h % s or self.img_w % s:
            raise ValueError(f"image {self.img_h}x{self.img_w} is not divisible by the token stride {s}")

    @property
    def token_stride(self) -> int:
        """Pixels per coarse token side (16 for the released models)."""
        return self.patch_dim * self.pooling_scale

    @property
    def fine_grid(self) -> tuple[int, int]:
        return self.img_h // self.patch_dim, self.img_w // self.patch_dim

    @property
    def grid(self) -> tuple[int, int]:
        """The coarse token grid (transformer stages, aux head, token labels)."""
        return self.img_h // self.token_stride, self.img_w // self.token_stride

    @property
    def num_transformer_layers(self) -> int:
        return sum(self.layers[1:])

    def with_image_size(self, img_h: int, img_w: int | None = None) -> VOLOConfig:
        return replace(self, img_h=img_h, img_w=img_w if img_w is not None else img_h)


def _volo(layers, outlook_dim, outlook_heads, dim, heads, **kw) -> VOLOConfig:
    return VOLOConfig(
        layers=layers, outlook_dim=outlook_dim, outlook_heads=outlook_heads, hidden_size=dim, num_heads=heads, **kw
    )


# Sizes: VOLO paper (Yuan et al. 2021) Table 2 — layers (outlooker, transformer stages), embedding
# dims, heads, MLP ratio 3/3/3/3/4 (also Table 2 of NVIDIA's VOLO blog post, developer.nvidia.com/blog/
# training-a-state-of-the-art-imagenet-1k-visual-transformer-model-using-nvidia-dgx-superpod), stem hidden
# dims 64 (128 for D5).
VARIANTS: dict[str, VOLOConfig] = {
    # tiny, for tests and the CPU demo: 32x32 images, 8x8 outlooker grid, 4x4 token grid
    "volo_debug": _volo(
        (2, 2), 32, 2, 64, 4, img_h=32, img_w=32, num_classes=10, patch_dim=4, stem_hidden=16,
    ),
    # D1: 26.6M — layers 4/4+8+2, dims 192/384, heads 6/12, MLP 3
    "volo_d1": _volo((4, 4, 8, 2), 192, 6, 384, 12),
    # D2: 58.7M — layers 6/4+10+4, dims 256/512, heads 8/16, MLP 3
    "volo_d2": _volo((6, 4, 10, 4), 256, 8, 512, 16),
    # D3: 86.3M — layers 8/8+16+4, dims 256/512, heads 8/16, MLP 3
    "volo_d3": _volo((8, 8, 16, 4), 256, 8, 512, 16),
    # D4: 193M — layers 8/8+16+4, dims 384/768, heads 12/16, MLP 3
    "volo_d4": _volo((8, 8, 16, 4), 384, 12, 768, 16),
    # D5: 296M — layers 12/12+20+4, dims 384/768, heads 12/16, MLP 4, stem 128
    "volo_d5": _volo((12, 12, 20, 4), 384, 12, 768, 16, outlook_mlp_ratio=4.0, mlp_ratio=4.0, stem_hidden=128),
}  # fmt: skip
