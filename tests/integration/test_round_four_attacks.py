"""Attacks on what wave four added, round four (docs/trust.md, "Round four"): metadata checked against
the data it describes (sample keys, zero-shot class names and templates, ReaL files, class maps,
token-label files), numbers without a bound, and a new user's walk through the README. Each input is
made here and reaches vitscale through the CLI, as a stranger's would."""

from __future__ import annotations

import io
import json
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


# ------------------------------------------------------- settings and metadata refused before a step
TINY_CLIP = ["model.overrides.vision.num_layers=1", "model.overrides.text.num_layers=1"]
NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _names(names) -> str:
    return "[" + ",".join(names) + "]"


REFUSED = [  # (row, recipe, overrides, words in the one line)
    ("zeroshot names, 3 for 10 classes", "digits_clip", [f"clip.class_names={_names(NAMES[:3])}"],
     "clip.class_names has 3 names but the data has 10 classes"),
    ("zeroshot names, 12 for 10 classes", "digits_clip", [f"clip.class_names={_names(NAMES + ['ten', 'eleven'])}"],
     "has 12 names but the data has 10 classes"),
    ("zeroshot names in another order", "digits_clip", [f"clip.class_names={_names(NAMES[::-1])}"],
     "names the data's classes in another order"),
    ("a name twice", "digits_clip", [f"clip.class_names={_names(NAMES[:9] + ['zero'])}"], "names 'zero' twice"),
    ("an evaluator's names of the wrong count", "digits_clip",
     ["evals=[{kind: zeroshot, class_names: [a, b, c]}]"], "zeroshot.class_names has 3 names but the data has 10"),
    ("a template without {}", "digits_clip", ["clip.zeroshot_templates=[a photo]"], "exactly once, as {}"),
    ("a template with {1}", "digits_clip", ["clip.zeroshot_templates=['a {1}']"], "it has 1 place(s): {1}"),
    ("a caption template with two places", "digits_clip", ["clip.caption_templates=['{} and {}']"], "exactly once"),
    ("an evaluator's template with a lone brace", "digits_clip", ["evals=[{kind: zeroshot, templates: ['a {']}]"],
     "is not a format string"),
    ("rand-n100000", "digits_vit", ["data.auto_augment=rand-n100000"], "n100000 in 'rand-n100000' is out of range"),
    ("rand-m100000", "digits_vit", ["data.auto_augment=rand-m100000-n2"], "m100000"),
    ("crop_pct=1e6", "digits_vit", ["data.crop_pct=1e6"], "data.crop_pct=1000000.0 must be in [0.1, 2.0]"),
    ("a missing data folder (README walk)", "digits_vit", ["data.format=imagefolder", "data.train_path=/does/not/exist"],
     "/does/not/exist"),
    ("crop_pct=1e6 with border", "digits_vit", ["data.crop_pct=1e6", "data.eval_crop_mode=border"], "data.crop_pct"),
]  # fmt: skip


@pytest.mark.parametrize("row, recipe, overrides, words", REFUSED, ids=[r[0] for r in REFUSED])
def test_settings_and_metadata_that_contradict_the_data_are_refused_before_a_step(tmp_path, capsys, row, recipe,
                                                                                  overrides, words):  # fmt: skip
    """Each a one-line refusal, exit code 2, before a step — and nothing left where the run would have
    written (the run folder is not there)."""
    out = tmp_path / "runs" / "x"
    tiny = TINY_CLIP if recipe == "digits_clip" else TINY_VIT
    rc = main(["train", recipe, f"train.output_dir={out}", "train.max_steps=1", "train.batch_size=16", *tiny, *QUIET,
               *overrides])  # fmt: skip
    line = _one_line(capsys.readouterr().err)
    assert rc == (1 if "missing" in row else 2) and words in line, (rc, line)  # a missing file: exit code 1
    assert not out.exists() and not out.parent.exists(), sorted(p.name for p in out.rglob("*"))


def _real_file(tmp: Path, text: str) -> Path:
    (tmp / "real.json").write_text(text)
    return tmp / "real.json"


_ROWS = {str(i): [i % 10] for i in range(300)}  # the digits' val images are named by their index
REAL = [  # (row, the label file's text, words in the one line)
    ("an image named twice (two keys of one name)", json.dumps({**_ROWS, "7.png": [1]}), "names the image '7' twice"),
    ("a key twice in the JSON", json.dumps(_ROWS)[:-1] + ', "7": [3]}', "names '7' twice"),
    ("a class twice in a list", json.dumps({**_ROWS, "7": [7, 7]}), "names a class twice"),
    ("every list empty", json.dumps({k: [] for k in _ROWS}), "every list of"),
    ("a file far larger than the split's labels (one long row)", json.dumps([[1] * 200_000] + [[1]] * 299),
     "more than a label file of 300 images and 10 classes can need"),
    ("a deeply nested list", "[" * 5000 + "]" * 5000, "nested too deeply"),
]  # fmt: skip


@pytest.mark.parametrize("row, text, words", REAL, ids=[r[0] for r in REAL])
def test_a_real_file_that_cannot_describe_the_split_is_refused(tmp_path, capsys, row, text, words):
    """A ReaL file naming an image twice kept the last list (4.67% instead of 20.67%); a 20 MB file
    asked for a 24 GB table; empty lists gave no metric and no word; deep nesting a RecursionError."""
    labels = _real_file(tmp_path, text)
    out = tmp_path / "run"
    rc = main(["train", "digits_vit", f"train.output_dir={out}", "train.max_steps=1", "train.batch_size=16", *TINY_VIT,
               *QUIET, f"evals=[{{kind: real, labels: {labels}}}]"])  # fmt: skip
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and words in line, line
    assert not out.exists()


@pytest.mark.parametrize("class_map, words", [
    ("[0,1,2,3,4,5,6,7,8,9]", "maps data class 0 ('zero') to the teacher's class 0 ('nine')"),  # the identity over a reversed teacher
    ("[0,0,0,0,0,0,0,0,0,0]", "names the teacher's class 0 for 10 data classes"),
])  # fmt: skip
def test_a_class_map_that_contradicts_the_names_is_refused(teacher, tmp_path, capsys, class_map, words):
    """distill.class_map against the names the project has just read (the teacher run's classnames.txt
    reversed): the identity, or every class taught by class 0, was used silently."""
    import shutil

    t = tmp_path / "teacher"
    shutil.copytree(teacher, t, ignore=shutil.ignore_patterns("run.lock"))
    names = (t / "classnames.txt").read_text().split()
    (t / "classnames.txt").write_text("\n".join(names[::-1]) + "\n")
    capsys.readouterr()
    out = tmp_path / "run"
    rc = main(["train", "digits_vit", f"distill.teacher={t}", f"distill.class_map={class_map}", "train.max_steps=1",
               "train.batch_size=16", f"train.output_dir={out}", *TINY_VIT, *QUIET])  # fmt: skip
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and words in line, line
    assert not out.exists()


def test_rankme_of_overflowing_or_nonfinite_embeddings_is_a_clean_metric():
    """Weights finite but x1e20: the embeddings near float32's limit made RankMe's SVD end the run with a
    LinAlgError. The rank does not depend on the scale (the same value); non-finite embeddings (a step
    the guard did not apply) give no metric — never a traceback, never a bare NaN in metrics.jsonl."""
    import torch

    from vitscale.tasks.health import RankWatch, effective_rank

    z = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    base = float(effective_rank(z))
    assert 1 < base <= 32
    assert float(effective_rank(z * 3e36)) == pytest.approx(base, rel=1e-4)  # near float32's max: the same rank
    watch = RankWatch()
    watch.keep(torch.full((8, 4), float("inf")))
    assert watch.read(10) == ({}, [])
    watch.keep(z * 3e36)
    assert watch.read(11)[0]["train_rankme"] == pytest.approx(base, rel=1e-4)


# ------------------------------------------------------------------------- the command line, lows
def test_command_line_lows_are_one_line(tmp_path, capsys, monkeypatch):
    """`--import ../x` (a TypeError traceback), `--max-shard-size nan` (a message naming no option), a
    configs/<name>.yaml in the working folder replacing the built-in recipe without a word, and the
    pipe: refusal's advice for a list element (syntax the command line refuses)."""
    capsys.readouterr()
    assert main(["--import", "../x", "models"]) == 2
    assert "give a module's name, not a path" in _one_line(capsys.readouterr().err.replace("vitscale:", "vitscale :"))

    from vitscale.checkpoint.consolidate import parse_size
    from vitscale.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"--max-shard-size 'nan' is not a size"):
        parse_size("nan")
    assert parse_size("5GB") == 5_000_000_000

    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "digits_vit.yaml").write_text("train:\n  max_steps: 3\n")
    with pytest.raises(ConfigError, match=r"names both the built-in recipe .* differ: give the path"):
        load_config("digits_vit")
    assert load_config("configs/digits_vit.yaml").train.max_steps == 3  # the path: yours
    (tmp_path / "configs" / "mine.yaml").write_text("train:\n  max_steps: 4\n")
    assert load_config("mine").train.max_steps == 4  # a name only the working folder has: used

    (tmp_path / "run.yaml").write_text("evals:\n  - kind: classification\n    data: {format: webdataset, val_path: 'pipe:cat x.tar'}\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(tmp_path / "run.yaml"))
    assert "give the whole list on the command line (evals=[...]" in str(e.value), str(e.value)


def test_a_lock_read_before_its_owner_wrote_it_names_the_owner(tmp_path):
    """The lock taken, its record written a moment later: the second run said "host ?, pid ?"."""
    import fcntl
    import os
    import threading

    from vitscale.run.folder import LOCK_NAME, FolderInUse, RunLock

    fd = os.open(tmp_path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the owner has the lock, not yet its record
    writer = threading.Timer(0.3, lambda: os.write(fd, json.dumps({"host": "box", "pid": 4242}).encode()))
    writer.start()
    try:
        with pytest.raises(FolderInUse, match=r"host box, pid 4242"):
            RunLock(tmp_path).acquire()
    finally:
        writer.join()
        os.close(fd)


def test_under_torchrun_one_rank_prints_a_refusal(tmp_path, capsys, monkeypatch):
    """Each of 8 ranks printed the same refusal: a refusal (exit code 2, the same on every rank) is
    printed by rank 0 only, the others exit quietly with its code; another error names its rank."""
    monkeypatch.setenv("RANK", "3")
    capsys.readouterr()
    assert main(["train", "digits_vit", "train.batch_size=0", f"train.output_dir={tmp_path / 'r'}"]) == 2
    assert capsys.readouterr().err == ""
    assert main(["eval", "digits_vit", f"checkpoint.path={tmp_path / 'missing'}"]) == 1
    assert "vitscale eval (rank 3): " in _one_line(capsys.readouterr().err)
    monkeypatch.setenv("RANK", "0")
    assert main(["train", "digits_vit", "train.batch_size=0", f"train.output_dir={tmp_path / 'r'}"]) == 2
    assert "train.batch_size=0" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("argv, words", [
    (["bench", "vit_h14", "--fp8", "tensorwise", "--baseline", "fp8=none"], "this machine has no GPU"),  # the README's line
    (["bench", "vit_h14", "--device", "cuda"], "this machine has no GPU"),  # was a RuntimeError traceback (--dry-run
    # with --device cuda checks a command line for a GPU machine: it passes, below)
    (["bench", "vit_h14", "--mlp-epilogue", "cublaslt", "--set", "activation=gelu_tanh"], "runs cuBLASLt epilogues on CUDA"),
    (["bench", "vit_h14", "--compile", "--compile-mode", "reduce-overhead"], "which need a CUDA device"),
], ids=["fp8", "device-cuda", "mlp-epilogue", "cuda-graphs"])  # fmt: skip
def test_bench_fp8_on_a_machine_without_a_gpu_is_one_line(capsys, argv, words):
    """The README's `vitscale bench vit_h14 --fp8 ...` pasted on a CPU machine started an fp32 CPU
    benchmark of 632M parameters (still warming up after 120 s), and --dry-run did not say so; every
    other GPU-only option of the bench is one line too, before a model is built and in --dry-run."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the line is for one without")
    for dry in ([], ["--dry-run"]):
        capsys.readouterr()
        if dry and "--device" in argv:
            assert main([*argv, *dry]) == 0 and '"device": "cuda"' in capsys.readouterr().out
            continue
        assert main([*argv, *dry]) == 2
        assert words in _one_line(capsys.readouterr().err)


def test_train_on_cuda_without_a_gpu_is_one_line(tmp_path, capsys):
    """`train.device=cuda` on a machine without a GPU: a RuntimeError traceback; now one line, exit 2,
    no run folder."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the line is for one without")
    capsys.readouterr()
    assert main(["train", "digits_vit", "train.device=cuda", f"train.output_dir={tmp_path / 'r'}"]) == 2
    assert "this machine has no GPU" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "r").exists()


def _one_class_folder(root: Path) -> Path:
    for split in ("train", "val"):
        (root / split / "zero").mkdir(parents=True)
        for i in range(6):
            Image.new("L", (8, 8), 10 * i).save(root / split / "zero" / f"{i}.png")
    return root


@pytest.mark.parametrize("case", ["overflowing weights", "one class"])
def test_a_probe_of_features_that_say_nothing_says_so(teacher, tmp_path, capsys, case):
    """`vitscale eval` of weights x1e20 (non-finite features) reported 9.67% and a bare NaN in its
    JSON; a probe of one class reported 100% with no note. Now: no metric and the reason, or the
    metric with a note; the JSON is JSON."""
    from safetensors.torch import load_file, save_file

    weights = teacher / "model.safetensors"
    if case == "overflowing weights":
        sd = {k: v * 1e20 if v.ndim > 1 else v for k, v in load_file(weights).items()}
        weights = tmp_path / "big.safetensors"
        save_file(sd, weights)
        data = ["data.format=digits"]
    else:
        root = _one_class_folder(tmp_path / "one")
        data = ["data.format=imagefolder", f"data.train_path={root / 'train'}", f"data.val_path={root / 'val'}"]
    capsys.readouterr()
    rc = main(["eval", "digits_vit", f"checkpoint.path={weights}", "eval.probe=linear", "eval.probe_max_iter=5",
               "eval.batch_size=64", *TINY_VIT, *QUIET[:1], *data])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    result = json.loads(out[out.index("{"):])  # strict JSON: a bare NaN would fail here
    note = json.dumps(result)
    if case == "overflowing weights":
        assert "are not finite" in note and "linear_probe_top1" not in note, note
    else:
        assert "every prediction is right" in note and "linear_probe_top1" in note, note  # the metric, with its note
