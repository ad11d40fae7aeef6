"""The NaFlex ViT family: ViTs over variable-length patch sequences at native aspect ratio (timm's
``naflexvit_*`` sizes and a tiny debug variant). Its own family, not a ViT variant: another input
(NaFlex dicts), another state-dict layout (a Linear patch embedding, a 2D position grid) and another
model class; its blocks, heads and parallel plans are the ViT's."""

from ..registry import FamilySpec, register_family
from ..vit.finetune import layer_decay
from ..vit.flops import vit_flops
from .configs import VARIANTS, NaFlexConfig
from .model import NaFlexViT
from .parallelize import PLAN
from .patches import PATCH_KEYS, is_patch_batch, patchify, to_patch_batch
from .state_dict_adapter import RECOGNIZES
from .timm_adapter import TIMM

register_family(
    FamilySpec(
        name="naflex",
        model_cls=NaFlexViT,
        variants=VARIANTS,
        task="classification",
        parallel_plan=PLAN,
        adapters={"timm": TIMM},
        # its own naming, or a classic ViT's (converted by the model's load hook)
        recognizes=RECOGNIZES,
        layer_decay=layer_decay,
        # a NaFlex image of N patches costs what an image of N patches costs a ViT (padding tokens
        # cost as much as real ones)
        flops=vit_flops,
    )
)

__all__ = ["NaFlexConfig", "NaFlexViT", "PATCH_KEYS", "VARIANTS", "is_patch_batch", "patchify", "to_patch_batch"]
