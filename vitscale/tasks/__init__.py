"""Tasks: what a run computes — the loss of a batch, its config groups, its default evaluations and
the loss the bench times — one module per task behind one registry (``vitscale models`` and
``vitscale.registry.TASKS`` list them); see :mod:`vitscale.tasks.base`.

``Task``, ``get_task`` and ``register_task`` are loaded on first use: importing a task's command
module (``vitscale --help`` reads its ``HELP``) imports no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Task", "get_task", "register_task"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(".base", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
