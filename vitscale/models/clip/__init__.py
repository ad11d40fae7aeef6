"""CLIP family (image-text contrastive): NeMo / open_clip sizes B/32 … e/14 and a tiny debug variant."""

from ..registry import FamilySpec, register_family
from ..vit.memory import MEMORY_IMAGE_TOWER
from . import finetune
from .configs import VARIANTS, CLIPConfig, CLIPTextConfig
from .flops import clip_flops
from .model import CLIP, CausalBlock, TextTransformer
from .parallelize import PLAN
from .serving import serving
from .state_dict_adapter import OPEN_CLIP
from .tokenizer import create_tokenizer
from .transformers_adapter import TRANSFORMERS

register_family(
    FamilySpec(
        name="clip",
        model_cls=CLIP,
        variants=VARIANTS,
        task="contrastive",
        parallel_plan=PLAN,
        adapters={"open_clip": OPEN_CLIP, "transformers": TRANSFORMERS},
        tokenizer=create_tokenizer,
        memory=MEMORY_IMAGE_TOWER,
        flops=clip_flops,
        serving=serving,
        recognizes=finetune.RECOGNIZES,
        architecture=finetune.architecture,
        layer_decay=finetune.layer_decay,
    )
)

__all__ = ["CLIP", "CLIPConfig", "CLIPTextConfig", "CausalBlock", "TextTransformer", "VARIANTS"]
