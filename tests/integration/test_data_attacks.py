"""Attacks on the surfaces that read the world, round three (docs/trust.md, "Attacks tried"): token
labels keyed by sample name, foreign teachers, remote data that stalls, files that declare more than
they hold. Each input is crafted here and reaches vitscale as a stranger's would, through the CLI and
against real servers the test starts (localhost HTTP, ``pipe:``); what hung once runs under a small
deadline, so a hang is a failure, never a stuck suite."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import torch
from PIL import Image

from vitscale.cli import main

QUIET = ["data.num_workers=0", "log.flops=false", "eval.every=0", "log.progress=plain", "log.report=false"]
TINY_VIT = ["model.num_layers=1", "model.hidden_size=16", "model.ffn_hidden_size=32"]


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("vitscale "), err  # one line, no traceback
    return lines[0]


def _png(v: int) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (8, 8), v).save(buf, format="PNG")
    return buf.getvalue()


def _shard(path: Path, keys: list[str], first_label: int = 0) -> Path:
    """A WebDataset shard written member by member (any name a tar can hold): ``<key>.png`` + ``<key>.cls``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for i, k in enumerate(keys):
            y = (first_label + i) % 10
            for ext, data in (("png", _png(20 * y + 5)), ("cls", str(y).encode())):
                info = tarfile.TarInfo(f"{k}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    """A real run folder of a tiny digits ViT (1 step): the teacher of label-tokens and distillation."""
    run = tmp_path_factory.mktemp("teacher") / "run"
    assert main(["train", "digits_vit", "train.max_steps=1", f"train.output_dir={run}", "train.batch_size=16",
                 "checkpoint.every=0", *TINY_VIT, *QUIET]) == 0  # fmt: skip
    return run


def _label_tokens(teacher: Path, train: Path, out: Path, *extra: str) -> int:
    return main(["label-tokens", "digits_vit", f"teacher.checkpoint={teacher}", "data.format=webdataset",
                 f"data.train_path={train}", "teacher.splits=[train]", "teacher.batch_size=8", *TINY_VIT,
                 *QUIET[:1], *extra, str(out)])  # fmt: skip


# ------------------------------------------------------------------------------------- token labels
def test_a_sample_key_held_in_two_shards_is_refused_naming_both(teacher, tmp_path, capsys):
    """Two shards whose samples share keys: the labels of one could not be told from the other's
    (the store mapped a key to its last row: half the samples trained on another image's labels)."""
    data = tmp_path / "data"
    _shard(data / "a.tar", [f"s{i:03d}" for i in range(8)])
    _shard(data / "b.tar", [f"s{i:03d}" for i in range(4, 12)], first_label=4)
    capsys.readouterr()
    assert _label_tokens(teacher, data, tmp_path / "labels") == 2
    line = _one_line(capsys.readouterr().err)
    assert "'s004'" in line and "a.tar" in line and "b.tar" in line and "unique" in line
    assert not (tmp_path / "labels").exists()  # refused before any label was written


def test_keys_holding_line_breaks_keep_every_row_on_its_sample(teacher, tmp_path, capsys):
    """Keys holding U+2028, U+0085, a file separator and a carriage return (a line-split keys file
    shifted every later sample onto its neighbour's row, then ended the run with an IndexError): the
    labels are made, a student streams the shards and trains, each sample found on its own row."""
    keys = ["a", "b\u2028c", "d\x85e", "f\x1cg", "h\ri", "j", "k\u2029l", "m"] * 2
    keys = [f"{k}{n}" for n, k in enumerate(keys)]
    data = tmp_path / "data"
    _shard(data / "x.tar", keys)
    labels = tmp_path / "labels"
    assert _label_tokens(teacher, data, labels, "teacher.topk=1") == 0
    capsys.readouterr()

    from vitscale.data.token_labels import TokenLabelStore

    store = TokenLabelStore(labels)
    rows = store.rows(torch.arange(len(keys)), keys)
    assert rows.tolist() == list(range(len(keys)))  # row i is the sample the teacher saw i-th
    assert json.loads((labels / "train.keys.json").read_text()) == keys
    run = tmp_path / "student"
    assert main(["train", "digits_vit", "train.task=token_labeling", f"token_label.path={labels}", "data.format=webdataset",
                 f"data.train_path={data}", "data.webdataset_mode=stream", "data.samples_per_epoch=16", "data.num_classes=10",
                 "train.batch_size=8",
                 "train.max_steps=3", f"train.output_dir={run}", "checkpoint.every=0", *TINY_VIT, *QUIET]) == 0  # fmt: skip
    assert json.loads((run / "summary.json").read_text())["steps"] == 3


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "train.keys.json").write_text(json.dumps(["a0", "a0"] + [f"k{i}" for i in range(8)])), "'a0' is held by two"),
    (lambda d: (d / "train.keys.json").write_text(json.dumps(["a0"])), "must list 10 sample keys"),
    (lambda d: (d / "train.keys.json").write_text("a0\nb1\n"), "is not JSON"),
])  # fmt: skip
def test_a_damaged_keys_file_is_refused_when_read(teacher, tmp_path, capsys, damage, message):
    """Keys edited after labelling (a duplicate, a row short, a line-per-key file): one line when the
    student starts, never a sample trained on another's row."""
    data = tmp_path / "data"
    _shard(data / "x.tar", [f"k{i}" for i in range(10)])  # every class: the teacher's head
    labels = tmp_path / "labels"
    assert _label_tokens(teacher, data, labels, "teacher.topk=1") == 0
    damage(labels)
    capsys.readouterr()
    assert main(["train", "digits_vit", "train.task=token_labeling", f"token_label.path={labels}", "data.format=webdataset",
                 f"data.train_path={data}", "train.batch_size=8", "train.max_steps=1",
                 f"train.output_dir={tmp_path / 'run'}", "checkpoint.every=0", *TINY_VIT, *QUIET]) == 2  # fmt: skip
    assert message in _one_line(capsys.readouterr().err)
