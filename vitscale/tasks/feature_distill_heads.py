"""Adaptor heads of feature distillation (the future ``train.task=feature_distill``): the student's
summary token and patch tokens mapped into each teacher's feature space by an MLP per teacher and per
token kind (AM-RADIO, Ranzinger et al. 2023, arXiv 2312.06709: "adaptor heads"; UNIC, Sariyildiz et
al. 2024, arXiv 2408.05088: a head per teacher for the class token and one for the patch tokens,
naver/unic at 02269db ``modeling/unic.py`` lines 74-84), and the student's patch grid matched to each
teacher's.

**The MLP** is RADIO's ``MLP2`` (NVlabs/RADIO at c0f3701, ``radio/adaptor_mlp.py`` lines 52-97: the
``v2`` MLP of its adaptor factory, ``radio/adaptor_module_factory.py`` lines 22-31): ``fc1`` (student
width -> hidden), ``num_inner`` residual blocks ``x + Linear(GELU(LayerNorm(x)))``, then ``final =
Linear(GELU(LayerNorm(x)))`` (hidden -> teacher width); no pre-norm (its ``pre_norm=False`` default).
RADIO's training code is not public (README.md lines 345-347: "Training: Coming Soon"), so the
initialisation and the default hidden width come from UNIC, whose training code is: every ``Linear``
truncated-normal with std 0.02 and zero bias (``modeling/unic.py`` lines 86-90, ``lp_args={'std':
0.02}`` main_unic.py lines 50-55), and a hidden width of 4 x the student's (``last_hidden_dim=3072``
for its ViT-B's 768, unic.py line 41; UNIC's ``AdaptMLP`` is one hidden layer, GELU, no norm by
default, unic.py lines 111-166).

**Patch grids.** A head maps each of the student's patch tokens on the student's own grid ``(gh, gw)``
(what RADIO's adaptors return: ``radio/adaptor_generic.py`` lines 71-74 reshape to the student's grid).
Where a teacher's grid ``(th, tw)`` differs (another resolution or patch size), the head's output is
resampled on the ``(B, D, gh, gw)`` grid to ``(th, tw)`` by :func:`match_grid` — bilinear by default,
or bicubic (``align_corners=False``; antialiased when a side shrinks, so every student token counts).
UNIC needs none (all its teachers are ViT-B/16 at 224, ``teachers/config.py`` lines 5-33); DUNE makes
the grids equal by resizing the *teacher's input* instead (naver/dune at afad549,
``teachers/forward.py`` lines 28-36: bicubic, ``align_corners=True``) — a teacher's own input size
(``img_size`` of its entry) does that here too, and :func:`match_grid` is then the identity.

:func:`check_match` refuses, in one line naming the teacher, what cannot be matched: patch tokens
asked of a teacher that has none, a teacher's patch tokens that are no ``(th, tw)`` grid, and a
feature width the heads were not built for (the student's or the teacher's).

:class:`FeatureDistillParts` puts a run's pieces together — the heads, each teacher's standardisers
(:mod:`.feature_distill_norm`) and the loss (:mod:`.feature_distill_loss`) — as the one module a
feature-distillation task's training module holds beside the student's backbone: its parameters are
the heads', its buffers the standardisers' statistics (both in its ``state_dict``).

**The ladder of projectors** (a teacher's ``head_ladder``; UNIC's "ladder of expendable projectors",
arXiv 2408.05088, its abstract): the student's tokens after *every* block ``b = 1..L`` feed a head of
their own, and the teacher's prediction is their sum, per token kind,

    ``y_kind = sum_{b=1..L} head_{kind,b}(x_{kind,b})``

— naver/unic at 02269db ``modeling/unic.py``: ``UNIC.forward`` (lines 18-30) collects each block's class
token ``x[:, 0]`` and patch tokens ``x[:, 1 + registers:]``, ``LP.__init__`` (lines 33-84) builds a
head per teacher, kind and block (``which_blocks`` = every block by default, lines 48-50), the last
block's ``last_hidden_dim`` wide (3072), the others' ``hidden_dim`` (768 for its ViT-B: here the
student's width by default, ``head_ladder_hidden_dim``), and ``LP.forward`` (lines 92-108) sums them in
block order. UNIC turns it on always (``main_unic.py`` lines 50-55: ``--lp_args`` ``{'std': 0.02}``,
every block). Here the last block's head is the teacher's own head (``heads.<kind>``, the same as without
the ladder) and blocks ``1..L-1`` are ``ladder.<kind>.<b-1>``; each head is the MLP above. Each block's
tokens are read as the linear probe reads them (``model(images, intermediates=L)``: through the
student's final norm, DINOv2's ``get_intermediate_layers(norm=True)``), where UNIC's student hands its
blocks' raw outputs to the heads (``UNIC.forward`` applies no norm). The resampling to a teacher's grid
is applied to the sum.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from vitscale.errors import CheckError

from .feature_distill_loss import TeacherLoss, feature_distill_loss
from .feature_distill_norm import FeatureStandardizer

TOKEN_KINDS = ("summary", "patch")
"""The token kinds a teacher is matched on: its summary token (class token or pooled) and its patch tokens."""

GRID_MODES = ("bilinear", "bicubic")
"""How a student's patch grid is resampled to a teacher's."""


class AdaptorMLP(nn.Module):
    """RADIO's ``MLP2`` (module docstring): ``fc1``, ``num_inner`` residual (LayerNorm, GELU, Linear)
    blocks, ``final`` (LayerNorm, GELU, Linear); UNIC's initialisation."""

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, num_inner: int = 0, std: float = 0.02):
        super().__init__()
        if min(in_dim, hidden_dim, out_dim) < 1 or num_inner < 0:
            raise ValueError(f"AdaptorMLP({in_dim}, {hidden_dim}, {out_dim}, num_inner={num_inner}): widths >= 1, num_inner >= 0")
        self.in_dim, self.out_dim, self.std = in_dim, out_dim, std
        self.fc1 = nn.Linear(in_dim, hidden_dim)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(hidden_dim), nn.GELU(), nn.Linear(hidden_dim, hidden_dim)) for _ in range(num_inner)
        )
        self.final = nn.Sequential(nn.LayerNorm(hidden_dim), nn.GELU(), nn.Linear(hidden_dim, out_dim))
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=self.std)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                m.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)
        for block in self.blocks:
            x = x + block(x)
        return self.final(x)


class TeacherAdaptor(nn.Module):
    """One teacher's heads: ``summary`` and / or ``patch`` (:data:`TOKEN_KINDS`), each an :class:`AdaptorMLP`
    from the student's width ``in_dim`` to the teacher's ``out_dim``. ``ladder``: the student's depth ``L``
    for UNIC's ladder of projectors (module docstring: ``L - 1`` more heads per kind, ``ladder_hidden_dim``
    wide, None = ``in_dim``, on blocks ``1..L-1``; the sum of all ``L``); 0 = none."""

    def __init__(self, in_dim: int, out_dim: int, kinds=TOKEN_KINDS, hidden_dim: int | None = None, num_inner: int = 0,
                 ladder: int = 0, ladder_hidden_dim: int | None = None):  # fmt: skip
        super().__init__()
        unknown = [k for k in kinds if k not in TOKEN_KINDS]
        if unknown or not kinds:
            raise ValueError(f"token kinds {list(kinds)}: give one or both of {', '.join(TOKEN_KINDS)}")
        if ladder < 0:
            raise ValueError(f"ladder={ladder}: the student's depth (>= 1), or 0 for no ladder")
        hidden = hidden_dim or 4 * in_dim  # UNIC's last_hidden_dim: 4 x the student's width
        self.heads = nn.ModuleDict({k: AdaptorMLP(in_dim, hidden, out_dim, num_inner) for k in TOKEN_KINDS if k in kinds})
        self.in_dim, self.out_dim, self.depth = in_dim, out_dim, ladder
        if ladder:  # built after the heads: a run without the ladder draws its heads' initialisation as before
            rung = ladder_hidden_dim or in_dim  # UNIC's hidden_dim=768 for its ViT-B's 768 (unic.py line 40)
            self.ladder = nn.ModuleDict({k: nn.ModuleList(AdaptorMLP(in_dim, rung, out_dim, num_inner) for _ in range(ladder - 1))
                                         for k in self.heads})  # fmt: skip

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.heads.keys())

    def forward(self, summary, patches) -> dict[str, torch.Tensor]:
        """``{kind: adaptor output}``: ``summary (B, D) -> (B, Dt)``, ``patches (B, N, D) -> (B, N, Dt)``
        (the student's grid). Each may be a list of every block's tokens, oldest first
        (:func:`student_tokens` with a ladder): a ladder sums its heads over them, a teacher without one
        reads the last block's."""
        out = {}
        for kind, head in self.heads.items():
            x = summary if kind == "summary" else patches
            if x is None:
                raise ValueError(f"the {kind} head has no input: give the student's {kind} tokens")
            if not self.depth:
                out[kind] = head(x[-1] if isinstance(x, list | tuple) else x)
                continue
            if not isinstance(x, list | tuple) or len(x) != self.depth:
                got = f"{len(x)} blocks'" if isinstance(x, list | tuple) else "the last block's"
                raise ValueError(f"the {kind} ladder sums heads on all {self.depth} blocks' tokens, given {got}: "
                                 "read them with student_tokens(model, images, blocks)")  # fmt: skip
            y = 0
            for rung, xb in zip(self.ladder[kind], x[:-1], strict=True):  # blocks 1..L-1, in order (UNIC's LP.forward)
                y = y + rung(xb)
            out[kind] = y + head(x[-1])
        return out


class AdaptorHeads(nn.Module):
    """Every teacher's :class:`TeacherAdaptor`, by teacher name (a weight set of its own: the student's
    export stays the family's plain backbone). ``teachers``: ``(name, teacher width, token kinds,
    hidden width or None, num_inner)`` per teacher, optionally followed by ``(ladder depth,
    ladder hidden width or None)``."""

    def __init__(self, student_dim: int, teachers):
        super().__init__()
        self.student_dim = student_dim
        self.teachers = nn.ModuleDict()
        for name, dim, kinds, hidden, inner, *ladder in teachers:
            if name in self.teachers:
                raise ValueError(f"two teachers named {name!r}: give each its own name")
            self.teachers[name] = TeacherAdaptor(student_dim, dim, kinds, hidden, inner, *ladder)

    @property
    def depth(self) -> int:
        """The blocks whose tokens the heads read: the student's depth with a ladder, else 0 (the last
        block's tokens alone, :func:`student_tokens`)."""
        return max((a.depth for a in self.teachers.values()), default=0)

    def forward(self, summary, patches) -> dict[str, dict[str, torch.Tensor]]:
        """``{teacher: {kind: adaptor output on the student's grid}}``."""
        return {name: head(summary, patches) for name, head in self.teachers.items()}


# ---------------------------------------------------------------------------------- tokens and grids
def student_tokens(model: nn.Module, images: torch.Tensor, blocks: int = 0):
    """The student's ``(summary, patches, grid)`` the heads take, in float32 at least. ``blocks=0``: its
    pooled features ``(B, D)`` and patch tokens ``(B, N, D)`` (``model(images, tokens=True)``, the contract's
    :class:`~vitscale.models.contract.Tokens`); ``blocks=L`` (a ladder, :attr:`AdaptorHeads.depth`):
    lists of the last ``L`` blocks' class tokens and patch tokens, oldest first, each through the final
    norm — the linear probe's path (``model(images, intermediates=L)``,
    :func:`vitscale.eval.probe.read_features`; UNIC reads ``x[:, 0]`` and ``x[:, 1 + registers:]`` after
    every block, ``modeling/unic.py`` lines 18-26). Through the model's call, so FSDP2 gathers it."""
    if not blocks:
        s = model(images, tokens=True)
        return _f32(s.pooled), _f32(s.patches), tuple(s.grid)
    P = model.num_prefix_tokens
    every = model(images, intermediates=blocks)
    grid = tuple(model.token_grid(tuple(images.shape[-2:])))
    return [_f32(t[:, 0]) for t in every], [_f32(t[:, P:]) for t in every], grid


def _f32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 at least (autocast's bf16 up; a float64 student's kept)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def split_tokens(tokens: torch.Tensor, num_prefix: int, summary: str = "class_token") -> tuple[torch.Tensor, torch.Tensor]:
    """A ViT's output tokens ``(B, P + N, D)`` (``P`` prefix tokens: class token, registers) as
    ``(summary (B, D), patches (B, N, D))``: the summary is the first token (``class_token``, DINOv2's
    ``x_norm_clstoken``) or the patch tokens' mean (``pooled``: a model without a class token)."""
    if tokens.ndim != 3 or not 0 <= num_prefix < tokens.shape[1]:
        raise ValueError(f"tokens of shape {tuple(tokens.shape)} with {num_prefix} prefix tokens: expected (B, prefix + N, D), N >= 1")
    patches = tokens[:, num_prefix:]
    if summary == "class_token":
        if num_prefix < 1:
            raise ValueError("summary=class_token of a model without a class token: use summary=pooled")
        return tokens[:, 0], patches
    if summary == "pooled":
        return patches.mean(dim=1), patches
    raise ValueError(f"summary={summary!r}: choose class_token or pooled")


def match_grid(patches: torch.Tensor, grid: tuple[int, int], target: tuple[int, int], mode: str = "bilinear") -> torch.Tensor:
    """Patch tokens ``(B, gh*gw, D)`` on the grid ``grid`` resampled to ``target = (th, tw)``:
    ``(B, th*tw, D)``, through the ``(B, D, gh, gw)`` map (``mode``: bilinear | bicubic,
    ``align_corners=False``, antialiased where a side shrinks). The same tensor when the grids are equal."""
    (gh, gw), (th, tw) = tuple(grid), tuple(target)
    B, N, D = patches.shape
    if N != gh * gw:
        raise ValueError(f"{N} patch tokens are not a {gh}x{gw} grid")
    if (gh, gw) == (th, tw):
        return patches
    if mode not in GRID_MODES:
        raise ValueError(f"grid interpolation {mode!r}: choose one of {', '.join(GRID_MODES)}")
    x = patches.transpose(1, 2).reshape(B, D, gh, gw)
    x = F.interpolate(x, size=(th, tw), mode=mode, align_corners=False, antialias=th < gh or tw < gw)
    return x.reshape(B, D, th * tw).transpose(1, 2)


def check_match(name: str, adaptor: TeacherAdaptor, *, student_dim: int, student_grid: tuple[int, int],
                teacher_dim: int, teacher_tokens: int | None, teacher_grid: tuple[int, int] | None) -> None:  # fmt: skip
    """A :class:`CheckError` (one line naming the teacher) unless the student's features can be matched
    to teacher ``name``'s through ``adaptor``: widths as the heads were built, and, for the patch head,
    a teacher with patch tokens that form ``teacher_grid`` (``teacher_tokens``: how many it gives, None =
    none) and a student grid of at least one token. Called before the first step with one batch's shapes."""
    where = f"distill.teachers: teacher {name!r}"
    if student_dim != adaptor.in_dim:
        raise CheckError(f"{where}: its heads take features {adaptor.in_dim} wide, the student's are {student_dim} wide")
    if teacher_dim != adaptor.out_dim:
        raise CheckError(f"{where}: its features are {teacher_dim} wide, its heads give {adaptor.out_dim}: the heads "
                         "must be built for the teacher's width")  # fmt: skip
    if "patch" not in adaptor.kinds:
        return
    if not teacher_tokens or teacher_grid is None:
        raise CheckError(f"{where} gives no patch tokens (a classifier's logits, a pooled output): match its summary "
                         "only (tokens: [summary])")  # fmt: skip
    th, tw = teacher_grid
    if th < 1 or tw < 1 or th * tw != teacher_tokens:
        raise CheckError(f"{where}: its {teacher_tokens} patch tokens are not a {th}x{tw} grid, so the student's grid "
                         "cannot be interpolated to it (set the teacher's img_size to a multiple of its patch size, "
                         "or match its summary only: tokens: [summary])")  # fmt: skip
    gh, gw = student_grid
    if gh < 1 or gw < 1:
        raise CheckError(f"{where}: the student's patch grid {gh}x{gw} has no tokens to interpolate")




# ---------------------------------------------------------------------------------- the task's parts
class TeacherFeatures(NamedTuple):
    """One teacher's output for a batch: its summary ``(B, Dt)`` or None, its patch tokens
    ``(B, th*tw, Dt)`` or None, and their grid ``(th, tw)`` (None without patch tokens)."""

    summary: torch.Tensor | None
    patches: torch.Tensor | None
    grid: tuple[int, int] | None


class FeatureDistillParts(nn.Module):
    """What a feature-distillation task trains and keeps besides the student's backbone: every
    teacher's adaptor heads (:class:`AdaptorHeads`, ``heads.*``: parameters) and its standardisers
    per token kind (:class:`~vitscale.tasks.feature_distill_norm.FeatureStandardizer`, ``norms.*``:
    buffers), built from the ``distill.teachers`` entries and the teachers' feature widths
    (``teacher_dims``; ``student_blocks``: the student's depth, for a teacher's ``head_ladder``).
    ``forward`` gives the batch's loss and metrics
    (:func:`~vitscale.tasks.feature_distill_loss.feature_distill_loss`); :meth:`handover` an
    adaptor's output in its teacher's own space."""

    def __init__(self, student_dim: int, teachers, teacher_dims: dict[str, int], student_blocks: int = 0):
        super().__init__()
        if student_blocks < 1 and any(t.head_ladder for t in teachers):
            raise ValueError("a teacher's heads are a ladder (head_ladder): give the student's depth, student_blocks")
        self.heads = AdaptorHeads(student_dim, [(t.name, teacher_dims[t.name], tuple(t.tokens), t.head_hidden_dim,
                                                 t.head_num_inner, student_blocks if t.head_ladder else 0,
                                                 t.head_ladder_hidden_dim) for t in teachers])  # fmt: skip
        self.norms = nn.ModuleDict({
            t.name: nn.ModuleDict({k: FeatureStandardizer(teacher_dims[t.name], t.standardize, t.standardize_images) for k in t.tokens})
            for t in teachers
        })  # fmt: skip
        self.specs = [TeacherLoss.of(t) for t in teachers]
        self.grid_modes = {t.name: t.grid_interpolation for t in teachers}

    @torch.no_grad()
    def init_weights(self) -> None:
        """The heads' initialisation and the standardisers' empty statistics (after a ``to_empty``
        from the meta device)."""
        for m in self.modules():
            if isinstance(m, (AdaptorMLP, FeatureStandardizer)):
                m.init_weights()

    def describe(self) -> list[str]:
        """A line per teacher for the run: its heads and its standardisation."""
        lines = []
        for name, adaptor in self.heads.teachers.items():
            std = "; ".join(f"{k}: {n.describe()}" for k, n in self.norms[name].items())
            ladder = f" (a ladder: the sum over the student's {adaptor.depth} blocks)" if adaptor.depth else ""
            lines.append(f"distill: teacher {name!r}: heads {'+'.join(adaptor.kinds)} {adaptor.in_dim}->{adaptor.out_dim}"
                         f"{ladder}, standardised {std}")  # fmt: skip
        return lines

    def check(self, student_dim: int, student_grid: tuple[int, int], teachers: dict[str, TeacherFeatures]) -> None:
        """:func:`check_match` for every teacher, from one batch's outputs (before the first step)."""
        for name, adaptor in self.heads.teachers.items():
            f = teachers[name]
            dim = next(x.shape[-1] for x in (f.summary, f.patches) if x is not None)
            check_match(name, adaptor, student_dim=student_dim, student_grid=student_grid, teacher_dim=dim,
                        teacher_tokens=None if f.patches is None else f.patches.shape[1], teacher_grid=f.grid)  # fmt: skip

    @torch.no_grad()
    def targets(self, teachers: dict[str, TeacherFeatures], group=None) -> dict[str, dict[str, torch.Tensor]]:
        """Every teacher's features standardised, by kind (the standardisers absorb them first in
        training mode: the same on every rank of ``group``)."""
        out = {}
        for name, norms in self.norms.items():
            f = teachers[name]
            out[name] = {k: n(f.summary if k == "summary" else f.patches, group) for k, n in norms.items()}
        return out

    def student_inputs(self, model: nn.Module, images: torch.Tensor):
        """The student's tokens these heads take (:func:`student_tokens`: every block's with a ladder)."""
        return student_tokens(model, images, self.heads.depth)

    def forward(self, summary, patches, grid: tuple[int, int], teachers: dict[str, TeacherFeatures], *, group=None,
                drop: float = 0.0, seed: int = 0, step: int = 0, index: torch.Tensor | None = None,
                count: torch.Tensor | None = None):  # fmt: skip
        """``(loss, metrics)`` of the student's ``summary (B, D)`` and ``patches (B, gh*gw, D)`` (lists of
        them per block with a ladder: :meth:`student_inputs`) on ``grid`` against ``teachers`` (the
        teachers' outputs, by name): the heads' outputs, the patch ones resampled to each teacher's grid,
        against the standardised teacher features."""
        preds = self.heads(summary, patches)
        for name, p in preds.items():
            if "patch" in p:
                p["patch"] = match_grid(p["patch"], grid, teachers[name].grid, self.grid_modes[name])
        return feature_distill_loss(preds, self.targets(teachers, group), self.specs, drop=drop, seed=seed, step=step,
                                    index=index, count=count)  # fmt: skip

    def handover(self, name: str, summary, patches) -> dict[str, torch.Tensor]:
        """Teacher ``name``'s adaptor outputs for the student's tokens, de-standardised: estimates of
        the teacher's own features (on the student's grid) — RADIO's use of its adaptors."""
        out = self.heads.teachers[name](summary, patches)
        return {k: self.norms[name][k].destandardize(v) for k, v in out.items()}


__all__ = ["GRID_MODES", "TOKEN_KINDS", "AdaptorHeads", "AdaptorMLP", "FeatureDistillParts", "TeacherAdaptor", "TeacherFeatures",
           "check_match", "match_grid", "split_tokens", "student_tokens"]  # fmt: skip
