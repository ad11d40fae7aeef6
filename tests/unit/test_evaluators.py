"""The evaluators of ``evals:`` with hand-checked values: class-subset accuracy (ImageNet-A / -R style:
logits restricted to a subset of classes before the argmax) and multi-label "ReaL" accuracy (a
prediction is correct when it is in its image's list; empty lists are left out), on hand-made logits
and on the digits' 300 validation images; and the entry checks of the config loader."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from vitscale.config import ConfigError, load_config
from vitscale.data.digits import load_digits_split
from vitscale.eval.evaluator import EvalContext
from vitscale.eval.real import real_hits
from vitscale.eval.runner import Evaluations
from vitscale.eval.subset import subset_hits
from vitscale.run import assemble
from vitscale.run.evaldata import RunEvalData

FAST = ["data.num_workers=0", "eval.batch_size=64", "model.hidden_size=32", "model.num_layers=1"]


class Constant(nn.Module):
    """A "model" whose logits are the same for every image: ``logits`` (C,)."""

    def __init__(self, logits):
        super().__init__()
        self.register_buffer("logits", torch.tensor(logits, dtype=torch.float32))

    def forward(self, x):
        return self.logits.expand(x.shape[0], -1)


def _evaluations(entries: list[dict], tmp_path):
    cfg = load_config("digits_vit", [*FAST, f"train.output_dir={tmp_path}", f"evals={json.dumps(entries)}"])
    run = assemble(cfg, "eval")
    ctx = EvalContext(data=RunEvalData(run), device=run.device, class_names=list(run.class_names))
    return Evaluations(list(cfg.evals), ctx)


def test_subset_hits_by_hand():
    # 4 images, 5 classes, the subset {1, 3}
    logits = torch.tensor([[0.0, 2, 0, 1, 9],  # label 1: class 4 is the overall argmax, 1 within the subset: right
                           [0.0, 1, 0, 2, 0],  # label 1: 3 within the subset: wrong
                           [5.0, 0, 0, 3, 0],  # label 3: right within the subset (0 is outside it)
                           [0.0, 9, 0, 0, 0]])  # label 0: not a class of the subset: left out  # fmt: skip
    labels, keep, subset = torch.tensor([1, 1, 3, 0]), torch.ones(4, dtype=torch.bool), torch.tensor([1, 3])
    position = torch.tensor([-1, 0, -1, 1, -1])  # class -> its place in the subset
    assert [int(v) for v in subset_hits(logits, labels, keep, subset, position)] == [3, 2]
    # labels given as places in the subset (an ImageNet-R folder): 0 = class 1, 1 = class 3
    assert [int(v) for v in subset_hits(logits[:3], torch.tensor([0, 0, 1]), keep[:3], subset, None)] == [3, 2]
    keep = torch.tensor([True, True, False, True])  # a padding sample is not counted
    assert [int(v) for v in subset_hits(logits, labels, keep, subset, position)] == [2, 1]


def test_real_hits_by_hand():
    table = torch.tensor([[-1, -1], [7, -1], [2, 7], [0, 1]])  # lists [], [7], [2, 7], [0, 1]
    pred = torch.tensor([7, 7, 7, 7])
    # image 0: empty list, left out; 1 and 2: 7 is in their lists; 3: not
    assert [int(v) for v in real_hits(pred, torch.tensor([0, 1, 2, 3]), table)] == [3, 2]
    assert [int(v) for v in real_hits(pred, torch.tensor([1, -1, 3, 3]), table)] == [3, 1]  # -1: padding


def test_subset_and_real_on_the_digits(tmp_path):
    labels = load_digits_split("val", 3)[1]  # the 300 validation labels, in the split's order
    counts = torch.bincount(labels, minlength=10)
    # ReaL lists: images 0-99 none (left out), 100-199 [7], 200-249 [2, 7], 250-299 [0, 1]
    lists = [[]] * 100 + [[7]] * 100 + [[2, 7]] * 50 + [[0, 1]] * 50
    (tmp_path / "real.json").write_text(json.dumps(lists))
    (tmp_path / "subset.txt").write_text("1\n")
    evals = _evaluations([
        {"kind": "class_subset", "name": "odd", "classes": [1, 3, 5]},
        {"kind": "class_subset", "name": "named", "classes": ["three"], "classes_file": str(tmp_path / "subset.txt")},
        {"kind": "real", "labels": str(tmp_path / "real.json")},
    ], tmp_path)  # fmt: skip
    res = evals.run(Constant([0.0, 1, 2, 3, 4, 5, 6, 7, 8, 9]))  # always 9; 5 within {1, 3, 5}; 3 within {3 (by name), 1}
    n = int(counts[1] + counts[3] + counts[5])
    assert res["odd_images"] == n and res["odd_top1"] == pytest.approx(100.0 * int(counts[5]) / n)
    assert res["named_images"] == int(counts[1] + counts[3]) and res["named_top1"] == pytest.approx(100.0 * int(counts[3]) / (counts[1] + counts[3]).item())
    # always 7: right for the 150 images whose list holds 7, wrong for the 50 with [0, 1]
    res = evals.run(Constant([0.0, 1, 2, 3, 4, 5, 6, 9, 8, 7]))
    assert res["real_images"] == 200 and res["real_top1"] == 75.0


def test_a_bad_entry_is_refused_before_anything_runs(tmp_path):
    (tmp_path / "short.json").write_text(json.dumps([[1]] * 10))
    (tmp_path / "bad.json").write_text(json.dumps([[1, 11]] * 300))
    for entry, message in [
        ({"kind": "clasification"}, "evals[0].kind: 'clasification' is not an evaluator; did you mean 'classification'?"),
        ({"kind": "classification", "every": -1}, "evals[0]: every=-1 must be >= 0"),
        ({"kind": "fewshot", "shots": [5], "data": {"formt": "digits"}}, "unknown config key 'evals[0].data.formt'"),
        ({"kind": "classification", "split": "test"}, "evals[0].split: 'test' is not one of train, val"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            load_config("digits_vit", [f"evals={json.dumps([entry])}"])
    with pytest.raises(ConfigError, match=r"evals\[1\] \(fewshot\) and evals\[0\] both log their metrics as val_"):
        load_config("digits_vit", ['evals=[{kind: classification}, {kind: fewshot, name: val}]'])
    for entry, message in [
        ({"kind": "real", "labels": str(tmp_path / "short.json")}, "has 10 label lists, the val split 300 images"),
        ({"kind": "real", "labels": str(tmp_path / "bad.json")}, r"must be a list of lists of class indices \(0 to 9\)"),
        ({"kind": "class_subset", "classes": ["7"]}, "'7' is not a class of the run's data"),  # digits: zero ... nine
        ({"kind": "class_subset", "classes": [3, 3]}, "names a class twice"),
    ]:
        with pytest.raises(ConfigError, match=message):
            _evaluations([entry], tmp_path)
