"""The model zoo: pure single-device PyTorch models behind one registry."""

from .registry import (
    FamilySpec,
    ResolvedModel,
    create_model,
    families,
    get_family,
    get_model_config,
    list_models,
    register_family,
    resolve_model,
)

__all__ = ["FamilySpec", "create_model", "families", "get_family", "get_model_config", "list_models", "register_family", "ResolvedModel",
           "resolve_model"]
