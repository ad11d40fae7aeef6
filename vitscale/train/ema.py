"""Exponential moving average of the weights (kept in fp32 next to the model)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from vitscale.distributed.utils import local_shard as _local
from vitscale.distributed.utils import move_towards


class EMA:
    """``ema = decay * ema + (1 - decay) * param`` after every optimizer step; buffers are copied.

    The EMA model is a deep copy of the (possibly parallelized) model, so its parameters are sharded
    exactly like the model's and checkpoint through the same state-dict path: the EMA is a DCP
    ``Stateful`` (the checkpoint's ``ema`` tensors).
    """

    def __init__(self, model: nn.Module, decay: float, module: nn.Module | None = None):
        self.decay = decay
        if module is None:
            module = copy.deepcopy(model)
        else:  # FSDP modules cannot be deep-copied: the caller built a second, identically sharded model
            with torch.no_grad():
                for d, s in zip(module.parameters(), model.parameters()):
                    d.copy_(s.detach())
                for d, s in zip(module.buffers(), model.buffers()):
                    d.copy_(s)
        self.module = module.eval()
        for p in self.module.parameters():
            p.requires_grad_(False)

    @classmethod
    def build(cls, decay: float, *, model: nn.Module, new_model=None) -> EMA | None:
        """The EMA of ``model``, the family's model a task trains, at ``decay`` (``train.ema_decay``;
        None when 0; a task's own parts have none: they are not exported). A sharded model cannot be
        deep-copied: with several ranks, ``new_model()`` builds a second model laid out like it
        (:meth:`vitscale.run.Run.new_model`)."""
        if decay <= 0:
            return None
        return cls(model, decay, module=new_model() if new_model is not None else None)

    @torch.no_grad()
    def update(self, model: nn.Module, ok: torch.Tensor | None = None) -> None:
        """One EMA step towards ``model``. ``ok``: a device scalar, 1.0 = take the step, 0.0 = leave
        the EMA as it is (a skipped non-finite step, decided on the device: no host sync)."""
        move_towards(self.module.parameters(), model.parameters(), 1.0 - self.decay, ok)  # shard by shard
        for b_ema, b in zip(self.module.buffers(), model.buffers()):
            b_ema, b = _local(b_ema), _local(b)
            b_ema.copy_(b if ok is None else torch.where(ok.bool(), b, b_ema))

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.module)

    def load_state_dict(self, sd: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.module, sd)


