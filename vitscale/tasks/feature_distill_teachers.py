"""The teachers of feature distillation (``train.task=feature_distill``): each ``distill.teachers`` entry
read as a logit-distillation teacher is (:func:`vitscale.tasks.distill.build`), checked to give what the
student can match, and asked for its features.

- **Reading** (:func:`read_teacher`): any file ``checkpoint.init_from`` takes; an error reading it names
  the entry (``distill.teachers[<name>]=<path>: ...``). A CLIP (a vitscale CLIP run or file, an open_clip
  file with ``model: clip_*``) is matched on its **image tower** (``visual``: a ViT, whose tokens feed
  its ``image_proj``) and kept whole beside it: its text tower gives the zero-shot classifier through
  the student's adaptor for that teacher (RADIO's use, NVlabs/RADIO README "Zero Shot Inference";
  :mod:`.feature_distill_eval`). A model without tokens (a VOLO, a classifier family that declares
  none), and a teacher input that is no whole grid of the teacher's patches (the student's patch grid
  cannot be interpolated to it), are refused in one line before the first step.
- **Features** (:func:`teacher_features`): the teacher's summary (its pooled pre-logits output, the
  class token of a ``pool=token`` ViT, or the mean of its patch tokens: ``summary``) and its patch tokens
  on its own grid, float32, under ``no_grad`` in the run's precision.
- **Shapes** (:func:`check_features`, on one blank batch before the first step): a summary that is one
  vector per image, patch tokens ``(B, N, D)``, both of one width (the heads map to one width per
  teacher) — else one line naming the teacher.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import torch
from torch import nn

from vitscale.errors import CheckError, ConfigError, UserError

from .feature_distill_heads import TeacherFeatures


class ReadTeacher(NamedTuple):
    """A teacher read for feature distillation: its :class:`~vitscale.tasks.distill.Teacher` (whose
    ``model`` gives the tokens: a CLIP's image tower), the whole CLIP when the file holds one (None
    otherwise), and the lines the run prints about it."""

    teacher: object
    clip: nn.Module | None
    lines: list[str]


def _named(e: UserError, name: str) -> UserError:
    """``e`` with the logit teacher's keys (``distill.teacher=``, ``distill.teacher_img_size``, ...)
    replaced by the entry's (``distill.teachers[<name>]=``, ``distill.teachers[<name>].img_size``)."""
    if e.args and isinstance(e.args[0], str):
        msg = e.args[0].replace("distill.teacher=", f"distill.teachers[{name}]=")
        e.args = (re.sub(r"distill\.teacher_(\w+)", rf"distill.teachers[{name}].\1", msg), *e.args[1:])
    return e


def read_teacher(run, entry, autocast) -> ReadTeacher:
    """Teacher ``entry`` (a ``distill.teachers`` entry) for ``run``: read, its CLIP's image tower taken,
    checked to give tokens on a whole patch grid (module docstring)."""
    from vitscale.models.clip.model import CLIP

    from .distill import build
    from .feature_distill import as_logit_teacher

    try:
        got = build(run, as_logit_teacher(entry), autocast, classes=False)
    except UserError as e:
        raise _named(e, entry.name) from None
    teacher, clip, where = got.teacher, None, f"distill.teachers[{entry.name}]"
    lines = [line.replace("distill: teacher ", f"distill: teacher {entry.name!r}: ", 1) for line in got.lines[:-1]]
    if isinstance(teacher.model, CLIP):
        clip = teacher.model
        from torch.distributed.tensor import DTensor

        if any(isinstance(p, DTensor) for p in clip.parameters()):
            raise CheckError(f"{where}={entry.path}: a CLIP teacher is matched on its image tower alone, which a sharded "
                             f"layout cannot run on its own: set layout: replicated for it")  # fmt: skip
        teacher.model = clip.visual  # its tokens; the whole CLIP stays for the zero-shot classifier
        lines.append(f"distill: teacher {entry.name!r}: a CLIP: matched on its image tower (its text tower gives "
                     "the zero-shot classifier through the student's adaptor at evaluation)")  # fmt: skip
    if not getattr(teacher.model, "supports_tokens", False):
        raise ConfigError(f"{where}={entry.path}: its model {type(teacher.model).__name__} gives no tokens (a backbone "
                          "of a family that declares supports_tokens: a ViT) — the student has nothing to match")  # fmt: skip
    patch = teacher.model.cfg.patch_dim
    h, w = teacher.size
    if h % patch or w % patch:
        raise CheckError(f"{where}: its input {h}x{w} is no whole grid of its {patch}-pixel patches, so the student's "
                         f"patch grid cannot be interpolated to its grid: set img_size to a multiple of {patch}")  # fmt: skip
    return ReadTeacher(teacher, clip, lines)


def teacher_features(teacher, entry, images: torch.Tensor, *, timed: bool = True) -> TeacherFeatures:
    """Teacher ``entry``'s summary and patch tokens of a batch of the student's ``images``, float32, at
    its own size and normalisation. ``timed``: counted in its share of the step time (the training
    step's forward; an evaluation's is not)."""
    if timed:
        tok = teacher(images, tokens=True)
    else:
        with torch.no_grad(), teacher.autocast():
            tok = teacher.model(teacher.images(images), tokens=True)
    patches = tok.patches.float()
    summary = (tok.pooled if entry.summary == "class_token" else patches.mean(dim=1)).float()
    return TeacherFeatures(summary if "summary" in entry.tokens else None,
                           patches if "patch" in entry.tokens else None, tuple(tok.grid))  # fmt: skip


def check_features(name: str, f: TeacherFeatures) -> int:
    """The width of teacher ``name``'s features ``f`` (one blank batch's), or a :class:`CheckError` in
    one line: a summary that is not one vector per image (a ``pool=none`` model gives every token),
    patch tokens that are not ``(B, N, D)``, or a summary and patch tokens of two widths."""
    where = f"distill.teachers[{name}]"
    if f.summary is not None and f.summary.ndim != 2:
        raise CheckError(f"{where}: its summary is {tuple(f.summary.shape)}, not one vector per image (its model pools "
                         "no summary, e.g. pool=none): set summary: pooled (the patch tokens' mean) or tokens: [patch]")  # fmt: skip
    if f.patches is not None and f.patches.ndim != 3:
        raise CheckError(f"{where}: its patch tokens are {tuple(f.patches.shape)}, not (images, tokens, width)")
    if f.summary is not None and f.patches is not None and f.summary.shape[-1] != f.patches.shape[-1]:
        raise CheckError(f"{where}: its summary is {f.summary.shape[-1]} wide and its patch tokens "
                         f"{f.patches.shape[-1]} wide: its heads give one width per teacher; match one kind "
                         "(tokens: [summary] or tokens: [patch])")  # fmt: skip
    return next(t for t in (f.summary, f.patches) if t is not None).shape[-1]


__all__ = ["ReadTeacher", "check_features", "read_teacher", "teacher_features"]
