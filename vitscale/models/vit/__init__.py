"""The ViT family: NeMo sizes B/16 … G/14, ViT-22B options, and a tiny debug variant."""

from ..registry import FamilySpec, register_family
from .configs import VARIANTS, ViTConfig
from .model import Block, ParallelBlock, VisionTransformer

register_family(
    FamilySpec(
        name="vit",
        model_cls=VisionTransformer,
        variants=VARIANTS,
        task="classification",
        parallel_plan="vitscale.models.vit.parallelize:PLAN",
        adapters={"timm": "vitscale.models.vit.state_dict_adapter:TIMM"},
        flops="vitscale.models.vit.flops:vit_flops",
        memory="vitscale.models.vit.memory:MEMORY",
    )
)

__all__ = ["Block", "ParallelBlock", "VARIANTS", "ViTConfig", "VisionTransformer"]
