"""From a config to a running job: :func:`build_model` builds a model on the meta device,
parallelizes, materialises and initialises it."""

from .build import build_model

__all__ = ["build_model"]
