"""Feature distillation from frozen backbones (``train.task=feature_distill``): one student learns the
summary token and the patch tokens of one or several teachers through adaptor heads of its own — the
agglomerative distillation of AM-RADIO (arXiv 2312.06709) and UNIC (arXiv 2408.05088), with PHI-S
standardisation (arXiv 2410.01680). Labels are not read: any image data trains. The method, every key
and the references: docs/distillation.md.

- **Teachers** (``distill.teachers``): each read as a logit-distillation teacher is
  (:func:`vitscale.tasks.distill.build`: any file ``checkpoint.init_from`` takes, its own input size
  and normalisation, laid out as its ``layout`` says, in eval mode without gradients, in the run's
  precision), and asked for its tokens through the model contract (``model(x, tokens=True)``,
  :class:`vitscale.models.contract.Tokens`): its summary (class token, or the mean of its patch
  tokens) and its normalised patch tokens on its own grid.
- **The training module** (:mod:`vitscale.tasks.module`): the student's backbone and
  :class:`~vitscale.tasks.feature_distill_heads.FeatureDistillParts` (every teacher's adaptor heads,
  trained, and its standardisers' statistics, carried) as ``parts.distill``: checkpointed and resumed
  with the student (``task.distill.*``), left out of ``model.safetensors``; the heads are the ``adaptors``
  weight set. The teachers are read again from their files on a resume, as the logit teacher is.
- **Loss**: UNIC's cosine + smooth-L1 per token kind and teacher, weighted per teacher, with UNIC's
  teacher dropping as an option (:mod:`vitscale.tasks.feature_distill_loss`); per teacher its loss and
  feature cosines are logged (``train_<name>_loss``, ``train_<name>_<kind>_cos``) with its share of the
  step time (``<name>_time_pct``).
- **Evaluation**: the frozen-backbone evaluations (``knn``, ``linear_probe``) and ``kind: feature_distill``
  (:mod:`vitscale.tasks.feature_distill_eval`): per teacher the val split's feature cosines and loss,
  and zero-shot classification through the student's adaptor for a CLIP teacher — in the run, and by
  ``vitscale eval`` of one of its checkpoints (the heads read from it, the teachers read again).
- **Bad teachers**: a file that is not a backbone, one without tokens (a classifier family that declares
  none), an input that is no whole grid of its patches, a summary or width the heads cannot take —
  refused in one line before the first step (:mod:`vitscale.tasks.feature_distill_teachers`,
  :meth:`FeatureDistillParts.check` on one blank batch); a teacher whose features are not finite
  makes its step non-finite (not applied, its batch not absorbed by the standardisers) and stops the
  run one step later naming the teacher and the step (:class:`vitscale.errors.NonFiniteError`).
"""

from __future__ import annotations

import dataclasses

import torch

from vitscale.config.schema import Config
from vitscale.errors import ConfigError

from .base import PretrainingTask, register_task
from .distill import FiniteWatch
from .distill_config import DistillConfig
from .feature_distill_config import FeatureDistillConfig, require_teachers
from .feature_distill_heads import FeatureDistillParts, TeacherFeatures, student_tokens
from .feature_distill_teachers import check_features, read_teacher, teacher_features
from .module import TrainModule, freeze_unreached


@dataclasses.dataclass
class FeatureDistillPretrainingConfig(Config):
    """A whole run of ``train.task=feature_distill``: the common groups and ``distill`` (its teachers)."""

    distill: FeatureDistillConfig = dataclasses.field(default_factory=FeatureDistillConfig)
    """The teachers and how the student learns them (docs/distillation.md)."""


def as_logit_teacher(entry) -> DistillConfig:
    """A ``distill.teachers`` entry as the one-teacher ``distill`` group the logit teacher is read from
    (the same fields, with the ``teacher_`` prefix)."""
    return DistillConfig(teacher=entry.path, teacher_format=entry.format, teacher_model=entry.model,
                         teacher_overrides=dict(entry.overrides), teacher_weights=entry.weights,
                         teacher_img_size=entry.img_size, teacher_interpolation=entry.interpolation,
                         teacher_mean=entry.mean, teacher_std=entry.std, teacher_layout=entry.layout,
                         replicate_max_mb=entry.replicate_max_mb)  # fmt: skip


class FeatureDistillModule(TrainModule):
    """The student's backbone and the adaptor heads and standardisers of every teacher."""

    weight_sets = {"adaptors": "distill.heads"}

    @property
    def distill(self) -> FeatureDistillParts:
        return self.parts["distill"]


class FeatureDistillTask(PretrainingTask):
    name = "feature_distill"
    bench_step = "the teachers' forwards and the adaptor heads"
    config = FeatureDistillPretrainingConfig
    reads_labels = False  # its loss reads the images alone (vitscale.tasks.base.Task.reads_labels)
    weight_sets = FeatureDistillModule.weight_sets

    def __init__(self, cfg, model, num_classes, dp_group=None, class_names=None):
        super().__init__(cfg, model, num_classes, dp_group, class_names)
        self.dc: FeatureDistillConfig = cfg.distill
        self.seed, self.accum = cfg.train.seed, cfg.train.grad_accum
        self.teachers: dict[str, object] = {}
        self.entries: dict = {}  # name -> its distill.teachers entry (built once, in build)
        self.clips: dict[str, torch.nn.Module] = {}  # name -> the whole CLIP of a CLIP teacher (zero-shot)
        self.watches: dict[str, FiniteWatch] = {}
        self.module: FeatureDistillModule | None = None  # the training module (build)

    @classmethod
    def for_evaluation(cls, cfg, model, num_classes, dp_group=None, class_names=None):
        """``vitscale eval``'s task: the student, and the run's heads and teachers read for ``kind:
        feature_distill`` (:class:`~vitscale.tasks.feature_distill_eval.FromCheckpoint`)."""
        from .feature_distill_eval import FromCheckpoint

        return FromCheckpoint(cfg, model, num_classes, dp_group, class_names)

    @classmethod
    def check(cls, cfg, model, dims, purpose):
        """Teachers given, and a student that gives its tokens — before any data is read or model built."""
        super().check(cfg, model, dims, purpose)
        if purpose != "train":
            return
        require_teachers(cfg.distill)
        if cfg.distill.students:
            raise ConfigError("distill.students: a job of several students trains one run per student; start it with "
                              "vitscale.train.train (`vitscale train`), which does")  # fmt: skip
        if not model.family.model_cls.supports_tokens:
            raise ConfigError(f"train.task=feature_distill: the student {model.name} declares no tokens (supports_tokens): "
                              "use a ViT (`vitscale models`)")  # fmt: skip
        ladder = [t.name for t in cfg.distill.teachers if t.head_ladder]
        if ladder and not (model.family.model_cls.supports_intermediates and model.cfg.class_token
                           and model.cfg.class_token_length > 0):  # fmt: skip
            raise ConfigError(f"distill.teachers[{ladder[0]}].head_ladder: the ladder reads every block's class token, "
                              f"which the student {model.name} does not give (a ViT with a class token does)")  # fmt: skip

    def build(self, run):
        model, lines = self.model, []
        for entry in self.dc.teachers:
            got = read_teacher(run, entry, self.autocast)  # a CLIP's image tower; refusals in one line
            self.entries[entry.name], self.teachers[entry.name] = entry, got.teacher
            if got.clip is not None:
                self.clips[entry.name] = got.clip
            self.watches[entry.name] = FiniteWatch(run.device, f"teacher {entry.name!r}'s features",
                                                   f"distill.teachers[{entry.name}] mean / std", run.total_steps)  # fmt: skip
            lines += got.lines
        device = next(model.parameters()).device
        mcfg = model.cfg
        x = torch.zeros(1, mcfg.num_channels, mcfg.img_h, mcfg.img_w, device=device)

        blocks = mcfg.num_layers if any(t.head_ladder for t in self.dc.teachers) else 0  # UNIC's ladder: every block

        def features(m):  # what the heads read: the tokens of the last block, or of every block (a ladder)
            summary, patches, _ = student_tokens(m, x, blocks)
            return sum(t.sum() for t in (*summary, *patches)) if blocks else summary.sum() + patches.sum()

        unreached = freeze_unreached(model, features)  # the student's classifier: no feature reaches it
        if unreached:
            lines.append(f"distill: {len(unreached)} tensors the features do not reach are frozen: {', '.join(unreached[:3])}"
                         f"{', ...' if len(unreached) > 3 else ''}")  # fmt: skip
        feats = {name: self._features(name, x) for name in self.teachers}
        dims = {name: check_features(name, f) for name, f in feats.items()}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + 48)
            parts = FeatureDistillParts(model.num_features, self.dc.teachers, dims, blocks).to(device)
        parts.check(model.num_features, mcfg.grid, feats)  # one line per misfit, before the first step
        lines += parts.describe()
        module = FeatureDistillModule(model, {"distill": parts}, lines + [
            "distill: TFLOP/s and MFU count the student's FLOPs only (the teachers' forwards are not counted); "
            "<name>_time_pct is each teacher's share of the step time"])  # fmt: skip
        from vitscale.distributed.parallelize import parallelize_parts

        parallelize_parts(module.layout_plan(), run.dims, run.cfg.precision)
        self.module = module
        return module

    def _features(self, name: str, images: torch.Tensor, timed: bool = True) -> TeacherFeatures:
        """Teacher ``name``'s summary and patch tokens of a batch, float32 (its own size and normalisation)."""
        return teacher_features(self.teachers[name], self.entries[name], images, timed=timed)

    def _teacher_features(self, images, index, step) -> dict[str, TeacherFeatures]:
        """Every teacher's features of the micro-batch: computed here, or (``distill.students``) this rank's
        share computed here and the rest received from the job's other ranks."""

        def compute(x):
            return {name: self._features(name, x) for name in self.teachers}

        if self.runtime is None:  # a run of its own; under distill.students the job's StudentExchange
            return compute(images)
        return self.runtime.features(images, index, step, compute)

    def step_times(self):
        times = {name: t.timer.take() for name, t in self.teachers.items()}
        if self.runtime is not None:  # distill.students: sending the features, waiting for the job's ranks
            times["students_exchange"] = self.runtime.timer.take()
        return times

    @classmethod
    def job(cls, cfg):
        """``distill.students``: the job trains one run per student
        (:func:`vitscale.tasks.feature_distill_students.train_students`)."""
        if not cfg.distill.students:
            return None
        from .feature_distill_students import train_students

        return train_students

    def loss(self, model, batch, step):
        images = batch["image"]
        host = batch.get("host", batch)
        index = host.get("index")
        for watch in self.watches.values():
            watch.check()  # the previous step's flag: a teacher that emitted NaN / inf stops the run here
        feats = self._teacher_features(images, index, step)
        finite = []
        for name, watch in self.watches.items():
            f = feats[name]
            ok = torch.stack([torch.isfinite(t).all() for t in (f.summary, f.patches) if t is not None]).all()
            watch.record(ok, step // self.accum + 1)
            finite.append(ok)
        with self.autocast():  # the last block's tokens, or every block's for a ladder (student_tokens)
            summary, patches, grid = self.module.distill.student_inputs(model, images)
        loss, metrics = self.module.distill(summary, patches, grid, feats, group=self.dp_group, drop=self.dc.teacher_drop,
                                            seed=self.seed, step=step, index=index)  # fmt: skip
        loss = torch.where(torch.stack(finite).all(), loss, torch.nan)  # a non-finite teacher: the step is not applied
        return loss, metrics

    @classmethod
    def default_evals(cls, cfg):
        # the frozen-backbone ones and the teachers' val-split cosines / zero-shot (feature_distill_eval)
        return super().default_evals(cfg) + [{"kind": "feature_distill", "name": "val", "every": cfg.eval.every}]


register_task(FeatureDistillTask)

__all__ = ["FeatureDistillModule", "FeatureDistillPretrainingConfig", "FeatureDistillTask", "as_logit_teacher"]
