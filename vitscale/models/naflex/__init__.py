"""The NaFlex ViT family: ViTs over variable-length patch sequences at native aspect ratio (timm's
``naflexvit_*`` sizes and a tiny debug variant). Its own family, not a ViT variant: another input
(NaFlex dicts), another state-dict layout (a Linear patch embedding, a 2D position grid) and another
model class; its blocks, heads and parallel plans are the ViT's."""

from ..registry import FamilySpec, register_family
from .configs import VARIANTS, NaFlexConfig
from .model import NaFlexViT
from .patches import PATCH_KEYS, is_patch_batch, patchify, to_patch_batch

register_family(
    FamilySpec(
        name="naflex",
        model_cls=NaFlexViT,
        variants=VARIANTS,
        task="classification",
        parallel_plan="vitscale.models.naflex.parallelize:PLAN",
        adapters={"timm": "vitscale.models.naflex.state_dict_adapter:TIMM"},
        # a NaFlex image of N patches costs what an image of N patches costs a ViT (padding tokens
        # cost as much as real ones)
        flops="vitscale.models.vit.flops:vit_flops",
    )
)

__all__ = ["NaFlexConfig", "NaFlexViT", "PATCH_KEYS", "VARIANTS", "is_patch_batch", "patchify", "to_patch_batch"]
