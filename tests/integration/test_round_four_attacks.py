"""Attacks on what wave four added, round four (docs/trust.md, "Round four"): metadata checked against
the data it describes (sample keys, zero-shot class names and templates, ReaL files, class maps,
token-label files), numbers without a bound, and a new user's walk through the README. Each input is
made here and reaches vitscale through the CLI, as a stranger's would."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
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


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _sample(key: str, y: int) -> list[tuple[str, bytes]]:
    return [(f"{key}.png", _png(20 * y + 5)), (f"{key}.cls", str(y).encode())]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    """A real run folder of a tiny digits ViT (1 step): a teacher for label-tokens."""
    run = tmp_path_factory.mktemp("teacher") / "run"
    assert main(["train", "digits_vit", "train.max_steps=1", f"train.output_dir={run}", "train.batch_size=16",
                 "checkpoint.every=0", *TINY_VIT, *QUIET]) == 0  # fmt: skip
    return run


# ------------------------------------------------------------------- a sample key twice in one shard
def _twice_apart(n: int = 16) -> list:  # each key holds two images, the second pass after every other key
    return [m for i in range(n) for m in _sample(f"k{i:03d}", i % 10)] + \
        [m for i in range(n) for m in _sample(f"k{i:03d}", (i + 3) % 10)]  # fmt: skip


def _twice_together(n: int = 16) -> list:  # one member name twice, side by side (after one clean sample)
    return _sample("k", 0) + [m for i in range(n) for m in [(f"k{i:03d}.png", _png(5)), (f"k{i:03d}.png", _png(200)),
                                                            (f"k{i:03d}.cls", str(i % 10).encode())]]  # fmt: skip


def _train(data, out, *extra):
    return main(["train", "digits_vit", "data.format=webdataset", f"data.train_path={data}", "data.num_classes=10",
                 "train.batch_size=8", "train.max_steps=2", f"train.output_dir={out}", "checkpoint.every=0",
                 *TINY_VIT, *QUIET, *extra])  # fmt: skip


@pytest.mark.parametrize("members", [_twice_apart, _twice_together], ids=["apart", "together"])
@pytest.mark.parametrize("how", ["inspect", "index", "stream", "stream-mid-run", "label-tokens"])
def test_a_sample_key_twice_in_one_shard_is_refused(tmp_path, capsys, members, how, request):
    """A shard in which each key holds two images: merged silently (`data inspect` counted one sample a
    key, index mode dropped one image), or streamed as two samples of one key (token labels found by
    key read the other image's). Refused in every mode, naming the key — never merged or dropped."""
    data = tmp_path / "data"
    _tar(data / "a.tar", members())
    out = tmp_path / "run"
    capsys.readouterr()
    if how == "inspect":
        rc = main(["data", "inspect", str(data), "--format", "webdataset", "--samples", "4", "--img-size", "8"])
    elif how == "index":
        rc = _train(data, out)
    elif how == "stream":  # the first shard is read whole at start-up (to count it)
        rc = _train(data, out, "data.webdataset_mode=stream")
    elif how == "stream-mid-run":  # only its first sample at start-up: the stream stops where the key comes back
        rc = _train(data, out, "data.webdataset_mode=stream", "data.samples_per_epoch=64", "data.shuffle_buffer=0",
                    "train.max_steps=8")  # fmt: skip
    else:
        teacher = request.getfixturevalue("teacher")
        rc = main(["label-tokens", "digits_vit", f"teacher.checkpoint={teacher}", "data.format=webdataset",
                   f"data.train_path={data}", "teacher.splits=[train]", *TINY_VIT, *QUIET[:1], str(out)])  # fmt: skip
    line = _one_line(capsys.readouterr().err)
    assert rc == (1 if how == "stream-mid-run" else 2), line
    assert "'k000' is used twice in one shard" in line and "a.tar" in line, line
    if how == "label-tokens":
        assert not out.exists()
