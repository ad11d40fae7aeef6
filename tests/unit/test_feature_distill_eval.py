"""The evaluation of feature distillation (vitscale.tasks.feature_distill_eval): per image, each teacher's
feature cosines and loss are those of the training loss's definition, computed here by hand (heads, grid
resampling, standardisation, cosine); a CLIP teacher's zero-shot embedding is its adaptor's summary
de-standardised into the teacher's space, through the CLIP's image projection, L2-normalised; the entry's
fields and refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vitscale.config import ConfigError, load_config
from vitscale.tasks.feature_distill_config import FeatureTeacherConfig
from vitscale.tasks.feature_distill_eval import FeatureDistillEvalConfig, batch_values
from vitscale.tasks.feature_distill_heads import FeatureDistillParts, TeacherFeatures
from vitscale.tasks.feature_distill_loss import TeacherLoss


def _parts():
    torch.manual_seed(0)
    entries = [FeatureTeacherConfig(name="clip", path="x", standardize="phi_s"),
               FeatureTeacherConfig(name="mae", path="y", standardize="running", tokens=["patch"], grid_interpolation="bicubic")]  # fmt: skip
    parts = FeatureDistillParts(8, entries, {"clip": 12, "mae": 6})
    feats = {"clip": TeacherFeatures(torch.randn(5, 12) * 3 + 1, torch.randn(5, 4, 12) * 2, (2, 2)),
             "mae": TeacherFeatures(None, torch.randn(5, 9, 6) - 2, (3, 3))}  # fmt: skip
    parts.train()
    parts.targets(feats)  # the statistics of one batch
    parts.eval()
    return entries, parts, feats


def test_cosines_and_losses_per_image_are_the_training_definitions_by_hand():
    entries, parts, feats = _parts()
    summary, patches = torch.randn(5, 8), torch.randn(5, 16, 8)  # the student's 4x4 grid
    specs = {e.name: TeacherLoss.of(e) for e in entries}
    got = batch_values(parts, summary, patches, (4, 4), feats, specs)
    assert set(got) == {"clip_loss", "clip_summary_cos", "clip_patch_cos", "mae_loss", "mae_patch_cos"}
    for name, f in feats.items():
        heads, norms = parts.heads.teachers[name].heads, parts.norms[name]
        total = 0.0
        for kind, t in (("summary", f.summary), ("patch", f.patches)):
            if t is None:
                continue
            if kind == "summary":
                pred = heads["summary"](summary)
            else:  # the head on the student's grid, resampled to the teacher's on the (B, D, 4, 4) map
                out = heads["patch"](patches).transpose(1, 2).reshape(5, -1, 4, 4)
                mode = "bicubic" if name == "mae" else "bilinear"
                pred = F.interpolate(out, size=f.grid, mode=mode, align_corners=False, antialias=True)
                pred = pred.flatten(2).transpose(1, 2)
            target = norms[kind].standardize(t)
            cos = F.cosine_similarity(pred, target, dim=-1)
            l1 = F.smooth_l1_loss(pred, target, reduction="none").mean(-1)
            loss = 0.5 * (1 - cos) + 0.5 * l1
            if kind == "patch":
                cos, loss = cos.mean(1), loss.mean(1)
            torch.testing.assert_close(got[f"{name}_{kind}_cos"], cos, atol=1e-5, rtol=1e-5)
            total = total + loss
        kinds = 2 if f.summary is not None else 1
        torch.testing.assert_close(got[f"{name}_loss"], total / kinds, atol=1e-5, rtol=1e-5)


def test_a_clip_teachers_zero_shot_embedding_goes_through_its_adaptor_and_image_projection():
    entries, parts, feats = _parts()
    summary, patches = torch.randn(5, 8), torch.randn(5, 16, 8)
    clip = nn.Module()
    clip.image_proj = nn.Linear(12, 7, bias=False)  # what a vitscale CLIP applies to its image tower's pooled output
    got = batch_values(parts, summary, patches, (4, 4), feats, {e.name: TeacherLoss.of(e) for e in entries}, {"clip": clip})
    with torch.no_grad():
        estimate = parts.handover("clip", summary, patches)["summary"]  # the adaptor's summary in the teacher's space
        student = F.normalize(clip.image_proj(estimate), dim=-1)
        teacher = F.normalize(clip.image_proj(feats["clip"].summary), dim=-1)
    torch.testing.assert_close(got["clip_student_embedding"], student, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["clip_teacher_embedding"], teacher, atol=1e-5, rtol=1e-5)
    assert "mae_student_embedding" not in got


def test_the_entry_loads_in_evals_and_refuses_bad_templates():
    cfg = load_config("digits_vit", ["train.task=feature_distill", "distill.teachers=[{name: a, path: x}]",
                                     "evals=[{kind: feature_distill, every: 5, zeroshot: false}]"])  # fmt: skip
    (entry,) = cfg.evals
    assert isinstance(entry, FeatureDistillEvalConfig) and entry.every == 5 and entry.zeroshot is False
    with pytest.raises(ConfigError, match=r"template 'a photo' must hold the class name's place exactly once"):
        load_config("digits_vit", ["train.task=feature_distill", "distill.teachers=[{name: a, path: x}]",
                                   "evals=[{kind: feature_distill, templates: [a photo]}]"])  # fmt: skip


def test_vitscale_eval_without_the_heads_leaves_the_teachers_evaluation_out_and_refuses_it_when_named():
    """``vitscale eval``'s task before (or without) the run's heads and teachers read from a checkpoint
    (tests/integration/test_feature_distill_cli.py reads them): its default evaluations are the
    frozen-backbone ones, and an entry naming ``feature_distill`` is refused in one line saying why."""
    from vitscale.eval.evaluator import EvalContext
    from vitscale.tasks import get_task
    from vitscale.tasks.feature_distill_eval import FeatureDistillEvaluator, FromCheckpoint, NotTrained

    cfg = load_config("digits_vit", ["train.task=feature_distill", "distill.teachers=[{name: a, path: x}]"])
    task = get_task("feature_distill")
    assert [e["kind"] for e in task.default_evals(cfg)] == ["knn", "linear_probe", "feature_distill"]
    evaluating = task.for_evaluation(cfg, None, 10)
    assert isinstance(evaluating, FromCheckpoint) and evaluating.module is None
    assert [e["kind"] for e in evaluating.default_evals(cfg)] == ["knn", "linear_probe"]
    evaluating.missing = "checkpoint.path=w.safetensors is a weights file"
    with pytest.raises(NotTrained, match="reads the run's adaptor heads and teachers: checkpoint.path=w.safetensors") as e:
        FeatureDistillEvaluator(FeatureDistillEvalConfig(kind="feature_distill"), EvalContext(data=None, device=torch.device("cpu"),
                                                                                             task=evaluating))  # fmt: skip
    assert "\n" not in str(e.value)
