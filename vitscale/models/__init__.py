"""The model zoo: pure single-device PyTorch models behind one registry."""

from .registry import (
    FamilySpec,
    create_model,
    families,
    get_family,
    get_model_config,
    list_models,
    register_family,
)

__all__ = ["FamilySpec", "create_model", "families", "get_family", "get_model_config", "list_models", "register_family"]
