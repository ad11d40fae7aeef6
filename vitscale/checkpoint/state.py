"""What goes into a checkpoint: tensors (non-tensor leaves are not stored: a checkpoint holds tensors
and JSON only), checked finite before they are written, the trainer's state as JSON
(``trainer_state.json``) and each rank's RNG states as JSON (``rng_rank<r>.json``).

A checkpoint is assembled from components that implement PyTorch DCP's ``Stateful`` protocol
(``torch.distributed.checkpoint.stateful``: ``state_dict()`` / ``load_state_dict(sd)``), as
torchtitan's checkpoint manager owns a run's state: :class:`ModelState` and :class:`OptimizerState`
(through DCP's ``get_/set_model_state_dict``, which reshard), the EMA, the trainer's counters with
the data position, and :class:`RNGState`. The checkpointer calls ``state_dict()`` on save and, after
DCP has loaded the tensors in place, ``load_state_dict`` on load.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import torch
from torch import nn

from .finite import finite_flags
from .integrity import CheckpointError

TRAINER_STATE = "trainer_state.json"


class NonFiniteWeights(CheckpointError):
    """Tensors holding NaN or infinity: never written into a checkpoint or export, never loaded."""


# ------------------------------------------------------------------------------------- tensors
def _flat_tensors(tree: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    if isinstance(tree, dict):
        return [kv for k, v in tree.items() for kv in _flat_tensors(v, f"{prefix}{k}.")]
    if isinstance(tree, torch.Tensor):
        return [(prefix[:-1], tree)]
    return []


def nonfinite_names(tree: Any, limit: int = 3) -> list[str]:
    """Names (dotted paths) of the floating tensors in ``tree`` holding a NaN or an infinity, at most
    ``limit``; a DTensor is checked on this rank's shard. One host read per device (sums first:
    :func:`vitscale.checkpoint.finite.finite_flags`)."""
    from torch.distributed.tensor import DTensor

    named = [(n, t.to_local() if isinstance(t, DTensor) else t) for n, t in _flat_tensors(tree)]
    named = [(n, t.detach()) for n, t in named if t.is_floating_point() and t.numel()]
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for n, t in named:
        by_device.setdefault(t.device, []).append((n, t))
    bad: list[str] = []
    for items in by_device.values():
        flags = finite_flags([t for _, t in items])
        bad += [n for (n, _), ok in zip(items, flags) if not ok]
    return sorted(bad)[:limit]


def some_names(bad: list[str]) -> str:
    """The first three names, and "and more" when there are more."""
    return ", ".join(bad[:3]) + (" and more" if len(bad) > 3 else "")


def tensors_only(tree: Any) -> Any:
    """The nested dict with only its tensor leaves (lists and scalars dropped)."""
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            sub = tensors_only(v)
            if sub is not None and (not isinstance(sub, dict) or sub):
                out[k] = sub
        return out
    return tree if isinstance(tree, torch.Tensor) else None


def resolve(part: Any) -> Any:
    """A component's state: ``part.state_dict()`` of a ``Stateful``, a plain dict as it is."""
    return part if isinstance(part, dict) else part.state_dict()


# ------------------------------------------------------------------------------------- components
class ModelState:
    """``Stateful`` of a (possibly sharded) model: its sharded state dict (DCP reshards on load)."""

    def __init__(self, model: nn.Module):
        self.model = model

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.model)

    def load_state_dict(self, sd: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, sd)


class OptimizerState:
    """``Stateful`` of an optimizer of ``model``: its state keyed by parameter names (DCP reshards).

    ``renames``: ``{prefix of model's names: prefix in the checkpoint}``, e.g. a training module's
    ``{"backbone.": "", "parts.": "task."}``, so that the optimizer state of a family's model is keyed by
    its own names (``optim.state.blocks.0...``) however the module that trains it wraps it."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, renames: dict[str, str] | None = None):
        self.model, self.optimizer = model, optimizer
        self.renames = dict(renames or {})

    def _rename(self, sd: dict, pairs: list[tuple[str, str]]) -> dict:
        if not pairs:
            return sd

        def one(fqn: str) -> str:
            for old, new in pairs:
                if fqn.startswith(old):
                    return new + fqn[len(old) :]
            return fqn

        out = dict(sd)
        out["state"] = {one(k): v for k, v in sd.get("state", {}).items()}
        out["param_groups"] = [{**g, "params": [one(k) for k in g["params"]]} for g in sd.get("param_groups", [])]
        return out

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return self._rename(get_optimizer_state_dict(self.model, self.optimizer), list(self.renames.items()))

    def load_state_dict(self, sd: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        # back to the module's names: the longest saved prefix first (the backbone's is empty)
        back = sorted(((new, old) for old, new in self.renames.items()), key=lambda p: -len(p[0]))
        set_optimizer_state_dict(self.model, self.optimizer, self._rename(sd, back))


class RNGState:
    """``Stateful`` of this process's random number generators (torch, CUDA, Python, NumPy), as JSON."""

    def state_dict(self) -> dict:
        return rng_state()

    def load_state_dict(self, sd: dict) -> None:
        set_rng_state(sd)


# ------------------------------------------------------------------------------------- RNG as JSON
def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode()


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def rng_state() -> dict:
    import numpy as np

    v, internal, gauss = random.getstate()
    np_state = np.random.get_state()
    state = {
        "torch": _b64(torch.get_rng_state()),
        "python": [v, list(internal), gauss],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = _b64(torch.cuda.get_rng_state())
    return state


def set_rng_state(state: dict) -> None:
    import numpy as np

    torch.set_rng_state(_unb64(state["torch"]))
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(_unb64(state["cuda"]))


__all__ = [
    "ModelState", "NonFiniteWeights", "OptimizerState", "RNGState", "TRAINER_STATE", "nonfinite_names", "resolve",
    "rng_state", "set_rng_state", "some_names", "tensors_only",
]  # fmt: skip
