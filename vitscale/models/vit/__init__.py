"""The ViT family: NeMo sizes B/16 … G/14, ViT-22B options, and a tiny debug variant."""

from ..registry import FamilySpec, register_family
from . import finetune
from .configs import VARIANTS, ViTConfig
from .flops import vit_flops
from .memory import MEMORY
from .model import Block, ParallelBlock, VisionTransformer
from .parallelize import PLAN
from .timm_registry import TIMM
from .transformers_adapter import TRANSFORMERS

register_family(
    FamilySpec(
        name="vit",
        model_cls=VisionTransformer,
        variants=VARIANTS,
        task="classification",
        parallel_plan=PLAN,
        adapters={"timm": TIMM, "transformers": TRANSFORMERS},
        flops=vit_flops,
        memory=MEMORY,
        recognizes=finetune.RECOGNIZES,
        architecture=finetune.architecture,
        layer_decay=finetune.layer_decay,
    )
)

__all__ = ["Block", "ParallelBlock", "VARIANTS", "ViTConfig", "VisionTransformer"]
