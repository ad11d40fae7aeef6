"""A toy model family, written as docs/architecture.md says a new family is added: ``model.py``,
``configs.py``, ``parallelize.py`` (TP plan and blocks only) and this one registry entry. Importing
the package registers it (an in-tree family's module is listed in
the built-in table of ``vitscale.registry.FAMILIES`` instead)."""

from vitscale.models.registry import FamilySpec, register_family

from .configs import VARIANTS, ToyConfig
from .model import ToyNet
from .parallelize import PLAN

register_family(FamilySpec(name="toy", model_cls=ToyNet, variants=VARIANTS, parallel_plan=PLAN))

__all__ = ["ToyConfig", "ToyNet"]
