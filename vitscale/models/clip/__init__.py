"""CLIP family (image-text contrastive): NeMo / open_clip sizes B/32 … e/14 and a tiny debug variant."""

from ..registry import FamilySpec, register_family
from .configs import VARIANTS, CLIPConfig, CLIPTextConfig
from .model import CLIP, CausalBlock, TextTransformer

register_family(
    FamilySpec(
        name="clip",
        model_cls=CLIP,
        variants=VARIANTS,
        task="contrastive",
        parallel_plan="vitscale.models.clip.parallelize:PLAN",
        adapters={"open_clip": "vitscale.models.clip.state_dict_adapter:OPEN_CLIP"},
        tokenizer="vitscale.models.clip.tokenizer:create_tokenizer",
        memory="vitscale.models.vit.memory:MEMORY_IMAGE_TOWER",
        serving="vitscale.models.clip.serving:serving",
    )
)

__all__ = ["CLIP", "CLIPConfig", "CLIPTextConfig", "CausalBlock", "TextTransformer", "VARIANTS"]
