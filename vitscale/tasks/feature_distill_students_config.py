"""``distill.students`` of ``train.task=feature_distill``: one teacher forward, several students in one job
(DINOv3's multi-student distillation, facebookresearch/dinov3 ``dinov3/train/multidist_meta_arch.py``;
its students are listed with their ranks in ``multidistillation.students``,
``dinov3/configs/config.py`` lines 121-170). Each entry names a student variant and the ranks of the
job it trains on; :mod:`vitscale.tasks.feature_distill_students` trains it (docs/distillation.md,
"Several students in one job")::

    distill:
      teachers: [{name: dino, path: runs/digits_dino}]
      students:
        - {name: small, overrides: {hidden_size: 32}, ranks: [0]}
        - {name: base, model: vit_s16, ranks: [1, 2, 3], changes: {optim.lr: 5e-4}}

Bad values are refused as the config loads, in one line naming the entry and the key (exit 2): an
entry's own fields by its ``__post_init__`` (the loader prefixes ``distill.students[i]``), two students
with one name, a rank listed twice and a list where some students give ranks and others do not by
:func:`check_students`; ranks against the job's size when it starts
(:func:`vitscale.tasks.feature_distill_students.student_layout`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vitscale.config.ranges import COUNT_MAX, check_ranges
from vitscale.errors import ConfigError

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")

STUDENT_CHANGES = ("optim.", "schedule.", "train.grad_clip", "train.ema_decay")
"""The keys a student may set apart from the job's (``changes``): how it is optimised. Everything that
decides what a step's images are (``data.*``, ``train.batch_size`` / ``grad_accum`` / ``seed`` /
``max_steps``), the precision and the teachers are the job's: the students share each batch's teacher
features, so they must read the same batches."""


@dataclass
class StudentConfig:
    """One student of a job of several (``distill.students``): its variant and the ranks it trains on."""

    RANGES: ClassVar[dict[str, tuple]] = {"ranks": (0, COUNT_MAX)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``)."""

    name: str = ""
    """The student's name: its run folder is ``<train.output_dir>/students/<name>/`` (config, checkpoints,
    metrics, export). Letters, digits and ``_``, starting with a letter; required."""
    model: str | None = None
    """The student's registered variant (``vitscale models``); None = the job's ``model.name``, with the
    job's ``model.overrides`` and then this entry's ``overrides``."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Changes to the student's model config (``hidden_size: 32``); with ``model`` set they replace the
    job's ``model.overrides`` (as a new ``model.name`` on the command line drops the YAML's)."""
    ranks: list[int] = field(default_factory=list)
    """The ranks of the job (torchrun's ``RANK``) this student trains on, its data-parallel group; every
    rank of the job belongs to one student. Empty in every entry = the job's ranks split evenly, in
    order."""
    changes: dict[str, Any] = field(default_factory=dict)
    """Dotted keys of the job's config set otherwise for this student (``{optim.lr: 5e-4}``): only how it
    is optimised, :data:`STUDENT_CHANGES`."""

    def __post_init__(self):
        # ValueError: the config loader names the entry (``distill.students[i]: ...``)
        if not self.name or not _NAME.match(self.name):
            raise ValueError(f"name={self.name!r}: give the student a name of letters, digits and _ (e.g. name: small), "
                             "starting with a letter: its run folder is students/<name>")  # fmt: skip
        self.ranks = [int(r) for r in self.ranks]
        check_ranges(self, None)
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"ranks={self.ranks}: a rank is listed twice")
        for key in self.changes:
            if not (isinstance(key, str) and any(key.startswith(k) if k.endswith(".") else key == k for k in STUDENT_CHANGES)):
                allowed = ", ".join(k + "*" if k.endswith(".") else k for k in STUDENT_CHANGES)
                raise ValueError(f"changes: {key!r} is the job's, not a student's: every student reads the job's batches "
                                 f"(the teachers' features are shared); a student may change {allowed}")  # fmt: skip


def check_students(students: list[StudentConfig]) -> None:
    """ConfigError (one line) for two students with one name, a rank in two students, or ranks given by
    some students only."""
    seen: dict[str, int] = {}
    owner: dict[int, str] = {}
    for i, s in enumerate(students):
        if s.name in seen:
            raise ConfigError(f"distill.students[{i}] and distill.students[{seen[s.name]}] are both named {s.name!r}: "
                              "give each student its own name")  # fmt: skip
        seen[s.name] = i
        for r in s.ranks:
            if r in owner:
                raise ConfigError(f"distill.students: rank {r} is in student {owner[r]!r} and in student {s.name!r}: "
                                  "each rank trains one student")  # fmt: skip
            owner[r] = s.name
    given = [bool(s.ranks) for s in students]
    if any(given) and not all(given):
        missing = next(s.name for s in students if not s.ranks)
        raise ConfigError(f"distill.students[{missing}] lists no ranks while other students do: give every student its "
                          "ranks, or none (the job's ranks are then split evenly)")  # fmt: skip


__all__ = ["STUDENT_CHANGES", "StudentConfig", "check_students"]
