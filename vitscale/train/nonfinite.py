"""Non-finite steps: a step whose loss or gradient norm is not finite is not applied, and counted.

The decision is one flag, the same on every rank: ``isfinite(loss) & isfinite(grad_norm)`` of this
rank, all-reduced (minimum) over the world when there are several ranks — one 4-byte all-reduce per
step, queued on the device like the gradient reductions (no host wait). The gradient norm is
already global (:func:`vitscale.distributed.utils.clip_grad_norm_`); the loss is not, so a rank
whose loss alone is not finite still stops every rank's update.

How the update is skipped, without making the host wait for the device where it can:

- **fused optimizers** (``optim.fused=auto`` on CUDA and on the CPU with torch >= 2.4, or ``fused``): on the device. The flag goes
  to the optimizer as ``found_inf``, the argument PyTorch's own ``GradScaler`` uses to skip fused
  Adam / AdamW / SGD updates (``torch/optim/adam.py``, ``torch/amp/grad_scaler.py``): parameters,
  moments and Adam's step count stay as they were. The EMA moves by ``(1 - decay) x flag``, i.e.
  not at all on a skipped step. No host synchronisation.
- **foreach / for-loop optimizers** (``optim.fused=foreach|none``, or ``auto`` without fused kernels): the flag is
  read on the host once per step and the optimizer step and EMA update are not called — what
  ``GradScaler`` does for optimizers without ``found_inf``. On the CPU this costs nothing (the
  computation is not asynchronous); on a GPU it is one synchronisation per step: the host waits
  for the backward pass before launching the optimizer.

Gradient clipping (``train.grad_clip``) of the global norm with fused kernels is folded into the same call: the
kernels divide every gradient by ``grad_scale`` as they read it (the other argument ``GradScaler``
passes), so :func:`clip_gradients` computes the norm and hands ``max(1, (norm + 1e-6) / max_norm)`` to
:func:`apply_update` instead of rewriting every gradient first (``torch.nn.utils.clip_grad_norm_``'s
in-place multiply): one pass over the gradients less per step, the same update. Clipping each part or
each parameter on its own (``train.grad_clip_scope``: DINOv2 / DINOv3, DINO v1) scales the gradients in
place first, whatever the optimizer.

A skipped step keeps its number: the learning rate is a pure function of the step (nothing to undo)
and the data moves on. The counts live on the device and are read at log steps and before every
checkpoint (sync points that exist anyway); more than ``train.max_nonfinite_steps`` in the run
(counted across resumes) or more than ``train.max_consecutive_nonfinite`` in a row stops the run
with :class:`NonFiniteError`, before anything else is saved.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import NonFiniteError, UserError  # noqa: F401 - NonFiniteError: raised here, exported


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` skips an update on the device through ``found_inf`` (fused kernels)."""
    return bool(optimizer.defaults.get("fused"))


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Make ``found_inf`` skips safe from the first step: fused SGD creates its momentum buffers
    uninitialised (``torch.empty_like``) on its first step and a skipped first step would leave them
    so; zeros give the same first update (``buf = momentum * 0 + grad`` with no dampening)."""
    if not (skips_on_device(optimizer) and isinstance(optimizer, torch.optim.SGD)):
        return
    for group in optimizer.param_groups:
        if group["momentum"] and not group["dampening"]:
            for p in group["params"]:
                optimizer.state[p].setdefault("momentum_buffer", torch.zeros_like(p, memory_format=torch.preserve_format))


def clip_gradients(params: list[torch.Tensor], max_norm: float, *, world: int, fold: bool,
                   groups: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """The global gradient norm of ``params`` (before clipping) and the clipping to ``max_norm``
    (``inf`` = none): with ``fold`` (fused kernels) the divisor for :func:`apply_update`'s
    ``grad_scale``, gradients untouched; else done in place, divisor None. ``groups``: a group number
    per parameter, each group clipped on its own (``train.grad_clip_scope``: ``part``, ``parameter``),
    in place; None: one group, the global norm."""
    from ..distributed.utils import clip_grad_norm_, clip_grad_norms_, grad_norm

    if groups is not None and max_norm != float("inf"):
        return clip_grad_norms_(params, groups, max_norm), None
    if fold and max_norm != float("inf"):
        grads = [p.grad for p in params]
        norm = grad_norm(params) if world > 1 else torch.nn.utils.get_total_norm(grads)
        return norm, ((norm.float() + 1e-6) / max_norm).clamp(min=1.0)
    # several ranks: norms per mesh (DTensors of FSDP x TP); one process: PyTorch's foreach clipping
    return (clip_grad_norm_(params, max_norm) if world > 1 else torch.nn.utils.clip_grad_norm_(params, max_norm)), None


def apply_update(optimizer: torch.optim.Optimizer, ok: torch.Tensor, *, on_device: bool,
                 grad_scale: torch.Tensor | None = None) -> torch.Tensor | bool:  # fmt: skip
    """The optimizer step of a step whose finite flag is ``ok``: on the device through ``found_inf``
    when ``on_device`` (fused kernels; their gradients divided by ``grad_scale`` when given:
    :func:`clip_gradients`), else decided on the host (see the module docstring). Returns what the
    parts that follow an update (the EMA) go by: ``ok`` itself on the device (they move by it: not at
    all on a skipped step), else whether the host applied the step."""
    if on_device:  # no host sync
        optimizer.found_inf = 1.0 - ok
        if grad_scale is not None:
            optimizer.grad_scale = grad_scale
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
            if grad_scale is not None:
                del optimizer.grad_scale
        return ok
    if bool(ok):  # the host decides (free on the CPU; one sync per step on a GPU)
        optimizer.step()
        return True
    return False


class NonFiniteGuard:
    """The per-step finite flag, the device-side counts and the budget check.

    ``total`` counts non-finite steps of the whole run (``start_total`` of them before a resume),
    ``run`` the current run of consecutive ones, ``longest`` the longest run since the last check.
    """

    def __init__(self, device: torch.device, max_total: int, max_consecutive: int, start_total: int = 0):
        self.max_total, self.max_consecutive = max_total, max_consecutive
        self._counts = torch.zeros(3, device=device, dtype=torch.float32)  # total, run, longest
        self._counts[0] = float(start_total)
        self.checked_total = self.start_total = int(start_total)

    @classmethod
    def build(cls, tc, *, device: torch.device, counters) -> NonFiniteGuard:
        """The guard of a run on ``device`` from its ``train`` group ``tc`` (``train.max_nonfinite_steps``,
        ``train.max_consecutive_nonfinite``), counting on from ``counters.nonfinite_steps`` (the
        run's so far, after a resume)."""
        return cls(device, tc.max_nonfinite_steps, tc.max_consecutive_nonfinite, counters.nonfinite_steps)

    def to(self, device: torch.device) -> NonFiniteGuard:
        self._counts = self._counts.to(device)
        return self

    def flag(self, loss: torch.Tensor, grad_norm: torch.Tensor, world: int) -> torch.Tensor:
        """1.0 when this step may be applied on every rank, else 0.0 (a float32 device scalar);
        records the step in the counts."""
        ok = (torch.isfinite(loss.detach().float()) & torch.isfinite(grad_norm.detach().float())).float()
        if world > 1 and dist.is_initialized():
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        ok = ok.reshape(()).to(self._counts.device)
        bad = 1.0 - ok
        total, run, longest = self._counts.unbind()
        new_run = (run + 1.0) * bad
        self._counts.copy_(torch.stack([total + bad, new_run, torch.maximum(longest, new_run)]))
        return ok

    def check(self, step: int, checkpoint: str | None) -> int:
        """Read the counts (a sync point); raise :class:`NonFiniteError` when over budget. Returns
        the run's total of non-finite steps."""
        total, _, longest = (int(v) for v in self._counts.tolist())
        self._counts[2] = self._counts[1]  # the longest run from here on starts with the current one
        self.checked_total = total
        over = []
        if self.max_consecutive >= 0 and longest > self.max_consecutive:
            over.append(f"{longest} in a row, more than train.max_consecutive_nonfinite={self.max_consecutive}")
        if self.max_total >= 0 and total > self.max_total:
            over.append(f"{total} in the run, more than train.max_nonfinite_steps={self.max_total}")
        if over:
            where = f"the last checkpoint, {checkpoint}, holds the model before them and is intact" if checkpoint else "no checkpoint was saved"
            raise NonFiniteError(
                f"stopped at step {step}: non-finite loss or gradient norm, {' and '.join(over)} (none of them "
                f"was applied); {where}. Lower optim.lr, raise schedule.warmup_steps or set train.grad_clip"
            )
        return total

    def require_progress(self, step: int, steps_run: int, checkpoint: str | None) -> None:
        """Raise :class:`NonFiniteError` when every one of the ``steps_run`` steps of this run was
        non-finite (none applied), whatever the budgets allow: such a run trained nothing and must not
        end as a success (nor export its untouched weights). A sync point: call it once, at the end."""
        total = self.check(step, checkpoint)
        if steps_run > 0 and total - self.start_total >= steps_run:
            raise NonFiniteError(
                f"every one of the {steps_run} steps of this run had a non-finite loss or gradient norm, so none was "
                f"applied and nothing was trained (no weights exported). Check data.mean / data.std and the data, "
                f"lower optim.lr or set train.grad_clip"
            )


__all__ = ["NonFiniteError", "NonFiniteGuard", "apply_update", "clip_gradients", "prepare_optimizer", "skips_on_device"]
