"""The evaluators of ``evals:`` with hand-checked values: class-subset accuracy (ImageNet-A / -R style:
logits restricted to a subset of classes before the argmax) and multi-label "ReaL" accuracy (a
prediction is correct when it is in its image's list; empty lists are left out), on hand-made logits,
on the digits' 300 validation images and on image folders whose class-folder order is not the
order of the file names (ReaL) or of the subset's list (class subsets): samples are matched by file
and class name, and the positional reading these evaluators once did scores differently there; and
the entry checks of the config loader."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from vitscale.config import ConfigError, load_config
from vitscale.data.digits import load_digits_split
from vitscale.eval.classification import count_top1
from vitscale.eval.evaluator import EvalContext
from vitscale.eval.real import padded, real_hits
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
    assert [int(v) for v in subset_hits(logits[:3], torch.tensor([0, 0, 1]), keep[:3], subset, torch.tensor([0, 1]))] == [3, 2]
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
    # in-memory digits are named by their index: the label file maps those names to lists
    (tmp_path / "real.json").write_text(json.dumps({str(i): row for i, row in enumerate(lists)}))
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
    (tmp_path / "short.json").write_text(json.dumps({str(i): [1] for i in range(10)}))
    (tmp_path / "bad.json").write_text(json.dumps([[1, 11]] * 300))
    (tmp_path / "imagenet.json").write_text(json.dumps([[1]] * 300))
    for entry, message in [
        ({"kind": "clasification"}, "evals[0].kind: unknown evaluator 'clasification'; did you mean 'classification'?"),
        ({"kind": "classification", "every": -1}, "evals[0]: every=-1 must be >= 0"),
        ({"kind": "fewshot", "shots": [5], "data": {"formt": "digits"}}, "unknown config key 'evals[0].data.formt'"),
        ({"kind": "classification", "split": "test"}, "evals[0].split: 'test' is not one of train, val"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            load_config("digits_vit", [f"evals={json.dumps([entry])}"])
    with pytest.raises(ConfigError, match=r"evals\[1\] \(fewshot\) and evals\[0\] both log their metrics as val_"):
        load_config("digits_vit", ['evals=[{kind: classification}, {kind: fewshot, name: val}]'])
    for entry, message in [
        ({"kind": "real", "labels": str(tmp_path / "short.json")}, "the val split holds '10', which .*short.json has no entry for"),
        ({"kind": "real", "labels": str(tmp_path / "imagenet.json")}, "the val split holds '0', which .*imagenet.json has no entry for "
                                                                         r"\(its entries: ILSVRC2012_val_00000001, ILSVRC2012_val_00000002, ...\)"),
        ({"kind": "real", "labels": str(tmp_path / "bad.json")}, r"must be a list of lists of class indices \(0 to 9\)"),
        ({"kind": "class_subset", "classes": ["7"]}, "'7' is not a class of the run's data"),  # digits: zero ... nine
        ({"kind": "class_subset", "classes": [3, 3]}, "names a class twice"),
    ]:
        with pytest.raises(ConfigError, match=message):
            _evaluations([entry], tmp_path)


# ------------------------------------------------------------------ matched by name, not by position
GREY = [20 + 22 * k for k in range(10)]  # the grey level of an image of class k


class Brightness(nn.Module):
    """A "model" that reads its images: class k for an image of grey level ``GREY[k]`` (the nearest),
    through the run's normalisation (digits_vit: mean 0.5, std 0.5)."""

    def forward(self, x):
        grey = (x.mean(dim=(1, 2, 3)) * 0.5 + 0.5) * 255  # (B,)
        return -(grey[:, None] - torch.tensor(GREY, dtype=torch.float32)).abs()  # (B, 10)


def _grey_jpeg(path, k: int) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (40, 40), (GREY[k],) * 3).save(path, format="JPEG", quality=95)


def _folder_data(root) -> dict:
    return {"format": "imagefolder", "train_path": str(root), "val_path": str(root)}


def _imagenet_val_folder(root, files: range, folder_of) -> None:
    """ImageNet's val layout: ``ILSVRC2012_val_000000NN.JPEG`` in class folders; file i shows class (7 i) % 10."""
    for i in files:
        _grey_jpeg(root / folder_of(i) / f"ILSVRC2012_val_{i:08d}.JPEG", 7 * i % 10)


def test_real_matches_images_by_file_name_in_an_image_folder(tmp_path):
    # 12 files in three class folders: "a" holds files 9-12, "b" 5-8, "c" 1-4, so the split (sorted by
    # class folder) reads them as 9 10 11 12 5 6 7 8 1 2 3 4; file i shows class c_i = 7 i mod 10
    root = tmp_path / "val"
    _imagenet_val_folder(root, range(1, 13), lambda i: "c" if i <= 4 else "b" if i <= 8 else "a")
    c = [7 * i % 10 for i in range(1, 13)]
    # real.json: files 1-8 list their own class (right), 9-10 nothing (left out), 11-12 another (wrong)
    lists = [[c[i]] for i in range(8)] + [[], []] + [[(c[10] + 1) % 10], [(c[11] + 1) % 10]]
    (tmp_path / "real.json").write_text(json.dumps(lists))
    evals = _evaluations([{"kind": "real", "labels": str(tmp_path / "real.json"), "data": _folder_data(root)}], tmp_path)
    res = evals.run(Brightness())
    assert res["real_images"] == 10 and res["real_top1"] == 80.0  # 8 of the 10 listed files
    # read by position, as before: position p holds file order[p] but gets file p+1's list; by hand:
    # p0-p3 (files 9-12) get files 1-4's lists [7] [4] [1] [8], their classes 3 0 7 4: all wrong;
    # p4-p7 (files 5-8) their own: right; p8, p9 empty; p10, p11 (files 3, 4: 1, 8) get [8], [5]: wrong
    ev = evals.evaluators[0]
    positional = padded(lists, ev.ctx.device)
    old = count_top1(Brightness(), ev.loader, ev.ctx, lambda logits, b: real_hits(logits.argmax(-1), b["index"], positional))
    assert old == {"top1": 40.0, "images": 10}


def test_real_matches_a_flat_folder_listed_in_another_order(tmp_path):
    # the 12 files in one folder, listed by a CSV from the last to the first (data.format=csv)
    root = tmp_path / "flat"
    _imagenet_val_folder(root, range(1, 13), lambda i: ".")
    rows = [f"{root}/ILSVRC2012_val_{i:08d}.JPEG,a photo,{7 * i % 10}" for i in range(12, 0, -1)]
    (tmp_path / "val.csv").write_text("filepath,title,label\n" + "\n".join(rows) + "\n")
    c = [7 * i % 10 for i in range(1, 13)]
    lists = [[c[i]] for i in range(8)] + [[], []] + [[(c[10] + 1) % 10], [(c[11] + 1) % 10]]
    (tmp_path / "real.json").write_text(json.dumps(lists))
    data = {"format": "csv", "train_path": str(tmp_path / "val.csv"), "val_path": str(tmp_path / "val.csv"), "csv_label_key": "label"}
    evals = _evaluations([{"kind": "real", "labels": str(tmp_path / "real.json"), "data": data}], tmp_path)
    assert evals.run(Brightness()) == {"real_top1": 80.0, "real_images": 10}
    # by position: row p (file 12 - p) got file p+1's list; by hand, none of the 10 listed rows is right
    ev = evals.evaluators[0]
    positional = padded(lists, ev.ctx.device)
    old = count_top1(Brightness(), ev.loader, ev.ctx, lambda logits, b: real_hits(logits.argmax(-1), b["index"], positional))
    assert old == {"top1": 0.0, "images": 10}


def test_real_refuses_a_val_set_that_is_not_the_label_files(tmp_path):
    lists = [[7 * i % 10] for i in range(1, 13)]
    (tmp_path / "real.json").write_text(json.dumps(lists))
    extra, short, other = tmp_path / "extra", tmp_path / "short", tmp_path / "other"
    _imagenet_val_folder(extra, range(1, 14), lambda i: "a" if i % 2 else "b")  # a 13th file
    _imagenet_val_folder(short, [i for i in range(1, 13) if i != 5], lambda i: "a" if i % 2 else "b")  # no file 5
    _imagenet_val_folder(other, range(1, 13), lambda i: "a")
    _grey_jpeg(other / "b" / "photo.jpg", 3)  # a file of another naming
    for root, message in [
        (extra, "the val split holds 'ILSVRC2012_val_00000013', which .*real.json has no entry for"),
        (short, "real.json has an entry for 'ILSVRC2012_val_00000005', which the val split has no file of .11 of its 12 images"),
        (other, "the val split holds 'photo', which .*real.json has no entry for"),
    ]:
        with pytest.raises(ConfigError, match=message):
            _evaluations([{"kind": "real", "labels": str(tmp_path / "real.json"), "data": _folder_data(root)}], tmp_path)


def test_class_subset_matches_classes_by_name(tmp_path):
    # an ImageNet-R style folder of two of the digits' classes; its labels are the folders' sorted
    # places ("one" 0, "three" 1), the subset is listed the other way round
    root = tmp_path / "subset"
    for k, name, n in [(1, "one", 3), (3, "three", 2)]:
        for j in range(n):
            _grey_jpeg(root / name / f"{j}.png", k)
    evals = _evaluations([
        {"kind": "class_subset", "name": "r", "classes": ["three", "one"], "labels": "subset", "data": _folder_data(root)},
        {"kind": "class_subset", "name": "m", "classes": [3, 5], "data": _folder_data(root)},
    ], tmp_path)  # fmt: skip
    res = evals.run(Brightness())  # the model is right on every image
    assert (res["r_images"], res["r_top1"]) == (5, 100.0)
    assert (res["m_images"], res["m_top1"]) == (2, 100.0)  # "one" is outside {3, 5}: its 3 images left out
    # the positional reading: folder label i taken as the subset's i-th class ("one" as "three"): all wrong
    ev = evals.evaluators[0]
    old = count_top1(Brightness(), ev.loader, ev.ctx,
                     lambda logits, b: subset_hits(logits, b["label"], b["index"] >= 0, ev.subset, torch.arange(2)))
    assert old == {"top1": 0.0, "images": 5}


def test_class_subset_refuses_classes_that_do_not_match(tmp_path):
    roots = {}
    for case, names in [("odd", ["one", "eleven"]), ("more", ["one", "three", "five"])]:
        roots[case] = tmp_path / case
        for name in names:
            _grey_jpeg(roots[case] / name / "0.png", 1)
    for entry, message in [
        ({"classes": ["one"], "data": _folder_data(roots["odd"])}, "the evaluation data's class 'eleven' is not a class of the model"),
        ({"classes": ["one", "three"], "labels": "subset", "data": _folder_data(roots["more"])},
         "the evaluation data's class 'five' is not in the subset"),
        ({"classes": ["one", "three", "five", "seven"], "labels": "subset", "data": _folder_data(roots["more"])},
         "the subset's class 'seven' is not a class of the evaluation data"),
    ]:
        with pytest.raises(ConfigError, match=message):
            _evaluations([{"kind": "class_subset", **entry}], tmp_path)


@pytest.mark.slow
def test_a_val_set_that_is_not_the_label_files_is_one_line_through_the_cli(tmp_path):
    import subprocess
    import sys

    root = tmp_path / "val"
    _imagenet_val_folder(root, [1, 3], lambda i: "a")  # files 1 and 3; real.json names 1 and 2
    (tmp_path / "real.json").write_text(json.dumps([[1], [2]]))
    entry = {"kind": "real", "labels": str(tmp_path / "real.json"), "data": _folder_data(root)}
    run = subprocess.run([sys.executable, "-m", "vitscale", "train", "digits_vit", *FAST, "train.max_steps=1",
                          f"train.output_dir={tmp_path / 'run'}", f"evals={json.dumps([entry])}"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vitscale train: real: the val split holds 'ILSVRC2012_val_00000003', which ")
