"""The VOLO family: outlook attention, D1 … D5 and a tiny debug variant; trains with classification or token labeling."""

from ..registry import FamilySpec, register_family
from .configs import VARIANTS, VOLOConfig
from .model import VOLO, OutlookAttention, TokenMix

register_family(
    FamilySpec(
        name="volo",
        model_cls=VOLO,
        variants=VARIANTS,
        task="classification",
        parallel_plan="vitscale.models.volo.parallelize:PLAN",
        adapters={"timm": "vitscale.models.volo.state_dict_adapter:TIMM"},
    )
)

__all__ = ["VARIANTS", "VOLO", "VOLOConfig", "OutlookAttention", "TokenMix"]
