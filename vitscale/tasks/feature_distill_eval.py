"""Evaluation of feature distillation (``train.task=feature_distill``): ``kind: feature_distill``, an entry of
``evals:`` (a run of the task gets it by default, named ``val``, every ``eval.every`` steps and at the end).

On its split (the val split by default, read in order and unaugmented), for each teacher of
``distill.teachers``, through the student being evaluated (the model, or its EMA) and the run's
adaptor heads and standardisers (:class:`~vitscale.tasks.feature_distill_heads.FeatureDistillParts`):

- ``<teacher>_<kind>_cos`` (``kind``: the teacher's matched token kinds, ``summary`` / ``patch``): the
  cosine of the adaptor's output and the teacher's standardised features — what
  ``train_<teacher>_<kind>_cos`` is on the training batches (patch tokens: the mean over the teacher's
  grid, the student's resampled to it), averaged over the split's images; UNIC evaluates the same
  per-teacher, per-kind losses on its val split every epoch (naver/unic at 02269db, ``main_unic.py``
  lines 432-481, ``evaluate``);
- ``<teacher>_loss``: the teacher's loss on those images, as ``train_<teacher>_loss``;
- for a **CLIP teacher** whose text tower came with it (a vitscale CLIP run or file, an open_clip file:
  :mod:`.feature_distill_teachers`), zero-shot classification *through the student's adaptor for that
  teacher* — RADIO's use of its adaptors (NVlabs/RADIO README, "Zero Shot Inference": the student's
  CLIP-adaptor summary against the CLIP text tower's class embeddings): the adaptor's summary mapped back
  into the teacher's own space (:meth:`~FeatureDistillParts.handover`'s de-standardisation), through the
  CLIP's ``image_proj``, L2-normalised, against the text classifier of the class names x templates
  (:func:`vitscale.eval.zeroshot.zeroshot_classifier`, open_clip's ``build_zero_shot_classifier``):
  ``<teacher>_zeroshot_top1`` / ``_top5`` (%); the teacher's own, from its own image embedding on the
  same images, beside it (``<teacher>_teacher_zeroshot_top1`` / ``_top5``). A CLIP teacher matched
  without its summary (``tokens: [patch]``, or ``summary: pooled``: not what ``image_proj`` takes) has
  no zero-shot; nor has a CLIP image tower alone (a timm ``vit_*_clip_*`` file: no text tower).

The teachers' forwards here are not counted in their share of the step time. Every rank evaluates its
shard; the per-image values are gathered in dataset order (padding samples left out), so the metrics
are those of the whole split on every rank.

The evaluation reads the parts a training run builds. ``vitscale eval`` of a checkpoint of the run
(:class:`FromCheckpoint`) reads them from it — the heads and the standardisers' statistics, beside the
student — with the teachers of ``distill.teachers`` read again as the run read them, and evaluates
through this same evaluator: its numbers are the run's for that checkpoint. Without them (a weights
file holds the student alone; a teacher file gone) it leaves the entry out of its default evaluations
with a note, and refuses it in one line when ``evals:`` names it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vitscale.eval.evaluator import Evaluator, EvaluatorConfig, MissingSplit, register_evaluator
from vitscale.eval.gather import gather_ordered
from vitscale.eval.zeroshot import check_templates, prompt_classes, zeroshot_accuracy, zeroshot_classifier

from .feature_distill import FeatureDistillTask
from .feature_distill_heads import FeatureDistillParts, TeacherFeatures, match_grid
from .feature_distill_loss import TeacherLoss, kind_loss, teacher_loss
from .health import frozen_backbone_evals


class NotTrained(MissingSplit):
    """The evaluation needs a feature-distillation run's parts (teachers, heads), which this task does not
    hold (``vitscale eval`` of a file without the heads, a teacher gone): dropped from the task's default
    evaluations with a note, refused in one line when ``evals:`` names it."""


class FromCheckpoint(FeatureDistillTask):
    """The task ``vitscale eval`` evaluates a feature-distillation checkpoint with
    (:meth:`FeatureDistillTask.for_evaluation`): ``vitscale eval`` loads the student's weights, and
    :meth:`read_for_evaluation` the rest of the training module from the same checkpoint — the
    ``adaptors`` weight set (:attr:`FeatureDistillModule.weight_sets`) and the standardisers' statistics,
    the part ``task.distill.*``, read strictly as ``checkpoint.init_parts`` reads a part — around the
    teachers of ``distill.teachers`` read again as the run read them (:meth:`FeatureDistillTask.build`,
    :func:`~vitscale.tasks.feature_distill_teachers.read_teacher`). ``kind: feature_distill`` then
    evaluates as it did in the run. When they cannot be read (a weights file: the student's backbone
    alone; a teacher file gone) its default evaluations are the frozen-backbone ones (``knn``,
    ``linear_probe``), with a note saying why, and an entry naming it is refused in one line."""

    def __init__(self, cfg, model, num_classes, dp_group=None, class_names=None):
        super().__init__(cfg, model, num_classes, dp_group, class_names)
        self.missing = "they were not read"  # why self.module is None: the note and the refusal

    def default_evals(self, cfg):  # an instance's (the classmethod's): whether the parts were read
        return super().default_evals(cfg) if self.module is not None else frozen_backbone_evals(cfg)

    def read_for_evaluation(self, run, path, evals):
        if evals is not None and not any(e.kind == "feature_distill" for e in evals):
            return []  # no entry reads them: the teachers are not read
        from vitscale.checkpoint import load_model_weights, read_weights
        from vitscale.errors import describe
        from vitscale.run.weight_sets import weight_set_prefix

        from .module import PARTS_KEY

        where = f"checkpoint.path={path}"
        try:
            if not Path(path).is_dir():
                raise NotTrained(f"{where} is a weights file, which holds the student's backbone alone, not the adaptor "
                                 "heads: give the run folder or one of its step folders")  # fmt: skip
            weight_set_prefix(path, "adaptors")  # a checkpoint of a run of this task (one line otherwise)
            state = read_weights(path, PARTS_KEY, prefix=f"{PARTS_KEY}.")
            module = self.build(run)  # the teachers, read as the run read them; heads of the run's shapes
            load_model_weights(module.parts, state, strict=True, source=f"{where} ({PARTS_KEY}.*)")
        except Exception as e:
            said = describe(e)
            if said is None:  # a bug: its traceback
                raise
            self.module, self.missing = None, said[0].splitlines()[0]
            if evals is None:
                return [f"evals: kind feature_distill left out of the {self.name} default evaluations: {self.missing}"]
            return []  # named: refused by its evaluator
        module.parts.eval()
        return []


@dataclass
class FeatureDistillEvalConfig(EvaluatorConfig):
    """``kind: feature_distill``: per teacher, the val split's adaptor-feature cosines and loss, and zero-shot
    classification through the student's adaptor for a CLIP teacher."""

    zeroshot: bool = True
    """Zero-shot classification through the adaptor of each CLIP teacher whose text tower came with it
    (``<teacher>_zeroshot_top1``); false: the cosines and losses only."""
    templates: tuple[str, ...] = ("a photo of a {}.",)
    """Zero-shot prompt templates, ``{}`` = the class name (as ``kind: zeroshot``: the CLIP paper's default prompt)."""
    class_names: tuple[str, ...] | None = None
    """Class names for the prompts, in label order; None = its data's (digits '0'..'9' become words)."""
    classnames: str | None = None
    """A set vitscale ships in place of ``class_names`` and ``templates`` (``imagenet``: the 1,000 classes
    and the CLIP paper's 80 templates, as ``kind: zeroshot``); None = neither."""

    def __post_init__(self):
        super().__post_init__()
        check_templates("feature_distill.templates", self.templates)


@contextlib.contextmanager
def _gathered(module: nn.Module):
    """``module``'s parameters whole for calls into its submodules: an FSDP2 unit (under torchrun) is
    unsharded for the duration (its own ``forward`` would gather them; its heads are called here); as it
    is in one process."""
    fsdp = hasattr(module, "unshard") and hasattr(module, "reshard")
    if fsdp:
        module.unshard()
    try:
        yield
    finally:
        if fsdp:
            module.reshard()


@torch.no_grad()
def batch_values(parts: FeatureDistillParts, summary: torch.Tensor, patches: torch.Tensor, grid: tuple[int, int],
                 teachers: dict[str, TeacherFeatures], specs: dict[str, TeacherLoss],
                 clips: dict[str, nn.Module] | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """Per-image values of one batch: ``<teacher>_<kind>_cos`` and ``<teacher>_loss`` ``(B,)`` (the
    adaptor outputs of the student's ``summary`` / ``patches`` on ``grid`` against the standardised
    ``teachers`` features, as the training loss computes them), and for each teacher in ``clips`` the
    L2-normalised image embeddings ``(B, E)`` of the student through that adaptor
    (``<teacher>_student_embedding``) and of the teacher itself (``<teacher>_teacher_embedding``)."""
    out: dict[str, torch.Tensor] = {}
    preds = parts.heads(summary, patches)
    for name, f in teachers.items():
        p, norms = preds[name], parts.norms[name]
        if "patch" in p:
            p["patch"] = match_grid(p["patch"], grid, f.grid, parts.grid_modes[name])
        t = {k: n.standardize(f.summary if k == "summary" else f.patches) for k, n in norms.items()}
        out[f"{name}_loss"] = teacher_loss(p, t, specs[name])[0]
        for kind in t:
            out[f"{name}_{kind}_cos"] = kind_loss(p[kind], t[kind], specs[name])[1]
        clip = (clips or {}).get(name)
        if clip is not None:
            estimate = norms["summary"].destandardize(p["summary"])  # the teacher's own space (the handover's)
            proj = clip.image_proj.weight.float()
            out[f"{name}_student_embedding"] = F.normalize(estimate @ proj.T, dim=-1)
            out[f"{name}_teacher_embedding"] = F.normalize(f.summary.float() @ proj.T, dim=-1)
    return out


class FeatureDistillEvaluator(Evaluator):
    config = FeatureDistillEvalConfig
    default_name = "val"

    def __init__(self, cfg: FeatureDistillEvalConfig, ctx):
        super().__init__(cfg, ctx)
        task = ctx.task
        if not isinstance(task, FeatureDistillTask):
            raise NotTrained(f"evals: kind feature_distill evaluates the teachers and adaptor heads of a train.task="
                             f"feature_distill run, not of train.task={getattr(task, 'name', None)}")  # fmt: skip
        if task.module is None:
            why = getattr(task, "missing", "its training module is not built")
            raise NotTrained(f"evals: kind feature_distill reads the run's adaptor heads and teachers: {why}")
        self.task = task
        self.loader = ctx.data.loader(cfg.data, cfg.split, cfg.batch_size)
        self.specs = {name: TeacherLoss.of(entry) for name, entry in task.entries.items()}
        # the CLIP teachers with a zero-shot classifier: their summary is what image_proj takes
        self.clips = {name: clip for name, clip in task.clips.items()
                      if cfg.zeroshot and "summary" in task.entries[name].tokens and task.entries[name].summary == "class_token"}  # fmt: skip
        self.names, self.templates = prompt_classes(cfg, ctx, self.name) if self.clips else ([], ())
        self.classifiers: dict[str, torch.Tensor] = {}  # by teacher: its text tower's, built at the first evaluation

    def _classifier(self, name: str) -> torch.Tensor:
        if name not in self.classifiers:  # the teacher's text tower is frozen: one classifier for the run
            from vitscale.models.registry import family_of

            clip = self.clips[name]
            tokenizer = family_of(clip).create_tokenizer(clip.cfg.text.encoder_seq_length)
            self.classifiers[name] = zeroshot_classifier(clip, tokenizer, self.names, self.templates, self.ctx.device,
                                                         self.ctx.autocast)  # fmt: skip
        return self.classifiers[name]

    @torch.no_grad()
    def __call__(self, model):
        c, task = self.ctx, self.task
        parts = task.module.distill
        was_training = model.training
        model.eval()
        rows: dict[str, list[torch.Tensor]] = {}
        labels, index = [], []
        try:
            with _gathered(parts):
                for batch in self.loader:
                    images = batch["image"].to(c.device, non_blocking=True)
                    with c.autocast():  # the tokens the heads take: every block's for a ladder (as the loss reads them)
                        summary, patches, grid = parts.student_inputs(model, images)
                    feats = {name: task._features(name, images, timed=False) for name in task.entries}
                    got = batch_values(parts, summary, patches, grid, feats, self.specs, self.clips)
                    for k, v in got.items():
                        rows.setdefault(k, []).append(v.float())
                    labels.append(batch["label"].to(c.device))
                    index.append(batch["index"].to(c.device))
        finally:
            model.train(was_training)
        if not index:
            return {}
        idx = torch.cat(index)
        whole = {k: gather_ordered(torch.cat(v), idx, c.group) for k, v in rows.items()}
        out = {k: float(v.mean()) for k, v in whole.items() if v.ndim == 1 and v.numel()}
        y = gather_ordered(torch.cat(labels), idx, c.group)
        if self.clips and y.numel() and bool((y >= 0).all()):  # class labels (captions alone have none)
            for name in self.clips:
                clf = self._classifier(name)
                for who, key in (("student", f"{name}_zeroshot"), ("teacher", f"{name}_teacher_zeroshot")):
                    acc = zeroshot_accuracy(whole[f"{name}_{who}_embedding"], y, clf)
                    out[f"{key}_top1"], out[f"{key}_top5"] = acc["zeroshot_top1"], acc["zeroshot_top5"]
        return out


register_evaluator("feature_distill", FeatureDistillEvaluator)

__all__ = ["FeatureDistillEvalConfig", "FeatureDistillEvaluator", "FromCheckpoint", "NotTrained", "batch_values"]
