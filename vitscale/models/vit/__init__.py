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
        adapters={"timm": "vitscale.models.vit.timm_registry:TIMM"},
        flops="vitscale.models.vit.flops:vit_flops",
        memory="vitscale.models.vit.memory:MEMORY",
        recognizes="vitscale.models.vit.finetune:RECOGNIZES",
        architecture="vitscale.models.vit.finetune:architecture",
        layer_decay="vitscale.models.vit.finetune:layer_decay",
    )
)

__all__ = ["Block", "ParallelBlock", "VARIANTS", "ViTConfig", "VisionTransformer"]
