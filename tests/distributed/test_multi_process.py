"""After training, on 2 gloo ranks through the CLI, against one process:

- `vitscale eval` (launched by torchrun, and on FSDP and TP layouts) gives the one-process numbers:
  top-1 / top-5 / loss of the weights and of their EMA, a linear probe, a list of evaluations
  (``evals:``: class-subset and ReaL accuracy), and CLIP zero-shot and retrieval on a validation set
  of 51 captioned digits (odd: it divides neither by the ranks nor by the batch, so a rank runs a
  padding batch);
- `vitscale label-tokens` writes the one-process files bit for bit;
- training with EMA on FSDP and on TP gives the one-process EMA weights (within the layouts' float
  rounding), checkpointed with the run and resumed bit-exactly on FSDP, and exported.

One process group for all the 2-rank work (one fork of the test process), one torchrun launch.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _launch import free_port, needs_cpu_fsdp, run_distributed
from safetensors.torch import load_file

pytestmark = pytest.mark.multiprocess

STEPS, CKPT_AT = 6, 3
TRAIN = [
    f"train.max_steps={STEPS}", "train.epochs=0", "train.batch_size=16", "model.num_layers=2", "train.ema_decay=0.5",
    "schedule.name=constant", "schedule.warmup_steps=0", "log.progress=none", "log.flops=false", "eval.every=0",
    f"checkpoint.every={CKPT_AT}", "checkpoint.keep=5", "log.report=false", "log.tensorboard=false",
]  # fmt: skip
VIT_EVAL = ["eval.batch_size=64"]  # 300 val digits: batches 64 x 4 + 44, dealt 3 / 2 (+ 1 padding) to 2 ranks
PROBE = ["eval.probe=linear", "eval.probe_l2=[0.01]"]
CLIP_TRAIN = ["train.max_steps=3", "train.epochs=0", "train.batch_size=32", "model.overrides.vision.num_layers=1",
              "model.overrides.text.num_layers=1", "log.progress=none", "log.flops=false", "eval.every=0", "log.report=false",
              "log.tensorboard=false"]  # fmt: skip
LABEL = ["teacher.splits=[val]", "teacher.batch_size=64"]
TP = ["parallel.tp=2", "parallel.dp_shard=1"]


def _evals(root: Path) -> str:
    """``evals=[...]``: class-subset accuracy and ReaL accuracy with label lists for the 300 val digits."""
    from vitscale.data.digits import load_digits_split

    real = root / "real.json"
    if not real.exists():  # every third list empty (left out), the others the label and its successor
        labels = load_digits_split("val", num_channels=1)[1].tolist()  # in-memory digits are named by their index
        real.write_text(json.dumps({str(i): [] if i % 3 == 0 else [y, (y + 1) % 10] for i, y in enumerate(labels)}))
    return f"evals=[{{kind: class_subset, classes: [1, 3, 5]}}, {{kind: real, labels: {real}}}]"
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
TEMPLATES = ["a photo of the number {}.", "a handwritten {}.", "the number {}, written by hand."]


def _main(*argv: str) -> None:
    from vitscale.cli import main

    assert main(list(argv)) == 0, argv


def _eval(out: Path, *argv: str) -> None:
    _main("eval", *argv, "--output", str(out))


def _label_tokens(*argv: str) -> dict:
    """`vitscale label-tokens`; its printed summary (rank 0's; {} on the others)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        _main("label-tokens", *argv)
    return json.loads(buf.getvalue()) if buf.getvalue().strip() else {}


def _captioned_digits(folder: Path, n: int = 51) -> Path:
    """The first ``n`` validation digits as PNG files with captions and labels in a CSV (``data.format=csv``)."""
    from PIL import Image

    from vitscale.data.digits import load_digits_split

    folder.mkdir()
    images, labels = load_digits_split("val", num_channels=1)
    with open(folder / "pairs.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["filepath", "title", "label"])
        for i in range(n):
            y = int(labels[i])
            Image.fromarray(images[i, 0].numpy(), "L").resize((16, 16), Image.Resampling.BICUBIC).save(folder / f"{i}.png")
            rows.writerow([f"{i}.png", TEMPLATES[i % len(TEMPLATES)].format(WORDS[y]), y])
    (folder / "classnames.txt").write_text("\n".join(WORDS) + "\n")
    return folder / "pairs.csv"


def _clip_data(pairs: Path) -> list[str]:
    return ["data.format=csv", f"data.train_path={pairs}", f"data.val_path={pairs}", "data.csv_label_key=label",
            "data.num_workers=0", "eval.batch_size=8"]  # 51 pairs: batches 8 x 6 + 3, 4 / 3 (+ 1 padding)  # fmt: skip


def _two_ranks(root: str) -> dict:
    import torch.distributed as dist

    dist.init_process_group("gloo")  # one group for all the commands below (each would else make its own)
    root = Path(root)
    single, clip, pairs = root / "single", root / "clip", root / "captions" / "pairs.csv"
    rank = int(os.environ["RANK"])
    # training with EMA: FSDP (the default layout) and TP; the FSDP run resumed from its step-3 checkpoint
    _main("train", "digits_vit", *TRAIN, f"train.output_dir={root / 'fsdp'}")
    _main("train", "digits_vit", *TRAIN, *TP, f"train.output_dir={root / 'tp'}")
    if rank == 0:
        src = root / "fsdp" / "checkpoints" / f"step_{CKPT_AT:08d}"
        shutil.copytree(src, root / "fsdp_resumed" / "checkpoints" / src.name)
    dist.barrier()
    _main("train", "digits_vit", *TRAIN, f"train.output_dir={root / 'fsdp_resumed'}")
    # evaluation of the one-process runs' weights
    cfg, out = str(single / "config.yaml"), root / "2"
    _eval(out / "vit_fsdp.json", cfg, f"checkpoint.path={single}", *VIT_EVAL)
    _eval(out / "vit_tp.json", cfg, f"checkpoint.path={single}", *VIT_EVAL, *TP)
    _eval(out / "probe_fsdp.json", cfg, f"checkpoint.path={single}", *VIT_EVAL, *PROBE)
    _eval(out / "evals_fsdp.json", cfg, f"checkpoint.path={single}", *VIT_EVAL, _evals(root))
    clip_cfg = [str(clip / "config.yaml"), f"checkpoint.path={clip}", *_clip_data(pairs)]
    _eval(out / "clip_fsdp.json", *clip_cfg)
    _eval(out / "clip_tp.json", *clip_cfg, *TP)
    return {"labels": _label_tokens(cfg, f"teacher.checkpoint={single}", *LABEL, str(root / "labels_2"))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Everything on one process and on two; returns the folder and rank 0's label-tokens summary."""
    root = tmp_path_factory.mktemp("multi")
    single, clip, one = root / "single", root / "clip", root / "1"
    _main("train", "digits_vit", *TRAIN, f"train.output_dir={single}")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "vitscale", "eval", str(single / "config.yaml"), f"checkpoint.path={single}", *VIT_EVAL, "--ema",
           "--output", str(root / "2" / "vit_ema_torchrun.json")]  # fmt: skip
    (root / "2").mkdir()
    torchrun = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # the one-process references, meanwhile
    _main("train", "digits_clip", *CLIP_TRAIN, f"train.output_dir={clip}")
    pairs = _captioned_digits(root / "captions")
    cfg = str(single / "config.yaml")
    one.mkdir()
    _eval(one / "vit.json", cfg, f"checkpoint.path={single}", *VIT_EVAL)
    _eval(one / "vit_ema.json", cfg, f"checkpoint.path={single}", *VIT_EVAL, "--ema")
    _eval(one / "probe.json", cfg, f"checkpoint.path={single}", *VIT_EVAL, *PROBE)
    _eval(one / "evals.json", cfg, f"checkpoint.path={single}", *VIT_EVAL, _evals(root))
    _eval(one / "clip.json", str(clip / "config.yaml"), f"checkpoint.path={clip}", *_clip_data(pairs))
    labels_1 = _label_tokens(cfg, f"teacher.checkpoint={single}", *LABEL, str(root / "labels_1"))
    log, _ = torchrun.communicate(timeout=300)
    assert torchrun.returncode == 0, log[-4000:]
    (r0,) = run_distributed(_two_ranks, 2, str(root))[:1]
    return root, labels_1, r0["labels"]


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def _metrics(res: dict) -> dict:
    return {k: v for k, v in res.items() if k not in ("checkpoint", "ema", "layout")}


@needs_cpu_fsdp
@pytest.mark.slow
def test_eval_on_two_ranks_gives_the_one_process_numbers(runs):
    root = runs[0]
    one, two = root / "1", root / "2"
    vit = _read(one / "vit.json")
    assert set(vit) >= {"val_top1", "val_top5", "val_loss"} and 0 < vit["val_top1"] < 100
    # FSDP deals whole batches of the one-process evaluation to the ranks: the same numbers, exactly
    fsdp = _read(two / "vit_fsdp.json")
    assert fsdp["layout"].endswith("(FSDP)") and _metrics(fsdp) == _metrics(vit)
    torchrun_ema = _read(two / "vit_ema_torchrun.json")
    assert torchrun_ema["ema"] and _metrics(torchrun_ema) == _metrics(_read(one / "vit_ema.json"))
    assert _metrics(torchrun_ema) != _metrics(vit)  # the EMA weights are other weights
    probe = _read(one / "probe.json")
    assert probe["linear_probe_train_images"] == 1497 and probe["linear_probe_val_images"] == 300
    assert _metrics(_read(two / "probe_fsdp.json")) == _metrics(probe)
    evals = _read(one / "evals.json")
    assert evals["real_images"] == 200 and evals["subset_images"] > 80 and set(evals) >= {"subset_top1", "real_top1"}
    assert _metrics(_read(two / "evals_fsdp.json")) == _metrics(evals)
    # TP splits the matmuls: the same numbers up to their float rounding (a near-tie may move an image)
    tp = _read(two / "vit_tp.json")
    assert tp["layout"].endswith("(TP+SP)")
    assert abs(tp["val_top1"] - vit["val_top1"]) <= 100 / 300 and abs(tp["val_top5"] - vit["val_top5"]) <= 100 / 300
    assert tp["val_loss"] == pytest.approx(vit["val_loss"], rel=1e-5)

    clip = _read(one / "clip.json")
    assert {"zeroshot_top1", "zeroshot_top5", "text_retrieval_recall@1", "image_retrieval_recall@10"} <= set(clip)
    assert _metrics(_read(two / "clip_fsdp.json")) == _metrics(clip)  # 51 pairs gathered in index order
    clip_tp = _metrics(_read(two / "clip_tp.json"))
    assert clip_tp.keys() == _metrics(clip).keys()
    for k, v in clip_tp.items():
        assert abs(v - clip[k]) <= 100 / 51 + 1e-9, (k, v, clip[k])  # one pair of 51, in percent


@needs_cpu_fsdp
@pytest.mark.slow
def test_label_tokens_on_two_ranks_writes_the_one_process_files(runs):
    root, one, two = runs
    assert two["layout"].endswith("(FSDP)") and two["splits"]["val"]["images"] == 300
    for k in ("images", "grid", "topk", "teacher_top1"):
        assert two["splits"]["val"][k] == one["splits"]["val"][k], k
    assert two["splits"]["val"]["teacher_token_top1"] == pytest.approx(one["splits"]["val"]["teacher_token_top1"], rel=1e-12)
    files = sorted(p.name for p in (root / "labels_1").iterdir())
    assert files == sorted(p.name for p in (root / "labels_2").iterdir()) and "val.values.f16" in files
    for name in files:
        assert (root / "labels_1" / name).read_bytes() == (root / "labels_2" / name).read_bytes(), name


@needs_cpu_fsdp
@pytest.mark.slow
def test_ema_under_fsdp_and_tp(runs):
    from vitscale.checkpoint import read_weights

    root = runs[0]
    ref, model = load_file(str(root / "single" / "model_ema.safetensors")), load_file(str(root / "single" / "model.safetensors"))
    assert max(float((ref[k] - model[k]).abs().max()) for k in ref) > 1e-3  # the EMA is not the model
    for layout in ("fsdp", "tp"):
        ema = load_file(str(root / layout / "model_ema.safetensors"))  # gathered from the ranks' shards
        assert ema.keys() == ref.keys()
        for k in ref:  # the layout-equivalence tolerance of tests/distributed/test_dist_trainer.py
            torch.testing.assert_close(ema[k], ref[k], atol=2e-4, rtol=0, msg=lambda m, k=k, lay=layout: f"{lay} {k}: {m}")
        ckpt = read_weights(root / layout, "ema")  # the newest checkpoint's EMA (step 6): the exported one
        assert all(torch.equal(ckpt[k], ema[k]) for k in ema)
    step3 = root / "fsdp" / "checkpoints" / f"step_{CKPT_AT:08d}"
    assert (step3 / "ema-rank00001.safetensors").is_file()  # each rank checkpoints its EMA shard
    resumed = load_file(str(root / "fsdp_resumed" / "model_ema.safetensors"))
    straight = load_file(str(root / "fsdp" / "model_ema.safetensors"))
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)  # resumed at step 3: bit-exact
