"""Collapse signals of self-supervised training, computed at log steps only (``Task.log_metrics``): the
effective rank of a batch's embeddings (RankMe) and the warning when it falls low.

**RankMe** (Garrido et al. 2023, "RankMe: Assessing the downstream performance of pretrained
self-supervised representations by their rank", arXiv 2210.02885, eq. 1): for the ``(n, d)`` matrix
of ``n`` embeddings, with singular values ``s_k``, ``p_k = s_k / sum(s) + eps`` and
``RankMe = exp(-sum_k p_k log p_k)`` (eps = 1e-7, the paper's). It lies in ``[1, min(n, d)]``: 1 when
every embedding points the same way (complete collapse), ``min(n, d)`` when the singular values are
all equal.

**The warning**: one line when the rank has stayed below :func:`rank_floor` — ``max(2, 1% of min(n,
d))`` — at :data:`HOLD` log steps in a row and over :data:`HOLD_FRACTION` of the run's steps, and
again only after it has come back above (:class:`Alarm`); a run too short for three log steps warns
at its last step when the signal was past it at every log step (at least two) of the run. Below 2 the batch's embeddings lie close to
one line (complete collapse, rank 1, is RankMe's lower bound). The 1% floor for dimensional collapse
at large batch and width is this project's choice, not the paper's: RankMe gives no universal
threshold (its use is comparing runs), so the alarm is deliberately loose — a run above it may still
be poor.

**The teacher's targets** (self-distillation, :mod:`vitscale.tasks.dino`): their mean entropy and the
KL divergence of their batch mean from uniform (:func:`teacher_signals`), with a warning when either
stays above 0.9 x log K (:class:`TeacherWatch`), by the same rule.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

EPS = 1e-7  # RankMe's epsilon (arXiv 2210.02885, section 3)


def effective_rank(z: torch.Tensor) -> torch.Tensor:
    """RankMe of the embeddings ``z`` ``(n, d)``: ``exp`` of the entropy of the L1-normalised singular
    values; a 0-dimensional float32 tensor on ``z``'s device (an SVD: call it at log steps only). NaN
    when ``z`` holds a non-finite number (its step was not applied: the non-finite guard's to report).
    The rank does not change with the scale of ``z``, so ``z`` is divided by its largest magnitude first:
    finite embeddings near float32's limit (weights x 1e20) no longer overflow inside the SVD, which
    then failed with ``LinAlgError``."""
    z = z.detach().float()
    if not bool(torch.isfinite(z).all()):
        return torch.tensor(float("nan"), device=z.device)
    top = z.abs().max()
    if top > 0:
        z = z / top
    try:
        s = torch.linalg.svdvals(z)
    except torch.linalg.LinAlgError:  # no convergence: no value this log step, never a traceback
        return torch.tensor(float("nan"), device=z.device)
    p = s / s.sum().clamp_min(torch.finfo(torch.float32).tiny) + EPS
    return torch.exp(-(p * p.log()).sum())


HOLD = 3
"""Log steps in a row a signal must stay past its threshold before its warning line (and over at least
:data:`HOLD_FRACTION` of the run's steps)."""
HOLD_FRACTION = 0.05
"""The share of the run's steps over which a signal must stay past its threshold before its warning
line (and at :data:`HOLD` log steps in a row). Passing it for a while is no alarm: a random teacher's
centred targets rise past the entropy threshold in the first steps and fall back as it learns —
``digits_dino`` (threshold 0.9 x log 256 = 4.99 nats) logged every step is past it at 16, 6 and 38 log
steps in a row at most for seeds 0-2 (seed 2: steps 12-49), where 5% of its 1,200 steps is 60; logged
every 25 steps, at step 25 only. An alarm that every healthy run raises is one users learn to skip;
a collapse that matters holds for much longer."""


class Alarm:
    """One warning per excursion of a signal past its threshold: :meth:`__call__` is true at the first
    log step at which the signal has been past it at :data:`HOLD` log steps in a row and over at least
    ``min_span`` steps since the first of them (:attr:`since`), then false until the signal has come
    back and gone past again. ``min_span`` is 0 until :meth:`for_run` sets it from the run's length.

    At the run's last step (known from :meth:`for_run`) fewer log steps in a row suffice when the
    signal was past it at every log step this alarm saw, at least two: a run logged fewer than
    :data:`HOLD` times (``train.max_steps=2``, or ``train.log_every`` above the run's length: its first
    and last steps) can warn too. One log step alone never warns: a run's first step cannot tell a
    random start from a collapse (a fresh DINO teacher's targets are near uniform)."""

    def __init__(self, hold: int = HOLD):
        self.hold, self.count, self.min_span, self.said = hold, 0, 0, False
        self.since: int | None = None
        self.total: int | None = None  # the run's last step (for_run)
        self.seen = 0  # log steps this alarm was asked about

    def for_run(self, total_steps: int) -> None:
        """Hold for :data:`HOLD_FRACTION` of a run of ``total_steps`` steps (its last step: the short-run rule)."""
        self.min_span = math.ceil(HOLD_FRACTION * total_steps)
        self.total = total_steps

    def __call__(self, step: int, past: bool) -> bool:
        self.seen += 1
        if not past:
            self.count, self.since, self.said = 0, None, False
            return False
        self.count += 1
        if self.count == 1:
            self.since = step
        hold = self.hold
        if self.total is not None and step >= self.total and self.count == self.seen:  # past at every log step
            hold = min(hold, max(self.seen, 2))
        if self.said or self.count < hold or step - self.since < self.min_span:
            return False
        self.said = True
        return True


def rank_floor(n: int, d: int) -> float:
    """The effective rank below which :class:`RankWatch` warns (module docstring)."""
    return max(2.0, 0.01 * min(n, d))


def gather_rows(z: torch.Tensor, group=None) -> torch.Tensor:
    """Every data-parallel rank's rows of ``z`` (equal counts), concatenated in rank order (no gradient)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return z
    out = z.new_empty((dist.get_world_size(group) * z.shape[0], *z.shape[1:]))
    dist.all_gather_into_tensor(out, z.contiguous(), group=group)
    return out


class RankWatch:
    """The ``train_rankme`` metric of the embeddings a task kept from its last step (gathered over the
    data-parallel ranks, so the value does not depend on their number), and its warning line."""

    def __init__(self, group=None, what: str = "the batch's embeddings"):
        self.group, self.what = group, what
        self.alarm = Alarm()
        self.last: torch.Tensor | None = None

    def for_run(self, total_steps: int) -> None:
        """Warn only for a fall that holds over :data:`HOLD_FRACTION` of this run's steps."""
        self.alarm.for_run(total_steps)

    def keep(self, z: torch.Tensor) -> None:
        """Remember this step's embeddings ``(B, D)`` (a reference: no copy, no host read)."""
        self.last = z.detach()

    def read(self, step: int) -> tuple[dict[str, float], list[str]]:
        """``({"train_rankme": value}, [warning])`` from the last kept embeddings (every rank calls it)."""
        if self.last is None:
            return {}, []
        z = gather_rows(self.last, self.group)
        rank = float(effective_rank(z))
        if not math.isfinite(rank):  # the last step's embeddings were not finite: no metric (a bare NaN in JSON)
            return {}, []
        floor = rank_floor(*z.shape)
        lines = []
        if self.alarm(step, rank < floor):
            lines.append(f"warning: step {step}: the effective rank (RankMe) of {self.what} is {rank:.2f}, below "
                         f"{floor:g} (of at most {min(z.shape)}) since step {self.alarm.since}: the representation "
                         "may be collapsing")  # fmt: skip
        return {"train_rankme": rank}, lines


def teacher_signals(p: torch.Tensor, group=None) -> tuple[float, float]:
    """``(entropy, kl_uniform)`` of the teacher's targets ``p`` ``(n, K)`` (rows on the simplex), over
    the rows of every data-parallel rank, in nats: the mean entropy of a row, ``mean_i -sum_k p_ik log
    p_ik``, and the KL divergence of their mean ``pbar`` from the uniform distribution, ``log K -
    H(pbar)`` (the decomposition of DINO's collapse analysis, Caron et al. 2021, arXiv 2104.14294,
    section 5.3)."""
    p = p.detach().float()
    k = p.shape[-1]
    stats = torch.cat([(-(p * p.clamp_min(1e-30).log()).sum(dim=-1)).sum()[None], p.sum(dim=0),
                       torch.tensor([float(p.shape[0])], device=p.device)])  # fmt: skip
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(stats, group=group)
    n = stats[-1]
    pbar = stats[1:-1] / n
    h_bar = -(pbar * pbar.clamp_min(1e-30).log()).sum()
    return float(stats[0] / n), max(0.0, float(math.log(k) - h_bar))  # >= 0 (float rounding near uniform)


ENTROPY_HIGH = 0.9
"""Warn when the mean entropy of the teacher's targets exceeds this fraction of ``log K``: every target
close to uniform (the collapse that centring alone brings about)."""
KL_HIGH = 0.9
"""Warn when the KL divergence of the mean target from uniform exceeds this fraction of ``log K``: the
batch's mass on a few prototypes (the collapse that sharpening alone brings about)."""


class TeacherWatch:
    """``train_teacher_entropy`` and ``train_teacher_kl_uniform`` of the teacher targets a task kept from
    its last step, and a warning line when one has stayed past its threshold (:data:`ENTROPY_HIGH`,
    :data:`KL_HIGH`: this project's choice, loose by design — DINO's paper shows both collapses reach
    ``log K``) at :data:`HOLD` log steps in a row and over :data:`HOLD_FRACTION` of the run, again only
    after it has come back (:class:`Alarm`)."""

    def __init__(self, group=None):
        self.group = group
        self.alarms = {"entropy": Alarm(), "kl": Alarm()}
        self.last: torch.Tensor | None = None

    def for_run(self, total_steps: int) -> None:
        """Warn only for an excursion that holds over :data:`HOLD_FRACTION` of this run's steps."""
        for alarm in self.alarms.values():
            alarm.for_run(total_steps)

    def keep(self, p: torch.Tensor) -> None:
        self.last = p.detach()

    def read(self, step: int) -> tuple[dict[str, float], list[str]]:
        if self.last is None:
            return {}, []
        ent, kl = teacher_signals(self.last, self.group)
        log_k = math.log(self.last.shape[-1])
        lines = []
        for name, value, frac, what in (("entropy", ent, ENTROPY_HIGH, "every target is close to uniform"),
                                        ("kl", kl, KL_HIGH, "the targets fall on few prototypes")):  # fmt: skip
            alarm = self.alarms[name]
            if alarm(step, log_k > 0 and value > frac * log_k):
                label = "entropy" if name == "entropy" else "KL divergence from uniform"
                lines.append(f"warning: step {step}: the teacher's {label} is {value:.3f} nats, above {frac:g} x log K "
                             f"= {frac * log_k:.3f} since step {alarm.since}: {what}; the representation may be "
                             "collapsing")  # fmt: skip
        return {"train_teacher_entropy": ent, "train_teacher_kl_uniform": kl}, lines


def frozen_backbone_evals(cfg) -> list[dict]:
    """The ``evals:`` of a self-supervised run that sets none (its task's ``default_evals``): DINO's
    ``knn`` every ``eval.every`` steps and at the end, and a ``linear_probe`` of the frozen features at
    the end (``eval.probe_*``) — what tells whether the backbone learnt anything, beside the signals above."""
    ec = cfg.eval
    return [{"kind": "knn", "name": "knn", "every": ec.every},
            {"kind": "linear_probe", "name": "linear_probe", "every": 0, "l2": list(ec.probe_l2),
             "holdout": ec.probe_holdout, "max_iter": ec.probe_max_iter, "features": ec.probe_features,
             "blocks": ec.probe_blocks}]  # fmt: skip


__all__ = ["EPS", "ENTROPY_HIGH", "HOLD", "HOLD_FRACTION", "KL_HIGH", "Alarm", "RankWatch", "TeacherWatch",
           "effective_rank", "frozen_backbone_evals", "gather_rows", "rank_floor", "teacher_signals"]
