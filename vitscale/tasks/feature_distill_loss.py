"""Losses of feature distillation (the future ``train.task=feature_distill``): the student's adaptor
outputs against each teacher's standardised features (:mod:`.feature_distill_norm`), per token kind,
per teacher, then over the teachers — UNIC's loss (Sariyildiz et al. 2024, arXiv 2408.05088;
naver/unic at 02269db, ``modeling/losses.py``; the same in naver/dune at afad549, ``model/losses.py``).

**Per token** (UNIC losses.py lines 54-56, 86-102): ``cos_weight x (1 - cos(s, t)) + smooth_l1_weight x
mean_d smoothL1_beta(s_d - t_d)``; UNIC's weights are 0.5 / 0.5 (``--lam_lcos`` / ``--lam_lsl1``
defaults, naver/unic ``main_unic.py`` lines 81-92; DUNE ``model/losses.py`` lines 14-15) and
``beta = 1`` (losses.py line 96). Computed in float32 (DUNE: under an autocast to float32, losses.py
line 58).

**Per image and teacher**: the patch loss is the mean over the patch tokens (UNIC losses.py lines
58-60); the token kinds' losses are averaged (line 74: ``stack(...).mean``) — here weighted,
``sum_k w_k L_k / sum_k w_k`` with ``summary_weight`` / ``patch_weight`` (1 / 1: UNIC's mean).

**Over the teachers** (UNIC ``modeling/teacher_dropping.py`` lines 5-37): with ``c[t, b]`` the
coefficient of teacher ``t`` on image ``b`` (1 without dropping), ``loss = sum_{t,b} w_t c[t,b]
L[t,b] / sum_{t,b} c[t,b]`` — UNIC's normalisation ("each image contributes to the loss with equal
weight", lines 28-32), the coefficients treated as constants; ``w_t`` is the teacher's ``weight``
(all 1: UNIC's loss exactly).

**Teacher dropping** (UNIC ``_get_teacher_coefficients_by_loss``, teacher_dropping.py lines 40-66,
``--t_drop_prob`` 0.5, main_unic.py lines 75-80): for each image the teacher with the highest loss is
kept, and every other teacher is dropped with probability ``p``. UNIC draws with Python's
``random``; here each image's draws are keyed by ``(seed, step, the image's dataset index)``
(:mod:`vitscale.data.keyed`, as MAE's masks): the same whichever rank holds the image, and after a
resume. The denominator ``sum c`` is this rank's (UNIC's: its loss per rank, DDP averaging the
gradients); ``count`` gives another (the global sum over the ranks divided by their number makes
any number of ranks one process's loss).

**Metrics** (detached tensors, no host read): per teacher ``train_<name>_loss`` (its mean ``L``),
``train_<name>_<kind>_cos`` (mean cosine of the adaptor output and the standardised teacher feature)
and, with dropping, ``train_<name>_share`` (its share of the coefficients; UNIC logs ``t_coeff_<name>``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vitscale.data import keyed

STREAM_TEACHER_DROP = 48  # keyed-randomness stream tag (vitscale.data.keyed 1-9, token labeling 11, MAE 12-13, DINO 14-16)


@dataclass(frozen=True)
class TeacherLoss:
    """The loss settings of one teacher (the fields of its ``distill.teachers`` entry of the same names)."""

    name: str
    weight: float = 1.0
    cos_weight: float = 0.5
    smooth_l1_weight: float = 0.5
    smooth_l1_beta: float = 1.0
    summary_weight: float = 1.0
    patch_weight: float = 1.0

    @classmethod
    def of(cls, entry) -> TeacherLoss:
        """From a ``distill.teachers`` entry (:class:`~vitscale.tasks.feature_distill_config.FeatureTeacherConfig`)."""
        return cls(entry.name, entry.weight, entry.cos_weight, entry.smooth_l1_weight, entry.smooth_l1_beta,
                   entry.summary_weight, entry.patch_weight)  # fmt: skip


def cosine_loss(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``1 - cos(s, t)`` over the last dimension (UNIC losses.py lines 86-93)."""
    return 1 - F.cosine_similarity(s, t, dim=-1)


def smooth_l1(s: torch.Tensor, t: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """Smooth L1 averaged over the last dimension (UNIC losses.py lines 96-102)."""
    return F.smooth_l1_loss(s, t, reduction="none", beta=beta).mean(dim=-1)


def kind_loss(s: torch.Tensor, t: torch.Tensor, spec: TeacherLoss) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss per image (B,), cosine per image (B,))`` of one token kind: ``s`` and ``t`` ``(B, D)``
    (summary) or ``(B, N, D)`` (patches, averaged over the tokens), in float32."""
    if s.shape != t.shape:
        raise ValueError(f"teacher {spec.name!r}: adaptor output {tuple(s.shape)} and teacher features {tuple(t.shape)} differ")
    with torch.autocast(s.device.type, enabled=False):  # float32 (DUNE: autocast to float32, losses.py line 58)
        s, t = s.float(), t.float()
        cos = 1 - cosine_loss(s, t)
        loss = spec.cos_weight * (1 - cos) + spec.smooth_l1_weight * smooth_l1(s, t, spec.smooth_l1_beta)
    if loss.ndim == 2:
        loss, cos = loss.mean(dim=1), cos.mean(dim=1)
    return loss, cos


def teacher_loss(student: dict[str, torch.Tensor], teacher: dict[str, torch.Tensor],
                 spec: TeacherLoss) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
    """One teacher's loss per image ``(B,)``: its token kinds' losses (the kinds of ``teacher``),
    weighted by ``summary_weight`` / ``patch_weight``; and each kind's mean cosine (detached)."""
    total, norm, cos = 0.0, 0.0, {}
    for kind, t in teacher.items():
        w = spec.summary_weight if kind == "summary" else spec.patch_weight
        loss, c = kind_loss(student[kind], t, spec)
        total, norm = total + w * loss, norm + w
        cos[kind] = c.detach().mean()
    if not teacher or norm <= 0:
        raise ValueError(f"teacher {spec.name!r}: no token kind with a positive weight to learn from")
    return total / norm, cos


def drop_teachers(losses: torch.Tensor, p: float, seed: int, step: int, index: torch.Tensor) -> torch.Tensor:
    """UNIC's teacher coefficients ``(T, B)`` (module docstring): 1 for each image's highest-loss
    teacher; every other teacher 0 with probability ``p``. ``losses (T, B)``; ``index``: the images'
    dataset indices (CPU), keying their draws. ``p = 0``: all ones."""
    T, B = losses.shape
    if p <= 0 or T == 1:
        return torch.ones_like(losses)
    draws = torch.stack([torch.rand(T, generator=keyed.torch_gen(seed, step, int(i), STREAM_TEACHER_DROP))
                         for i in index.tolist()], dim=1)  # (T, B)  # fmt: skip
    keep = (draws >= p).to(losses.device, non_blocking=True)
    top = losses.detach().argmax(dim=0)  # (B,)
    keep[top, torch.arange(B, device=losses.device)] = True
    return keep.to(losses.dtype)


def combine_teachers(losses: torch.Tensor, weights: torch.Tensor, coeffs: torch.Tensor,
                     count: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """``sum_{t,b} w_t c[t,b] L[t,b] / count`` (``count`` None: ``sum c``, UNIC's normalisation)."""
    c = coeffs.detach()
    count = c.sum() if count is None else count
    return (weights.to(losses)[:, None] * c * losses).sum() / count


def feature_distill_loss(student: dict[str, dict[str, torch.Tensor]], teacher: dict[str, dict[str, torch.Tensor]],
                         specs: list[TeacherLoss], *, drop: float = 0.0, seed: int = 0, step: int = 0,
                         index: torch.Tensor | None = None, count: torch.Tensor | None = None,
                         ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
    """The distillation loss of a batch and its per-teacher metrics (module docstring).

    ``student[name][kind]``: the adaptor outputs (on the teacher's grid); ``teacher[name][kind]``: the
    standardised teacher features; ``specs``: the teachers' settings, in order. ``drop``: UNIC's
    teacher-drop probability (needs ``index``, the images' dataset indices); ``count``: the
    denominator (None = this rank's ``sum c``)."""
    per, metrics = [], {}
    for spec in specs:
        loss, cos = teacher_loss(student[spec.name], teacher[spec.name], spec)
        per.append(loss)
        metrics[f"train_{spec.name}_loss"] = loss.detach().mean()
        for kind, c in cos.items():
            metrics[f"train_{spec.name}_{kind}_cos"] = c
    losses = torch.stack(per)  # (T, B)
    if drop > 0 and len(specs) > 1:
        if index is None:
            raise ValueError("teacher dropping draws per image: give the images' dataset indices")
        coeffs = drop_teachers(losses, drop, seed, step, index)
        share = coeffs.sum(dim=1) / coeffs.sum()
        for spec, s in zip(specs, share):
            metrics[f"train_{spec.name}_share"] = s.detach()
    else:
        coeffs = torch.ones_like(losses)
    weights = torch.tensor([s.weight for s in specs], dtype=torch.float32)
    return combine_teachers(losses, weights, coeffs, count), metrics


__all__ = ["STREAM_TEACHER_DROP", "TeacherLoss", "combine_teachers", "cosine_loss", "drop_teachers", "feature_distill_loss",
           "kind_loss", "smooth_l1", "teacher_loss"]  # fmt: skip
