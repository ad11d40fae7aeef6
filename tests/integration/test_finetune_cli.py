"""Fine-tuning and distillation through the real command line, on real files: a timm ViT saved by timm
itself into a Hugging Face cache built here (``HF_HUB_CACHE``, ``HF_HUB_OFFLINE=1``) and read as
``hf-hub:org/name``, and the same model as a plain ``.safetensors`` fine-tuned with no format flag; a
ViT distilled from it with DeiT's token; a CLIP fine-tuned from an open_clip
file with its image tower locked and distilled from an open_clip Hub folder; every bad input of
issue 22 a one-line error before training starts; the ``vitscale.load_run`` example of
docs/using.md run as written."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import hub_cache
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FAST = ["train.max_steps=2", "train.epochs=0", "train.batch_size=16", "train.log_every=1", "log.progress=plain",
        "log.report=false", "log.tensorboard=false", "checkpoint.every=0", "eval.every=0"]  # fmt: skip
# digits_vit's architecture as timm builds it (patch 4, width 96, 4 heads, 4 blocks, MLP 192, mean pooling, 32 px)
DIGITS_TIMM = dict(img_size=32, patch_size=4, embed_dim=96, depth=4, num_heads=4, mlp_ratio=2.0, num_classes=10, global_pool="avg")
DIGITS_VIT = {"patch_dim": 4, "hidden_size": 96, "ffn_hidden_size": 192, "num_attention_heads": 4, "num_layers": 4,
              "pool": "avg", "img_h": 32, "img_w": 32}  # fmt: skip
# digits_clip's architecture as open_clip builds it
DIGITS_OC = dict(embed_dim=64, vision_cfg=dict(image_size=16, layers=4, width=96, patch_size=4, head_width=24, mlp_ratio=2.0),
                 text_cfg=dict(context_length=16, vocab_size=49408, width=64, heads=4, layers=2))  # fmt: skip


def vitscale(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vitscale", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})}, cwd=cwd)  # fmt: skip


@pytest.fixture(scope="module")
def timm_digits(tmp_path_factory):
    """A random timm ViT of digits_vit's architecture, saved by timm's ``save_for_hf`` into a cache."""
    timm = pytest.importorskip("timm")
    pytest.importorskip("huggingface_hub")
    torch.manual_seed(0)
    tm = timm.create_model("vit_tiny_patch16_224", pretrained=False, **DIGITS_TIMM).eval()
    root = tmp_path_factory.mktemp("timm_digits")
    timm.models.save_for_hf(tm, str(root / "saved"), safe_serialization="both")
    return tm, root / "saved", hub_cache(root / "hub", "acme/digits-vit", root / "saved")


def test_hf_hub_from_the_local_cache_only(timm_digits, tmp_path):
    tm, _, cache = timm_digits
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "run"
    res = vitscale("train", "digits_vit", *FAST, "train.max_steps=1", "optim.lr=0", f"train.output_dir={out}",
                   "checkpoint.init_from=hf-hub:acme/digits-vit", env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr
    log = (out / "train.log").read_text()
    assert re.search(r"checkpoint.init_from: 56 tensors from .*/snapshots/\w+/model.safetensors \(timm: a timm Hub snapshot", log)
    # lr 0: the run's weights are timm's, converted (the QKV rows per head)
    from vitscale.interop import from_timm

    want = from_timm(tm).state_dict()
    got = load_file(out / "model.safetensors")
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    res = vitscale("train", "digits_vit", *FAST, f"train.output_dir={tmp_path / 'miss'}",
                   "checkpoint.init_from=hf-hub:acme/missing", env=env)  # fmt: skip
    assert res.returncode == 1 and res.stderr.count("\n") == 1
    assert "no snapshot of acme/missing in the local Hugging Face cache" in res.stderr and "`hf download acme/missing`" in res.stderr


def test_a_plain_timm_safetensors_fine_tunes_with_no_format_flag(timm_digits, tmp_path):
    """What ``save_file(timm_model.state_dict())`` writes, the commonest file there is: no metadata, no
    config beside it, told to be timm's by its names alone (``attn.qkv``; vitscale's is ``attn.qkv_per_head``)."""
    from safetensors.torch import save_file

    from vitscale import load_run
    from vitscale.interop import from_timm

    tm, _, _ = timm_digits
    plain = tmp_path / "vit.safetensors"
    save_file(tm.state_dict(), str(plain))
    out = tmp_path / "run"
    res = vitscale("train", "digits_vit", *FAST, "optim.lr=0", f"train.output_dir={out}", f"checkpoint.init_from={plain}")
    assert res.returncode == 0, res.stderr
    assert f"checkpoint.init_from: 56 tensors from {plain} (timm: timm's naming)" in (out / "train.log").read_text()
    assert len([line for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]) == 2
    # lr 0: the run's weights are timm's through the adapter, number for number, and so are its logits
    want, got = from_timm(tm).state_dict(), load_file(out / "model.safetensors")
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(load_run(out).model(x), tm(x), rtol=0, atol=1e-5)


def _code_pickle(path: Path, marker: Path) -> None:
    class Payload:
        def __reduce__(self):
            return (os.makedirs, (str(marker),))

    torch.save({"patch_embed.proj.weight": torch.zeros(1), "x": Payload()}, path)


def test_bad_inputs_are_one_line_before_training(timm_digits, tmp_path, capsys):
    tm, saved, _ = timm_digits
    from vitscale import create_model
    from vitscale.checkpoint import export_safetensors

    cut = tmp_path / "cut.safetensors"
    data = (saved / "model.safetensors").read_bytes()
    cut.write_bytes(data[: len(data) - 1000])
    _code_pickle(tmp_path / "code.pth", tmp_path / "ran")
    teacher7 = tmp_path / "teacher7.safetensors"
    export_safetensors(create_model("vit_debug", **DIGITS_VIT, num_classes=7), teacher7,
                       {"model": "vit_debug", "overrides": json.dumps({**DIGITS_VIT, "num_classes": 7})})  # fmt: skip
    cases = {
        "another architecture": ([f"checkpoint.init_from={saved}", "model.hidden_size=64"],
                                 "holds a vit with hidden_size=96; the model (model.name with model.overrides) has hidden_size=64"),
        "a truncated file": ([f"checkpoint.init_from={cut}"], "truncated"),
        "a pickle holding code": ([f"checkpoint.init_from={tmp_path / 'code.pth'}"],
                                  "refused by torch.load(weights_only=True): the pickle holds more than tensors"),
        "a teacher of other classes": ([f"distill.teacher={teacher7}"], "predicts 7 classes, the data has 10"),
        "a freeze pattern matching nothing": (["model.freeze=blocks.7.*"], "model.freeze: 'blocks.7.*' matches no parameter"),
    }  # fmt: skip
    from vitscale.cli import main

    # the command line's own entry point, in this process (each case fails before a step: no process start each)
    for i, (what, (args, message)) in enumerate(cases.items()):
        out = tmp_path / f"run{i}"
        capsys.readouterr()
        rc = main(["train", "digits_vit", *FAST, f"train.output_dir={out}", *args])
        err = capsys.readouterr().err
        assert rc in (1, 2) and message in err, (what, err)
        assert err.startswith("vitscale train: ") and err.count("\n") == 1, (what, err)
        assert not (out / "metrics.jsonl").exists() and not (out / "run.lock").exists(), what  # no step was taken
    assert not (tmp_path / "ran").exists()  # the pickle's code never ran


def test_deit_distillation_from_a_timm_teacher_and_load_run(timm_digits, tmp_path):
    _, saved, _ = timm_digits
    out = tmp_path / "student"
    res = vitscale("train", "digits_vit", *FAST, "train.max_steps=3", f"train.output_dir={out}", "model.distill_token=true",
                   f"distill.teacher={saved}", "distill.teacher_model=vit_debug",
                   f"distill.teacher_overrides={json.dumps(DIGITS_VIT)}", "distill.teacher_img_size=48",
                   "distill.kind=soft", "distill.tau=2.0")  # fmt: skip
    assert res.returncode == 0, res.stderr
    log = (out / "train.log").read_text()
    assert "distill: teacher vit_debug (0.32M params, replicated) at 48x48, mean [0.5, 0.5, 0.5] std [0.5, 0.5, 0.5] (from the teacher's source)" in log
    assert "distill.teacher: pos_embed resampled from 1x65x96 to 1x145x96" in log
    assert "TFLOP/s and MFU count the student's FLOPs only" in log and "(teacher " in log
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "loss" in r]
    assert len(train) == 3 and all(0 < r["teacher_time_pct"] < 100 and r["train_distill_loss"] > 0 for r in train)
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["val_top1"] <= 100  # evaluated on the mean of the class and distillation heads
    # docs/using.md's example, as written there, on this run
    text = (ROOT / "docs" / "using.md").read_text()
    code = re.search(r"## In Python\n.*?```python\n(.*?)```", text, re.S).group(1)
    from PIL import Image
    from sklearn.datasets import load_digits

    Image.fromarray((load_digits().images[3] * 255 / 16).astype("uint8")).resize((64, 64)).save(tmp_path / "digit.png")
    res = subprocess.run([sys.executable, "-c", code.replace("runs/digits_vit", str(out))], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    top = res.stdout.split()
    assert top[0] in names and 0 <= float(top[1]) <= 1, res.stdout


@pytest.fixture(scope="module")
def open_clip_digits(tmp_path_factory):
    """A random open_clip CLIP of digits_clip's architecture, saved by open_clip's ``save_for_hf``."""
    pytest.importorskip("open_clip")
    from open_clip.model import CLIP

    save_for_hf = importlib.import_module("open_clip.push_to_hf_hub").save_for_hf
    torch.manual_seed(0)
    oc = CLIP(**DIGITS_OC).eval()
    oc.visual.image_mean, oc.visual.image_std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)

    class NoTokenizerFiles:
        def save_pretrained(self, folder):
            pass

    folder = tmp_path_factory.mktemp("open_clip_digits") / "hub"
    save_for_hf(oc, NoTokenizerFiles(), DIGITS_OC, str(folder), safe_serialization="both")
    return oc, folder


def test_clip_locked_image_tower_from_open_clip_and_distilled(open_clip_digits, tmp_path):
    oc, folder = open_clip_digits
    out = tmp_path / "clip"
    teacher = {"output_dim": 64, "vision": {"img_h": 16, "img_w": 16, "patch_dim": 4, "hidden_size": 96, "ffn_hidden_size": 192,
                                            "num_attention_heads": 4, "num_layers": 4}, "text": {"encoder_seq_length": 16}}  # fmt: skip
    res = vitscale("train", "digits_clip", *FAST, f"train.output_dir={out}", "train.batch_size=32",
                   f"checkpoint.init_from={folder / 'open_clip_model.safetensors'}", "clip.lock_image=true",
                   f"distill.teacher={folder}", "distill.teacher_model=clip_debug",
                   f"distill.teacher_overrides={json.dumps(teacher)}", "clip.zeroshot=false", "clip.retrieval=false")  # fmt: skip
    assert res.returncode == 0, res.stderr
    log = (out / "train.log").read_text()
    assert "clip.lock_image: " in log and "checkpoint.init_from: " in log and "(open_clip: open_clip's naming)" in log
    assert "distill: teacher clip_debug" in log and "from the teacher's source" in log
    from vitscale.interop import from_open_clip

    start = from_open_clip(oc).state_dict()
    end = load_file(out / "model.safetensors")
    image = [k for k in start if k.startswith(("visual.", "image_proj."))]
    assert image and all(torch.equal(end[k], start[k]) for k in image)  # locked: not moved
    assert not torch.equal(end["text_proj.weight"], start["text_proj.weight"])  # the text tower trained
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert rows and all(r["train_distill_loss"] > 0 and "teacher_time_pct" in r for r in rows)
