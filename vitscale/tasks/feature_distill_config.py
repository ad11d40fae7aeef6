"""Config group ``distill`` of feature distillation (the future ``train.task=feature_distill``: not
registered yet, see docs/distillation.md): one or more frozen teachers, each with the settings a
logit-distillation teacher has today (:class:`vitscale.tasks.distill_config.DistillConfig`'s
``teacher*`` fields, here without the prefix) plus its name, its weight, the token kinds it is
matched on, its adaptor heads, its losses and its feature standardisation.

A YAML gives the teachers as a list::

    distill:
      teacher_drop: 0.5
      teachers:
        - {name: dino, path: runs/digits_dino, tokens: [summary, patch], standardize: phi_s}
        - {name: vit, path: runs/digits_vit, weight: 0.5, tokens: [summary]}

Bad values are refused as the config loads, in one line naming the entry and the key (exit 2): an
entry's own fields by its ``__post_init__`` (the loader prefixes ``distill.teachers[i]``), two
teachers with one name by the group's; an empty list by :func:`require_teachers` (the task's up-front
check: the group's default is empty, so that ``vitscale config distill`` can show it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from vitscale.config.ranges import at_least, finite, fraction, image_side, positive
from vitscale.errors import ConfigError

from .feature_distill_heads import GRID_MODES, TOKEN_KINDS
from .feature_distill_norm import STANDARDIZERS
from .feature_distill_students_config import StudentConfig, check_students

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


@dataclass
class FeatureTeacherConfig:
    """One teacher of feature distillation: where its weights are, how it sees the images, what the
    student matches and how."""

    name: str = ""
    """The teacher's name: its metrics (``train_<name>_loss``), its heads' weight set and its
    standardisers are keyed by it. Letters, digits and ``_``, starting with a letter; required."""
    path: str = ""
    """The teacher's weights, given as ``checkpoint.init_from`` is (as ``distill.teacher`` of logit
    distillation): a vitscale run folder, checkpoint or ``.safetensors``; a timm / open_clip
    ``.safetensors`` or ``.pth`` / ``.bin``; a Hub snapshot folder; ``hf-hub:org/name``. Required."""
    format: Literal["vitscale", "timm", "open_clip"] | None = None
    """The format of ``path``, overriding what the file tells (as ``distill.teacher_format``)."""
    model: str | None = None
    """The teacher's registered variant (``vitscale models``); None = the one its weights name (as
    ``distill.teacher_model``)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Changes to ``model``'s config (as ``distill.teacher_overrides``)."""
    weights: Literal["model", "ema"] = "model"
    """Which weights of a vitscale run folder or checkpoint: ``model`` or ``ema``."""
    img_size: int | None = None
    """The teacher's input size: the batch's images are resized to it (as ``distill.teacher_img_size``);
    None = what its source says, else its variant's own. Its patch grid is what the student's patch
    tokens are interpolated to (``grid_interpolation``)."""
    interpolation: Literal["bilinear", "bicubic"] | None = None
    """Resampling of the images to ``img_size``; None = what its source says, else bicubic."""
    mean: tuple[float, ...] | None = None
    """The teacher's per-channel normalisation mean (of pixels in [0, 1]); None = what its source says,
    else ``data.mean`` (as ``distill.teacher_mean``)."""
    std: tuple[float, ...] | None = None
    """The teacher's per-channel normalisation std; None as ``mean``."""
    layout: Literal["auto", "sharded", "replicated"] = "auto"
    """Under torchrun: ``sharded`` (laid out as the student), ``replicated`` (a whole copy on every rank)
    or ``auto`` (replicated up to ``replicate_max_mb``), as ``distill.teacher_layout``."""
    replicate_max_mb: float = 1024.0
    """``layout=auto``: the largest teacher (MB of parameters, as stored) kept whole on every rank."""

    weight: float = 1.0
    """The teacher's weight in the loss: ``sum_t weight_t x c x L_t / sum c`` (docs/distillation.md);
    all 1 = UNIC's loss. Greater than 0 (leave a teacher out rather than weigh it 0)."""
    tokens: list[str] = field(default_factory=lambda: ["summary", "patch"])
    """The token kinds the student matches: ``summary`` (the teacher's class token or its pooled
    output, ``summary``) and / or ``patch`` (its patch tokens). DUNE's teachers list theirs the same way
    (``token_types``, naver/dune ``teachers/config.py`` lines 15, 25)."""
    summary: Literal["class_token", "pooled"] = "class_token"
    """The teacher's summary token: its first token (``class_token``: DINOv2's ``x_norm_clstoken``, as
    UNIC reads it) or the mean of its patch tokens (``pooled``: a teacher without a class token). The
    student's summary is its own class token."""
    head_hidden_dim: int | None = None
    """Hidden width of this teacher's adaptor MLPs (RADIO's ``MLP2``); None = 4 x the student's width
    (UNIC's ``last_hidden_dim=3072`` for a ViT-B, naver/unic ``modeling/unic.py`` line 41)."""
    head_num_inner: int = 0
    """Residual inner blocks of the adaptor MLPs (RADIO's ``num_inner``, ``radio/adaptor_mlp.py``
    line 54: 0 = ``fc1`` then ``final``)."""
    head_ladder: bool = False
    """UNIC's ladder of projectors (arXiv 2408.05088, its abstract; naver/unic ``modeling/unic.py`` lines
    33-108): heads on the student's tokens after every block, their sum the prediction of this teacher's
    features (docs/distillation.md, "Adaptor heads"). UNIC's default (``main_unic.py`` lines 50-55: every
    block). Off: one head on the last block's tokens. The student must give its blocks' class tokens (a ViT
    with a class token: ``supports_intermediates``)."""
    head_ladder_hidden_dim: int | None = None
    """``head_ladder``: hidden width of the heads on blocks 1..L-1 (the last block's is
    ``head_hidden_dim``); None = the student's width (UNIC's ``hidden_dim=768`` for its ViT-B's 768,
    ``modeling/unic.py`` line 40)."""
    grid_interpolation: Literal["bilinear", "bicubic"] = "bilinear"
    """How the student's patch grid is resampled to the teacher's when they differ (the adaptor's output
    on the ``(B, D, gh, gw)`` map, ``align_corners=False``)."""
    cos_weight: float = 0.5
    """Weight of the cosine loss ``1 - cos`` per token (UNIC's ``--lam_lcos`` 0.5, naver/unic
    ``main_unic.py`` lines 82-86)."""
    smooth_l1_weight: float = 0.5
    """Weight of the smooth-L1 loss per token (UNIC's ``--lam_lsl1`` 0.5, main_unic.py lines 87-92)."""
    smooth_l1_beta: float = 1.0
    """Smooth-L1's ``beta``: quadratic below it, linear above (UNIC ``modeling/losses.py`` line 96: 1.0)."""
    summary_weight: float = 1.0
    """Weight of the summary loss among the token kinds (a weighted mean; 1 / 1 = UNIC's mean, losses.py line 74)."""
    patch_weight: float = 1.0
    """Weight of the patch loss among the token kinds."""
    standardize: Literal["phi_s", "running", "none"] = "phi_s"
    """The teacher's features standardised before the student learns them, per token kind: ``phi_s``
    (PHI-S, arXiv 2410.01680: a Hadamard rotation and one scale), ``running`` (mean and std per
    dimension), ``none``."""
    standardize_images: int = 65536
    """Images over which the standardisation's statistics are estimated (counted over every rank),
    then frozen; 0 = every image of the run (PHI-S then computes an eigendecomposition every step)."""

    def __post_init__(self):
        # ValueError: the config loader names the entry (``distill.teachers[i]: ...``)
        if not self.name or not _NAME.match(self.name):
            raise ValueError(f"name={self.name!r}: give the teacher a name of letters, digits and _ (e.g. name: dino), "
                             "starting with a letter: its metrics and weights are keyed by it")  # fmt: skip
        if not self.path:
            raise ValueError(f"teacher {self.name!r} has no path: give its weights (a run folder, a .safetensors file, hf-hub:org/name)")
        positive("weight", self.weight, "the teacher's weight in the loss; leave the teacher out instead of 0", error=ValueError)
        self.tokens = list(self.tokens)
        unknown = [k for k in self.tokens if k not in TOKEN_KINDS]
        if unknown:
            raise ValueError(f"tokens={self.tokens}: unknown token kind {unknown[0]!r}: use summary (the class token or "
                             "pooled output) and / or patch (the patch tokens)")  # fmt: skip
        if not self.tokens or len(set(self.tokens)) != len(self.tokens):
            raise ValueError(f"tokens={self.tokens}: give summary and / or patch, each once")
        if self.summary not in ("class_token", "pooled"):
            raise ValueError(f"summary={self.summary!r}: choose class_token or pooled")
        if self.grid_interpolation not in GRID_MODES:
            raise ValueError(f"grid_interpolation={self.grid_interpolation!r}: choose one of {', '.join(GRID_MODES)}")
        if self.standardize not in STANDARDIZERS:
            raise ValueError(f"standardize={self.standardize!r}: choose one of {', '.join(STANDARDIZERS)}")
        if self.head_hidden_dim is not None:
            at_least("head_hidden_dim", self.head_hidden_dim, 1, "the adaptor MLPs' hidden width", error=ValueError)
        at_least("head_num_inner", self.head_num_inner, 0, "residual inner blocks of the adaptor MLPs", error=ValueError)
        if not isinstance(self.head_ladder, bool):
            raise ValueError(f"head_ladder={self.head_ladder!r}: true (UNIC's ladder of projectors) or false")
        if self.head_ladder_hidden_dim is not None:
            if not self.head_ladder:
                raise ValueError("head_ladder_hidden_dim is the ladder's width: set head_ladder: true, or leave it out")
            at_least("head_ladder_hidden_dim", self.head_ladder_hidden_dim, 1, "the ladder's hidden width", error=ValueError)
        for key in ("cos_weight", "smooth_l1_weight", "summary_weight", "patch_weight"):
            at_least(key, getattr(self, key), 0, "a loss weight", error=ValueError)
        if self.cos_weight + self.smooth_l1_weight <= 0:
            raise ValueError("cos_weight and smooth_l1_weight are both 0: nothing would be learnt (UNIC: 0.5 / 0.5)")
        if all((self.summary_weight if k == "summary" else self.patch_weight) <= 0 for k in self.tokens):
            raise ValueError(f"tokens={self.tokens} all have weight 0 (summary_weight / patch_weight): nothing would be learnt")
        positive("smooth_l1_beta", self.smooth_l1_beta, "smooth-L1's quadratic range, UNIC: 1.0", error=ValueError)
        at_least("standardize_images", self.standardize_images, 0, "images of the statistics' estimation; 0 = the whole run",
                 error=ValueError)  # fmt: skip
        at_least("replicate_max_mb", self.replicate_max_mb, 0, "MB of the largest teacher kept whole per rank", error=ValueError)
        image_side("img_size", self.img_size, error=ValueError)
        for i, s in enumerate(self.std or ()):
            positive(f"std[{i}]", s, "the teacher's images are divided by it", error=ValueError)


@dataclass
class FeatureDistillConfig:
    """Feature distillation from frozen teachers (AM-RADIO arXiv 2312.06709, UNIC arXiv 2408.05088,
    PHI-S arXiv 2410.01680): the future ``train.task=feature_distill`` (docs/distillation.md)."""

    RANGES: ClassVar[dict[str, tuple]] = {"teacher_drop": (0.0, 1.0)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    teachers: list[FeatureTeacherConfig] = field(default_factory=list)
    """The teachers, one entry each (``name``, ``path``, ... : :class:`FeatureTeacherConfig`); at least
    one, under distinct names."""
    teacher_drop: float = 0.0
    """UNIC's teacher dropping: for each image, every teacher but the one with the highest loss is left
    out of the loss with this probability (naver/unic ``--t_drop_prob``, ``main_unic.py`` lines 75-80:
    0.5 there); 0 = off. In [0, 1)."""
    students: list[StudentConfig] = field(default_factory=list)
    """Several students in one job, each on its own ranks, from one teacher forward per batch (DINOv3's
    multi-student distillation: :class:`~vitscale.tasks.feature_distill_students_config.StudentConfig`,
    docs/distillation.md); empty = one student, the run's own model."""

    def __post_init__(self):
        fraction("distill.teacher_drop", self.teacher_drop, "the probability of dropping a teacher per image, UNIC: 0.5")
        seen: dict[str, int] = {}
        for i, t in enumerate(self.teachers):
            if t.name in seen:
                raise ConfigError(f"distill.teachers[{i}] and distill.teachers[{seen[t.name]}] are both named {t.name!r}: "
                                  "give each teacher its own name")  # fmt: skip
            seen[t.name] = i
            finite(t, f"distill.teachers[{i}]")
        check_students(self.students)


def require_teachers(dc: FeatureDistillConfig) -> None:
    """:class:`ConfigError` (one line) for a feature distillation without teachers — the task's
    up-front check (the group's default is the empty list)."""
    if not dc.teachers:
        raise ConfigError("distill.teachers is empty: give at least one teacher, e.g. distill.teachers=[{name: dino, "
                          "path: runs/digits_dino}]")  # fmt: skip


__all__ = ["FeatureDistillConfig", "FeatureTeacherConfig", "require_teachers"]
