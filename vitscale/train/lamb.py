"""LAMB (You et al. 2019, arXiv 1904.00962, Algorithm 2), as DeiT III trains with it (``--opt fusedlamb``:
NVIDIA apex ``FusedLAMB``, whose behaviour timm's ``timm/optim/lamb.py`` reproduces without apex).

Per parameter ``p`` with gradient ``g``, at step ``t`` (both moments bias-corrected, as apex's
``bias_correction=True``; the first moment averaged, ``grad_averaging=True``)::

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g^2
    u = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * p
    r = |p| / |u|   (1 where either norm is 0; only in groups with weight_decay != 0, apex's
                     ``use_nvlamb=False``: norms, biases and tokens take the plain Adam step)
    p = p - lr * r * u

apex's ``max_grad_norm=1.0`` (the global gradient norm clipped before the moments) is the trainer's
``train.grad_clip`` here, done once for every optimizer (``vitscale.train.nonfinite.clip_gradients``):
the DeiT III recipe sets it to 1.0. The norms ``|p|`` and ``|u|`` are those of the whole tensor also
when FSDP2 / tensor parallelism shard it (DTensor parameters: the local shards are updated, the norms
reduced over the parameter's mesh), so the update is the same on any layout.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _reduce_groups(p: torch.Tensor) -> tuple:
    """The process groups over which ``p``'s shards must be summed to cover the whole tensor (the mesh
    dimensions it is sharded over; none for a plain tensor or a replicated one)."""
    if not isinstance(p, DTensor):
        return ()
    return tuple(p.device_mesh.get_group(d) for d, pl in enumerate(p.placements) if pl.is_shard())


def _whole_norms(pairs: list[tuple[torch.Tensor, tuple]]) -> list[torch.Tensor]:
    """The L2 norms of whole tensors from their shards' sums of squares: ``pairs`` of (sum of squares,
    process groups to sum over); one ``all_reduce`` per distinct set of groups, not one per tensor."""
    out: list[torch.Tensor | None] = [None] * len(pairs)
    by_groups: dict[tuple, list[int]] = {}
    for i, (_, groups) in enumerate(pairs):
        by_groups.setdefault(groups, []).append(i)
    for groups, idx in by_groups.items():
        sums = torch.stack([pairs[i][0] for i in idx])
        for g in groups:
            torch.distributed.all_reduce(sums, group=g)
        for i, v in zip(idx, sums.sqrt().unbind(0), strict=True):
            out[i] = v
    return out  # type: ignore[return-value]


def _sq(t: torch.Tensor) -> torch.Tensor:
    t = t.float() if t.dtype in (torch.float16, torch.bfloat16) else t
    return t.pow(2).sum()


class Lamb(torch.optim.Optimizer):
    """``Lamb(params, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)``: the update in the module
    docstring; state per parameter: ``step``, ``exp_avg``, ``exp_avg_sq`` (Adam's names, so checkpoints
    and their resharding treat it as they treat Adam). The norms of a group's sharded parameters are
    summed over the ranks together (one collective per mesh layout and step)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01):  # fmt: skip
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"Lamb: lr {lr}, eps {eps}, weight_decay {weight_decay} must be >= 0 and betas {betas} in [0, 1)")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            wd, eps, lr = group["weight_decay"], group["eps"], group["lr"]
            todo = []  # (local weights, local update, reduce groups)
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = float(state["step"])
                w, g = _local(p), _local(p.grad)
                m, v = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
                m.lerp_(g, 1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                denom = (v / (1 - beta2**t)).sqrt_().add_(eps)
                update = (m / (1 - beta1**t)).div_(denom)
                if wd != 0:
                    update.add_(w, alpha=wd)
                todo.append((w, update, _reduce_groups(p)))
            if wd != 0 and todo:  # the trust ratio |w| / |u| of each whole tensor
                norms = _whole_norms([(_sq(x), gr) for w, u, gr in todo for x in (w, u)])
                for i, (_, update, _) in enumerate(todo):
                    w_norm, u_norm = norms[2 * i], norms[2 * i + 1]
                    ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                    update.mul_(ratio.to(update.dtype))
            for w, update, _ in todo:
                w.add_(update, alpha=-lr)
        return loss


__all__ = ["Lamb"]
