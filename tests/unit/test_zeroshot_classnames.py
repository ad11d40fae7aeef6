"""``eval.classnames: imagenet``: the 1,000 ImageNet class names and the CLIP paper's 80 prompt
templates shipped as data, and the check that a val set holds those classes in ImageNet's order."""

from __future__ import annotations

import pytest

from vitscale.config import load_config
from vitscale.errors import ConfigError
from vitscale.eval.zeroshot import check_data_classes, classname_set


def test_the_imagenet_set_is_the_clip_papers():
    s = classname_set("imagenet")
    assert len(s["class_names"]) == len(s["wnids"]) == 1000 and len(s["templates"]) == 80
    # class 0 tench (n01440764), class 1 goldfish, class 999 toilet tissue: ImageNet's index order
    assert (s["wnids"][0], s["class_names"][0]) == ("n01440764", "tench")
    assert (s["wnids"][1], s["class_names"][1]) == ("n01443537", "goldfish")
    assert (s["wnids"][999], s["class_names"][999]) == ("n15075141", "toilet paper")
    assert s["templates"][0] == "a bad photo of a {}." and all(t.count("{}") == 1 for t in s["templates"])
    assert len(set(s["wnids"])) == 1000 and s["wnids"] == sorted(s["wnids"])  # an image folder's order
    assert "itap of a {}." in s["templates"]  # the paper's ensemble, not one prompt


def test_the_val_data_must_hold_the_sets_classes_in_order():
    wnids = classname_set("imagenet")["wnids"]
    check_data_classes("imagenet", wnids)  # an ImageNet val image folder
    check_data_classes("imagenet", [f"class {i}" for i in range(1000)])  # other names: the count is checked
    with pytest.raises(ConfigError, match=r"^eval.classnames=imagenet: the val data has 10 classes, the set 1000: "):
        check_data_classes("imagenet", [str(i) for i in range(10)])
    swapped = [*wnids[:5], wnids[6], wnids[5], *wnids[7:]]
    with pytest.raises(ConfigError, match=rf"the val data's class 5 is {wnids[6]}, the set's {wnids[5]}: the classes are not"):
        check_data_classes("imagenet", swapped)
    with pytest.raises(ConfigError, match=r"^eval.classnames must be one of imagenet \(a set vitscale ships\); got 'places365'$"):
        classname_set("places365")


def test_a_clip_run_with_eval_classnames_evaluates_zero_shot_with_the_set():
    from vitscale.tasks import get_task

    cfg = load_config("digits_clip", ["eval.classnames=imagenet"])
    entry = next(e for e in get_task("contrastive").default_evals(cfg) if e["kind"] == "zeroshot")
    assert entry["classnames"] == "imagenet" and entry["class_names"] is None
    plain = next(e for e in get_task("contrastive").default_evals(load_config("digits_clip")) if e["kind"] == "zeroshot")
    assert plain["classnames"] is None
