"""The VOLO family: outlook attention, D1 … D5 and a tiny debug variant; trains with classification or token labeling."""

from ..registry import FamilySpec, register_family
from .configs import VARIANTS, VOLOConfig
from .flops import volo_flops
from .model import VOLO, OutlookAttention, TokenMix
from .parallelize import PLAN
from .state_dict_adapter import RECOGNIZES, TIMM

register_family(
    FamilySpec(
        name="volo",
        flops=volo_flops,
        model_cls=VOLO,
        variants=VARIANTS,
        task="classification",
        parallel_plan=PLAN,
        adapters={"timm": TIMM},
        recognizes=RECOGNIZES,
    )
)

__all__ = ["VARIANTS", "VOLO", "VOLOConfig", "OutlookAttention", "TokenMix"]
