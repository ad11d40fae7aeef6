"""The ``distill`` group of feature distillation (vitscale.tasks.feature_distill_config), built as the
config loader builds it (``replace_fields``): a YAML's teacher list, the defaults from UNIC, a
docstring per field, and each bad value refused in one line (exit 2) naming the entry and the key."""

from __future__ import annotations

import dataclasses

import pytest

from vitscale.config import replace_fields
from vitscale.config.fields import field_docs
from vitscale.errors import EXIT_USAGE, ConfigError
from vitscale.tasks.distill_config import DistillConfig
from vitscale.tasks.feature_distill_config import FeatureDistillConfig, FeatureTeacherConfig, require_teachers
from vitscale.tasks.feature_distill_loss import TeacherLoss


def _load(teachers, **more):
    return replace_fields(FeatureDistillConfig(), {"teachers": teachers, **more}, "distill.")


def test_a_yaml_teacher_list_loads_with_uncis_defaults():
    dc = _load([{"name": "dino", "path": "runs/dino"},
                {"name": "vit", "path": "runs/vit", "weight": 0.5, "tokens": ["summary"], "standardize": "running",
                 "mean": [0.5], "std": [0.25], "img_size": 32}], teacher_drop=0.5)  # fmt: skip
    a, b = dc.teachers
    assert isinstance(a, FeatureTeacherConfig) and a.tokens == ["summary", "patch"] and a.standardize == "phi_s"
    assert (a.cos_weight, a.smooth_l1_weight, a.smooth_l1_beta) == (0.5, 0.5, 1.0)
    assert b.weight == 0.5 and b.tokens == ["summary"] and b.mean == (0.5,) and b.img_size == 32 and dc.teacher_drop == 0.5
    spec = TeacherLoss.of(b)
    assert spec.name == "vit" and spec.weight == 0.5 and spec.cos_weight == 0.5
    require_teachers(dc)


def test_every_field_has_a_docstring_and_the_logit_teachers_fields():
    for cls in (FeatureDistillConfig, FeatureTeacherConfig):
        docs = field_docs(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, f"{cls.__name__}: no docstring for {missing}"
    today = {f.name.removeprefix("teacher_").replace("teacher", "path") for f in dataclasses.fields(DistillConfig)
             if f.name.startswith("teacher") or f.name == "replicate_max_mb"}  # fmt: skip
    assert today <= {f.name for f in dataclasses.fields(FeatureTeacherConfig)}, today
    FeatureDistillConfig()  # the default group builds (``vitscale config distill`` shows it)


@pytest.mark.parametrize("teachers, more, says", [
    ([], {}, "distill.teachers is empty"),
    ([{"name": "a", "path": "x"}, {"name": "a", "path": "y"}], {}, r"distill.teachers\[1\] and distill.teachers\[0\] are both named 'a'"),
    ([{"name": "a", "path": "x", "weight": 0}], {}, r"distill.teachers\[0\]: weight=0.0 must be greater than 0"),
    ([{"name": "a", "path": "x"}, {"name": "b", "path": "y", "weight": -1}], {}, r"distill.teachers\[1\]: weight=-1.0 must be greater"),
    ([{"name": "a", "path": "x", "tokens": ["summary", "cls"]}], {}, r"distill.teachers\[0\]: .*unknown token kind 'cls'"),
    ([{"name": "a", "path": "x", "tokens": []}], {}, "give summary and / or patch"),
    ([{"name": "a.b", "path": "x"}], {}, "give the teacher a name"),
    ([{"path": "x"}], {}, "give the teacher a name"),
    ([{"name": "a"}], {}, "has no path"),
    ([{"name": "a", "path": "x", "cos_weight": 0, "smooth_l1_weight": 0}], {}, "both 0"),
    ([{"name": "a", "path": "x", "tokens": ["patch"], "patch_weight": 0}], {}, "all have weight 0"),
    ([{"name": "a", "path": "x", "standardize": "pca"}], {}, r"distill.teachers\[0\].standardize: 'pca' is not one of"),
    ([{"name": "a", "path": "x", "standardize_images": -1}], {}, "standardize_images=-1 must be at least 0"),
    ([{"name": "a", "path": "x", "head_hidden_dim": 0}], {}, "head_hidden_dim=0 must be at least 1"),
    ([{"name": "a", "path": "x", "img_size": 0}], {}, "img_size=0 is not a usable image side"),
    ([{"name": "a", "path": "x", "std": [0.5, 0]}], {}, r"std\[1\]=0.0 must be greater than 0"),
    ([{"name": "a", "path": "x", "cos_weight": float("inf")}], {}, r"distill.teachers\[0\].cos_weight=inf is not a finite"),
    ([{"name": "a", "path": "x", "nme": 1}], {}, r"unknown config key 'distill.teachers\[0\].nme'"),
    ([{"name": "a", "path": "x"}], {"teacher_drop": 1.0}, r"distill.teacher_drop=1.0 must be in \[0, 1\)"),
])  # fmt: skip
def test_bad_teachers_are_refused_in_one_line(teachers, more, says):
    with pytest.raises(ConfigError, match=says) as e:
        require_teachers(_load(teachers, **more))
    assert "\n" not in str(e.value) and e.value.exit_code == EXIT_USAGE
