"""``data.format=images``: a folder of one's own images, no classes, any nesting, for the tasks that read
no labels. Every image below the folder in sorted path order (the same indices, crops and epochs in
every run), hidden entries passed over; a labelled class folder as ``data.val_path`` is what the
evaluations read; a task that reads labels is refused in one line."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from vitscale.cli import main
from vitscale.config import ConfigError
from vitscale.data import build_loader, data_config, get_format
from vitscale.data.images import labelled_data, list_images
from vitscale.registry import TASKS

RGB = np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8)


def _jpeg(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.roll(RGB, seed * 3, axis=1)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _write(root, names):
    for i, name in enumerate(names):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_jpeg(i) if name.lower().endswith((".jpg", ".jpeg")) else b"not an image")


NESTED = ["z.jpg", "2023/trip/b.JPG", "2023/a.jpeg", "a.jpg", "2024/c.jpg", ".thumbnails/t.jpg", "2023/._a.jpeg",
          "notes.txt"]  # fmt: skip


def test_every_image_at_any_depth_in_sorted_order_hidden_entries_passed_over(tmp_path):
    _write(tmp_path / "one", NESTED)
    _write(tmp_path / "two", NESTED[::-1])  # written in another order: listed the same
    want = ["2023/a.jpeg", "2023/trip/b.JPG", "2024/c.jpg", "a.jpg", "z.jpg"]
    for root in (tmp_path / "one", tmp_path / "two"):
        assert [p.removeprefix(f"{root}/") for p in list_images(str(root))] == want
    cfg = data_config("images", train_path=str(tmp_path / "one"), num_workers=0)
    split = get_format("images").split(cfg, "train", img_size=(16, 16))
    assert split.class_names == [] and split.num_classes == 0 and set(split.source.labels) == {-1}
    # keyed augmentation on the sorted index: two loaders give the same shuffled, augmented batches
    batches = []
    for _ in range(2):
        loader = build_loader(cfg, "train", img_size=(16, 16), num_channels=3, seed=3, batch_size=5, augment=True).loader
        batches.append(next(iter(loader)))
    assert batches[0]["index"].tolist() == batches[1]["index"].tolist()
    assert sorted(batches[0]["index"].tolist()) == [0, 1, 2, 3, 4] and batches[0]["label"].tolist() == [-1] * 5
    assert (batches[0]["image"] == batches[1]["image"]).all()
    assert build_loader(cfg, "val", img_size=(16, 16), num_channels=3, seed=0, batch_size=5) is None  # no val_path


def test_the_labelled_folder_is_split_into_a_fit_and_a_scored_half(tmp_path):
    _write(tmp_path / "photos", ["a.jpg"])
    _write(tmp_path / "labelled", [f"{c}/{i}.jpg" for c in ("cat", "dog") for i in range(4)])
    cfg = data_config("images", train_path=str(tmp_path / "photos"), val_path=str(tmp_path / "labelled"))
    changes = labelled_data(cfg)
    assert changes == {"format": "imagefolder", "train_path": str(tmp_path / "labelled"), "val_path": None, "val_split": 0.5}
    from vitscale.config import replace_fields

    folder = replace_fields(cfg, changes, "data.")
    fmt = get_format("imagefolder")
    fit, scored = (fmt.split(folder, s, img_size=(16, 16)) for s in ("train", "val"))
    assert fit.class_names == scored.class_names == ["cat", "dog"]
    assert sorted(fit.source.labels) == sorted(scored.source.labels) == [0, 0, 1, 1]
    assert not set(fit.source.paths) & set(scored.source.paths)
    own = get_format("images").split(cfg, "val", img_size=(16, 16), classes=[])  # the run's val: the scored half
    assert own.source.paths == scored.source.paths
    assert labelled_data(data_config("images", train_path="x")) is None


@pytest.mark.parametrize("value", [0.0, 1.0, -0.5, 2.0])
def test_a_fit_fraction_that_leaves_a_part_empty_is_refused(value):
    with pytest.raises(ConfigError, match="data.val_fit_fraction"):
        data_config("images", train_path="x", val_fit_fraction=value)


def test_each_task_declares_whether_it_reads_labels():
    assert {n for n, cls in TASKS.items() if not cls.reads_labels} == {"dino", "mae", "feature_distill"}
    assert get_format("images").labels is False and get_format("imagefolder").labels is True


def _refused(capsys, *args) -> str:
    assert main(["train", *args]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    return err[0]


def test_a_task_that_reads_labels_on_a_folder_without_classes_is_one_line(tmp_path, capsys):
    _write(tmp_path / "photos", ["a.jpg", "b/c.jpg"])
    run = tmp_path / "run"
    line = _refused(capsys, "digits_vit", "data.format=images", f"data.train_path={tmp_path / 'photos'}",
                    f"train.output_dir={run}")  # fmt: skip
    assert "train.task=classification reads class labels and data.format=images has none" in line
    assert "train.task=mae, dino, feature_distill" in line and not run.exists()
    # the class-folder format on a folder without class folders points to the images format
    line = _refused(capsys, "digits_vit", "data.format=imagefolder", f"data.train_path={tmp_path / 'photos' / 'b'}",
                    f"train.output_dir={run}")  # fmt: skip
    assert "has no class subfolders" in line and "data.format=images" in line and not run.exists()
    # a labelled split without class folders
    line = _refused(capsys, "digits_dino", "data.format=images", f"data.train_path={tmp_path / 'photos'}",
                    f"data.val_path={tmp_path / 'photos' / 'b'}", f"train.output_dir={run}")  # fmt: skip
    assert "data.val_path" in line and "has no class subfolders" in line and not run.exists()
