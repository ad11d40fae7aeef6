"""Attacks on the surfaces that read the world, round three (docs/trust.md, "Attacks tried"): token
labels keyed by sample name, foreign teachers, remote data that stalls, files that declare more than
they hold. Each input is crafted here and reaches vitscale as a stranger's would, through the CLI and
against real servers the test starts (localhost HTTP, ``pipe:``); what hung once runs under a small
deadline, so a hang is a failure, never a stuck suite."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from helpers import hub_cache, no_hang
from PIL import Image

from vitscale.cli import main

REPO = Path(__file__).parents[2]
QUIET = ["data.num_workers=0", "log.flops=false", "eval.every=0", "log.progress=plain", "log.report=false", "log.tensorboard=false"]
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
    (lambda d: (d / "train.keys.json").write_text(json.dumps(["k1", "k0"] + [f"k{i}" for i in range(2, 10)])),
     "reads row"),  # every key unique, two rows swapped: each row checked against its sample's class
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


# ------------------------------------------------------------------------------------- teachers
def _distill(teacher, out: Path, *extra: str) -> int:
    return main(["train", "digits_vit", f"distill.teacher={teacher}", "train.max_steps=3", "train.batch_size=16",
                 f"train.output_dir={out}", "checkpoint.every=0", *TINY_VIT, *QUIET, *extra])  # fmt: skip


def _teacher_copy(teacher: Path, tmp_path: Path) -> Path:
    import shutil

    dst = tmp_path / "teacher"
    shutil.copytree(teacher, dst, ignore=shutil.ignore_patterns("run.lock"))
    return dst


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.replace("std:\n  - 0.5\n  - 0.5\n  - 0.5", "std:\n  - 0.0\n  - 0.0\n  - 0.0"), "std [0.0, 0.0, 0.0]"),
    (lambda c: c.replace("mean:\n  - 0.5", "mean:\n  - .inf"), "mean [inf,"),
])  # fmt: skip
def test_a_teacher_whose_normalisation_cannot_be_right_is_refused(teacher, tmp_path, capsys, edit, message):
    """The teacher run's own config.yaml says std 0 (or a mean of infinity): its logits were NaN, hard
    distillation took their argmax, the student learnt one class and the run exited 0."""
    t = _teacher_copy(teacher, tmp_path)
    text = (t / "config.yaml").read_text()
    assert edit(text) != text
    (t / "config.yaml").write_text(edit(text))
    capsys.readouterr()
    assert _distill(t, tmp_path / "run") == 2
    line = _one_line(capsys.readouterr().err)
    assert message in line and "from the teacher's source" in line and "distill.teacher_std" in line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_teacher_of_another_class_order_is_refused_then_mapped(teacher, tmp_path, capsys):
    """The teacher run's classnames.txt in another order (the count alone matched: the student learnt
    from a permuted teacher): refused with the map by name; with distill.class_map the run trains."""
    t = _teacher_copy(teacher, tmp_path)
    names = (t / "classnames.txt").read_text().split()
    (t / "classnames.txt").write_text("\n".join(names[::-1]) + "\n")
    capsys.readouterr()
    assert _distill(t, tmp_path / "refused") == 2
    line = _one_line(capsys.readouterr().err)
    assert f"teacher {names[-1]!r}, data {names[0]!r}" in line and "distill.class_map=[9,8,7,6,5,4,3,2,1,0]" in line
    assert _distill(t, tmp_path / "mapped", "distill.class_map=[9,8,7,6,5,4,3,2,1,0]") == 0
    capsys.readouterr()
    assert _distill(t, tmp_path / "short", "distill.class_map=[0,1]") == 2
    assert "distill.class_map: give the teacher's class index (0 to 9) of each of the data's 10 classes" in _one_line(
        capsys.readouterr().err)


@pytest.mark.parametrize("overrides, message", [
    (['distill.teacher_model=vit_debug', 'distill.teacher_overrides={"hiden_size": 16}'],
     "distill.teacher_overrides: ViTConfig has no field 'hiden_size'; did you mean 'hidden_size'?"),
    (['distill.teacher_overrides={"hidden_size": 16}'], "distill.teacher_overrides change the variant named by"),
])  # fmt: skip
def test_teacher_settings_that_cannot_work_are_one_line(teacher, tmp_path, capsys, overrides, message):
    capsys.readouterr()
    assert _distill(teacher, tmp_path / "run", *overrides) == 2
    assert message in _one_line(capsys.readouterr().err)


@pytest.fixture(scope="module")
def hub_teacher(tmp_path_factory) -> tuple[Path, list[str]]:
    """A timm ViT of the tiny digits architecture saved by timm's ``save_for_hf`` (a Hub snapshot
    folder), its config naming the digits' classes, and the overrides that build it in vitscale."""
    timm = pytest.importorskip("timm")
    folder = tmp_path_factory.mktemp("hub") / "snap"
    tm = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=4, embed_dim=16, depth=1,
                           num_heads=4, mlp_ratio=2.0, num_classes=10, global_pool="avg")  # fmt: skip
    timm.models.save_for_hf(tm, str(folder), safe_serialization=True)
    over = {"patch_dim": 4, "hidden_size": 16, "ffn_hidden_size": 32, "num_attention_heads": 4, "num_layers": 1, "pool": "avg",
            "img_h": 32, "img_w": 32}  # fmt: skip
    return folder, ["distill.teacher_model=vit_debug", f"distill.teacher_overrides={json.dumps(over)}"]


def _hub_config(folder: Path, dst: Path, **changes) -> Path:
    import shutil

    shutil.copytree(folder, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for k, v in changes.items():
        if k == "label_names":
            cfg[k] = v
        else:
            cfg["pretrained_cfg"][k] = v
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("changes, message", [
    ({"input_size": [3, 20000, 20000]}, "teacher image size 20000x20000 (the teacher's source) is not usable"),
    ({"input_size": [3, -32, -32]}, "teacher image size -32x-32 (the teacher's source) is not usable"),
    ({"std": [0.5, 0.0, 0.5]}, "must be finite with every std > 0"),
    ({"mean": [1e999, 0.5, 0.5]}, "mean [inf, 0.5, 0.5]"),  # JSON reads 1e999 as infinity
])  # fmt: skip
def test_a_hub_teacher_whose_config_cannot_be_right_is_one_line(hub_teacher, tmp_path, capsys, changes, message):
    folder, args = hub_teacher
    bad = _hub_config(folder, tmp_path / "snap", **{k: v for k, v in changes.items()})
    if "mean" in changes:  # json.dumps writes Infinity; the stranger's file says 1e999
        (bad / "config.json").write_text((bad / "config.json").read_text().replace("Infinity", "1e999"))
    capsys.readouterr()
    assert _distill(bad, tmp_path / "run", *args) == 2
    assert message in _one_line(capsys.readouterr().err)


def test_a_hub_teacher_naming_its_classes_in_another_order_is_refused(hub_teacher, teacher, tmp_path, capsys):
    folder, args = hub_teacher
    names = (teacher / "classnames.txt").read_text().split()
    ok = _hub_config(folder, tmp_path / "ok", label_names=names)
    assert _distill(ok, tmp_path / "same", *args, "train.max_steps=1") == 0  # the same names: distils
    swapped = names[:]
    swapped[3], swapped[5] = swapped[5], swapped[3]
    bad = _hub_config(folder, tmp_path / "bad", label_names=swapped)
    capsys.readouterr()
    assert _distill(bad, tmp_path / "run", *args) == 2
    assert "distill.class_map=[0,1,2,5,4,3,6,7,8,9]" in _one_line(capsys.readouterr().err)


def test_a_teacher_emitting_nonfinite_logits_stops_the_run_naming_the_step(teacher, tmp_path, capsys):
    """Finite weights whose logits overflow (a head scaled to 3e38): hard distillation took the argmax
    of NaN and trained on it, exit 0. Now the run stops in one line naming the step, and nothing was
    learnt from it."""
    from safetensors.torch import load_file

    from vitscale import create_model
    from vitscale.checkpoint import export_safetensors

    over = {"patch_dim": 4, "hidden_size": 16, "ffn_hidden_size": 32, "num_attention_heads": 4, "num_layers": 1,
            "pool": "avg", "img_h": 32, "img_w": 32}  # fmt: skip
    model = create_model("vit_debug", **over)
    sd = load_file(teacher / "model.safetensors")
    sd["head.weight"] = torch.full_like(sd["head.weight"], 3e38) * torch.tensor([1.0, -1.0]).repeat(8)
    model.load_state_dict(sd)
    path = tmp_path / "overflow.safetensors"
    export_safetensors(model, path, {"model": "vit_debug", "overrides": json.dumps(over)})
    capsys.readouterr()
    assert _distill(path, tmp_path / "run", "train.max_steps=4") == 1
    assert "distill: the teacher's logits at step 1 are not finite" in _one_line(capsys.readouterr().err)
    # the run's last step: no later step reads its flag, so it is read at once (it trained on NaN, exit 0, before)
    assert _distill(path, tmp_path / "last", "train.max_steps=1") == 1
    assert "distill: the teacher's logits at step 1 are not finite" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "last" / "model.safetensors").exists()


# ------------------------------------------------------------------------------------- nothing hangs
HANG = 60  # seconds before a test counts as hung: far above what each run below takes


def _cli(args: list[str], timeout: int = HANG, env: dict | None = None) -> subprocess.CompletedProcess:
    """``vitscale ARGS`` in a fresh process under a deadline: a hang fails the test, never the suite."""
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "vitscale", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": path, **(env or {})})  # fmt: skip


def _in_process(args: list[str], capsys) -> subprocess.CompletedProcess:
    """``vitscale ARGS`` through ``vitscale.cli.main`` under an alarm (a hang fails the test): what
    ``_cli`` gives, without a fresh interpreter's start-up."""
    capsys.readouterr()
    with no_hang(HANG):
        rc = main(args)
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out.out, out.err)


def _stream_train(out: Path, path: str, *extra: str) -> list[str]:
    return ["train", "digits_vit", "data.format=webdataset", f"data.train_path={path}", "data.num_classes=10",
            "train.batch_size=8", "train.max_steps=2", f"train.output_dir={out}", "checkpoint.every=0", *TINY_VIT, *QUIET,
            *extra]  # fmt: skip


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shards")
    _shard(root / "a.tar", [f"k{i:02d}" for i in range(32)])
    return root


def test_a_pipe_writing_megabytes_to_stderr_does_not_deadlock(shards, tmp_path, capsys):
    """stderr was read only after stdout ended: a command writing more than a pipe holds (64 KiB)
    blocked on its next write, and the run with it. It is drained as the command runs."""
    cmd = f"pipe:head -c 1000000 /dev/zero >&2; cat {shards / 'a.tar'}"
    for mode in ("stream", "index"):
        res = _in_process(_stream_train(tmp_path / mode, cmd, f"data.webdataset_mode={mode}", f"data.shard_cache={tmp_path / 'c'}"),
                          capsys)  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert json.loads((tmp_path / mode / "summary.json").read_text())["steps"] == 2


@pytest.mark.parametrize("cmd, message", [
    ("pipe:sleep 50", "sent nothing for data.remote_timeout_s=1 s"),  # a silent command
    ("pipe:while true; do printf x; sleep 0.1; done", "still sending after data.remote_deadline_s=2 s"),  # a trickle
])  # fmt: skip
def test_a_silent_or_trickling_pipe_is_one_line_at_start_up(tmp_path, capsys, cmd, message):
    res = _in_process(_stream_train(tmp_path / "run", cmd, "data.webdataset_mode=stream", "data.remote_timeout_s=1",
                                    "data.remote_deadline_s=2", "data.remote_retries=0"), capsys)  # fmt: skip
    assert res.returncode == 2 and message in _one_line(res.stderr)


@pytest.fixture(scope="module")
def trickle_server(local_server):
    """A localhost HTTP server that answers every GET with headers, then one byte every 0.1 s, forever
    (never silent for long enough to trip a per-read timeout)."""
    import http.server
    import time

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(1 << 30))
            self.end_headers()
            try:
                for _ in range(600):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:  # the client gave up: what the test wants
                pass

        def log_message(self, *args):
            pass

    return local_server(Trickle)


@pytest.mark.parametrize("mode", ["stream", "index"])
def test_a_server_trickling_bytes_is_cut_at_the_deadline(trickle_server, tmp_path, capsys, mode):
    """A byte every 0.1 s kept data.remote_timeout_s (per read) from ever firing: start-up hung."""
    res = _in_process(_stream_train(tmp_path / "run", f"{trickle_server}/a.tar", f"data.webdataset_mode={mode}",
                                    "data.remote_timeout_s=1", "data.remote_deadline_s=2", "data.remote_retries=0",
                                    f"data.shard_cache={tmp_path / 'cache'}"), capsys)  # fmt: skip
    assert res.returncode == 2 and "not read within data.remote_deadline_s=2 s" in _one_line(res.stderr)
    assert not list(tmp_path.glob("cache/*.tar"))  # nothing cached as if complete


def test_the_hang_watchdog_is_armed_from_the_start(tmp_path):
    """train.hang_timeout bounds start-up too (it was armed at the first step): a first file that
    takes longer than the timeout ends the run with the stacks, exit 124."""
    res = _cli(_stream_train(tmp_path / "run", "pipe:sleep 50", "data.webdataset_mode=stream", "train.hang_timeout=2"))
    assert res.returncode == 124, res.stderr
    assert "no step completed for" in res.stderr and (tmp_path / "run" / "hang-rank0.txt").is_file()
    assert "no step completed in this process" in (tmp_path / "run" / "hang-rank0.txt").read_text()


def test_a_resampled_stream_of_bad_samples_stops_in_one_line(tmp_path, capsys):
    """Every sample bad (labels outside the classes): the resampled stream drew shards without end, its
    list of bad samples growing. It stops once it has drawn every shard (at least 16) without one good."""
    bad = tmp_path / "bad"
    _shard(bad / "a.tar", [f"k{i}" for i in range(8)], first_label=0)
    with tarfile.open(bad / "a.tar") as tf:  # every label 10: outside data.num_classes=5
        members = [(m, tf.extractfile(m).read()) for m in tf]
    with tarfile.open(bad / "a.tar", "w") as tf:
        for m, data in members:
            data = b"7" if m.name.endswith(".cls") else data
            m.size = len(data)
            tf.addfile(m, io.BytesIO(data))
    res = _in_process(_stream_train(tmp_path / "run", str(bad), "data.webdataset_mode=stream", "data.resampled=true",
                                    "data.num_classes=5", "data.samples_per_epoch=64"), capsys)  # fmt: skip
    line = res.stderr.strip().splitlines()[-1]  # after the warnings naming skipped samples
    assert res.returncode == 1 and line.startswith("vitscale train: ") and "Traceback" not in res.stderr, res.stderr
    assert "no good sample in" in line and "label 7 outside [0, 5)" in line


@pytest.mark.parametrize("overrides, message", [
    (["data.image_sizes=[32]", "data.tokens_per_batch=10000000"],
     "data.tokens_per_batch=10000000 makes the batch of size 32 156250 images, more than the 1497 training images"),
    (["data.image_sizes=[16,32]", "data.batch_sizes=[64,100000]"], "data.batch_sizes[1]=100000, more than the 1497 training images"),
])  # fmt: skip
def test_variable_resolution_batches_larger_than_an_epoch_are_refused(tmp_path, capsys, overrides, message):
    """Accepted before, then one step gathered epochs of images and no step ran (the one-size path
    refuses a batch larger than an epoch)."""
    capsys.readouterr()
    assert main(["train", "digits_vit", f"train.output_dir={tmp_path / 'run'}", "train.max_steps=1", *TINY_VIT, *QUIET,
                 *overrides]) == 2  # fmt: skip
    assert message in _one_line(capsys.readouterr().err)


# ------------------------------------------------------------------------------------- bounded by the bytes present
def _timm_pth(hub_teacher, path: Path, **changes) -> Path:
    from safetensors.torch import load_file

    sd = load_file(hub_teacher[0] / "model.safetensors")
    sd.update(changes)
    torch.save(sd, path)
    return path


@pytest.mark.parametrize("tensor, message", [
    (torch.zeros(1).as_strided((1 << 20, 1 << 20), (0, 0)),  # 2^40 elements over 4 bytes: the finiteness check hung
     "is a view of 1099511627776 elements (strides [0, 0]) over 4 bytes of storage"),
    (torch.eye(16).to_sparse(), "is a sparse_coo tensor (only dense ones are read)"),
    (torch.zeros(1, 0, 16), "(pos_embed: 1x0x16 in the file, 1x65x16 in the model)"),  # a position embedding of no tokens: an empty grid
])  # fmt: skip
def test_a_pth_tensor_that_is_not_plain_weights_is_one_line(hub_teacher, tmp_path, capsys, tensor, message):
    name = "pos_embed" if tensor.dim() == 3 else "head.weight" if tensor.is_sparse else "cls_token"
    pth = _timm_pth(hub_teacher, tmp_path / "w.pth", **{name: tensor})
    capsys.readouterr()
    with no_hang(HANG):
        rc = main(["train", "digits_vit", f"checkpoint.init_from={pth}", "checkpoint.init_format=timm", "train.max_steps=1",
                   f"train.output_dir={tmp_path / 'run'}", *TINY_VIT, *QUIET])  # fmt: skip
    assert rc in (1, 2)
    assert message in _one_line(capsys.readouterr().err)


def test_a_parquet_file_declaring_more_rows_than_bytes_is_refused_before_reading(tmp_path, capsys):
    """A few kilobytes declaring a million rows (null images, one label repeated: run-length encoded);
    the attack's 1.4 MB file declaring 10^8 took 92 s and 4.9 GB before the first check."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 1_000_000
    data = tmp_path / "data"
    data.mkdir()
    table = pa.table({"image": pa.nulls(n, pa.binary()), "label": pa.array(torch.zeros(n, dtype=torch.int64).numpy())})
    pq.write_table(table, data / "x.parquet")
    size = (data / "x.parquet").stat().st_size
    assert size < n
    capsys.readouterr()
    with no_hang(HANG):
        rc = main(["train", "digits_vit", "data.format=parquet", f"data.train_path={data}", "train.max_steps=1",
                   f"train.output_dir={tmp_path / 'run'}", *TINY_VIT, *QUIET])  # fmt: skip
    assert rc == 2
    assert f"x.parquet declares {n} rows in {size} bytes (fewer than one byte a row)" in _one_line(capsys.readouterr().err)


def _shard_with_a_huge_member(path: Path, ext: str, size: int) -> Path:
    """A shard whose sample k3 has a member of ``size`` bytes: a sparse file (a hole, no disk used)."""
    _shard(path, [f"k{i}" for i in range(16)])
    with tarfile.open(path) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf]
    with open(path, "wb") as out:
        for m, blob in members:
            out.write(m.tobuf(format=tarfile.PAX_FORMAT))
            out.write(blob + b"\0" * (-len(blob) % tarfile.BLOCKSIZE))
            if m.name == "k3.png":
                big = tarfile.TarInfo(f"k3.{ext}")
                big.size = size
                out.write(big.tobuf(format=tarfile.PAX_FORMAT))
                out.seek(size + (-size % tarfile.BLOCKSIZE), os.SEEK_CUR)  # a hole: read as zeros
        out.write(b"\0" * tarfile.BLOCKSIZE * 2)
    return path


def test_a_huge_label_member_is_never_read_whole(tmp_path, capsys):
    """A 2.5 GB ``.cls`` member (sparse here) took 15 GB of memory: index mode refuses the shard in one
    line naming the member, before reading it."""
    data = tmp_path / "data"
    _shard_with_a_huge_member(data / "a.tar", "json", 2_500_000_000)
    capsys.readouterr()
    with no_hang(HANG):
        rc = main(["train", "digits_vit", "data.format=webdataset", f"data.train_path={data}", "train.max_steps=1",
                   "data.label_key=json.label", "data.num_classes=10", f"train.output_dir={tmp_path / 'run'}", *TINY_VIT,
                   *QUIET])  # fmt: skip
    assert rc == 2
    line = _one_line(capsys.readouterr().err)
    assert "member k3.json is 2500000000 bytes, more than the 4194304 a label, caption or JSON member may hold" in line


def test_a_huge_member_in_a_stream_is_skipped_unread(tmp_path, capsys):
    """Streamed, the member's bytes are passed over, never held: its sample is skipped with the reason."""
    from vitscale.data.tar import SMALL_MEMBER_MAX, iter_samples

    shard = _shard_with_a_huge_member(tmp_path / "a.tar", "txt", SMALL_MEMBER_MAX + 1)
    with open(shard, "rb") as f:
        samples = list(iter_samples(f, str(shard)))
    assert [s["__key__"] for s in samples] == [f"k{i}" for i in range(16)]
    assert "txt" not in samples[3] and "more than the 4194304" in samples[3]["__too_large__"]
    res = _in_process(_stream_train(tmp_path / "run", str(tmp_path), "data.webdataset_mode=stream", "data.samples_per_epoch=16",
                                    "data.shuffle_buffer=0"), capsys)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "k3 (member k3.txt is 4194305 bytes" in (tmp_path / "run" / "train.log").read_text()


def test_a_cut_http_shard_is_named_and_never_cached_as_complete(shards, local_server, tmp_path, capsys):
    """A server that sends half a shard without a length and closes: the copy looked complete, was
    cached, and every later run read the cut copy. Now it is named, not cached; served whole, it trains."""
    import http.server

    whole = (shards / "a.tar").read_bytes()
    state = {"cut": True}

    class Cut(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # no length: the end of the body is where the connection closes

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(whole[: len(whole) // 2] if state["cut"] else whole)

        def log_message(self, *args):
            pass

    url, cache = f"{local_server(Cut)}/a.tar", tmp_path / "cache"
    args = ["data.webdataset_mode=index", "data.remote_retries=0", f"data.shard_cache={cache}"]
    capsys.readouterr()
    with no_hang(HANG):
        assert main(_stream_train(tmp_path / "cut", url, *args)) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"{url} was cut short" in line and "no end-of-archive blocks" in line
    assert not list(cache.glob("*.tar"))
    state["cut"] = False
    with no_hang(HANG):
        assert main(_stream_train(tmp_path / "whole", url, *args)) == 0
    assert len(list(cache.glob("*.tar"))) == 1


# ------------------------------------------------------------------------------------- the Hub: the cache only
def test_label_tokens_reads_an_hf_hub_teacher_from_the_cache_only(hub_teacher, local_server, tmp_path):
    """``teacher.timm=hf-hub:…``: timm fetched the architecture's config from the Hub (docs/trust.md:
    the cache only). HF_ENDPOINT points at a server the test starts, which counts every request: none."""
    import http.server

    asked = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_error(500)

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    cache = hub_cache(tmp_path / "hub", "acme/tiny-vit", hub_teacher[0])
    env = {"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": local_server(Hub), "HF_HUB_OFFLINE": "0"}
    args = ["label-tokens", "digits_vit", "teacher.timm=hf-hub:acme/tiny-vit", "teacher.batch_size=500",
            "teacher.splits=[val]", *QUIET[:1]]  # fmt: skip
    res = _cli([*args, "teacher.checkpoint=hf-hub:acme/tiny-vit", str(tmp_path / "labels")], env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["splits"]["val"]["images"] == 300
    res = _cli([*args, "teacher.checkpoint=hf-hub:acme/missing", str(tmp_path / "none")], env=env)
    assert res.returncode == 1 and "no snapshot of acme/missing in the local Hugging Face cache" in _one_line(res.stderr)
    assert asked == []  # not one request reached the Hub


# ------------------------------------------------------------------------------------- one line, not a traceback
@pytest.mark.parametrize("config, overrides, message", [
    ("digits_vit", ["checkpoint.save_on_signal=[SIGTERM,SIGUSR3]"], "'SIGUSR3' is not a signal name here (did you mean SIGUSR2?)"),
    ("digits_vit", ["checkpoint.save_on_signal=SIGKILL"], "SIGKILL cannot be caught by any process"),
    # both refused by their declared ranges as the config loads (round four: every number has a range)
    ("digits_naflex", ["data.eval_seq_len=1000000000"], "data.eval_seq_len=1000000000 is out of range: use 1 to 262,144"),
    ("digits_naflex", ["data.digits_sizes=[[100000,100000]]"], "data.digits_sizes[0][0]=100000 is out of range: use 1 to 512"),
    ("digits_naflex", ["model.class_token_length=-1"], "class_token_length must be a count of prefix tokens, 0 or more"),
])  # fmt: skip
def test_signal_names_and_naflex_sizes_are_one_line(tmp_path, capsys, config, overrides, message):
    """Each was an AttributeError, an allocation of 30-48 GB or a shape error, as a traceback."""
    capsys.readouterr()
    assert main(["train", config, "train.max_steps=1", f"train.output_dir={tmp_path / 'run'}", *QUIET, *overrides]) == 2
    assert message in _one_line(capsys.readouterr().err)
    assert not list(tmp_path.glob("run/*"))  # refused before anything was written


@pytest.mark.parametrize("path", ["s3://bucket/a.tar", "s3://bucket/shards/"])  # a file; a folder to list
def test_a_silent_s3_endpoint_is_one_line_at_start_up(tmp_path, path, monkeypatch, capsys):
    """An S3 endpoint that accepts connections and never answers: botocore waited 60 s a read and
    retried on its own (46 s at data.remote_timeout_s=1 before). Now data.remote_timeout_s is its read
    timeout, one attempt, vitscale's own retries."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held = []

    def accept():
        while True:
            try:
                held.append(srv.accept()[0])  # accepted, never answered
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{srv.getsockname()[1]}"}  # fmt: skip
    s3fs = pytest.importorskip("s3fs")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s3fs.S3FileSystem.clear_instance_cache()  # fsspec keeps file systems per process: none bound to another server
    capsys.readouterr()
    try:
        with no_hang(30):  # in this process: no interpreter start-up inside the bound
            rc = main(_stream_train(tmp_path / "run", path, "data.webdataset_mode=stream", "data.remote_timeout_s=1",
                                    "data.remote_retries=0"))  # fmt: skip
    finally:
        s3fs.S3FileSystem.clear_instance_cache()  # nor one bound to this silent server for the tests after
        srv.close()
        for c in held:
            c.close()
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]  # after s3fs's own warnings, if any
    assert rc == 2 and line.startswith("vitscale train: ") and "Read timeout" in line, err
