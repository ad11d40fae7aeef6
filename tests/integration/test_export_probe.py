"""After training, through the CLI on real files: `vitscale export` (ONNX / torch.export) of tiny digits runs
loaded back by ONNX Runtime and torch.export and compared with the eager model, the serving script run
as a process, and `vitscale eval … eval.probe=linear|fewshot` on the runs' real features."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import rel_max

from vitscale.cli import main

REPO = Path(__file__).resolve().parents[2]
SERVE = REPO / "scripts" / "serve_onnx.py"
TINY = ["train.max_steps=2", "train.epochs=0", "train.batch_size=16", "eval.every=0", "checkpoint.every=0", "log.progress=none",
        "log.report=false", "log.tensorboard=false"]  # fmt: skip
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _eager(weights: Path):
    """The trained model, built from the .safetensors header and weights (the export's reference)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    import vitscale

    with safe_open(str(weights), framework="pt") as f:
        meta = f.metadata()
    model = vitscale.create_model(meta["model"], **json.loads(meta["overrides"]))
    model.load_state_dict(load_file(str(weights)))
    return model.eval()


def _val_images(config: Path, n: int) -> torch.Tensor:
    """``n`` real validation digits through the run's own evaluation loader."""
    from vitscale.config import load_config
    from vitscale.data import build_loaders

    cfg = load_config(config)
    size = cfg.model.overrides.get("img_h") or cfg.model.overrides["vision"]["img_h"]
    loaders = build_loaders(cfg.data, img_size=(size, size), num_channels=3, seed=0, micro_batch_size=1, eval_batch_size=n)
    return next(iter(loaders.val))["image"]


def _session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _image_files(folder: Path) -> list[Path]:
    """A digit as a grayscale PNG and scikit-learn's temple photo as a JPEG."""
    from PIL import Image
    from sklearn.datasets import load_digits, load_sample_images

    digit = folder / "digit.png"
    Image.fromarray(np.rint(load_digits().images[-1] * 255 / 16).astype(np.uint8), "L").save(digit)
    photo = folder / "china.jpg"
    Image.fromarray(load_sample_images().images[0]).save(photo, quality=95)
    return [digit, photo]


def _vitscale_preprocess(path: Path, pre: dict) -> torch.Tensor:
    """vitscale's own evaluation decode of an image file (PIL path), normalised."""
    from vitscale.data import data_config
    from vitscale.data.transforms import SampleTransform

    data = data_config(mean=tuple(pre["mean"]), std=tuple(pre["std"]), interpolation=pre["interpolation"],
                      crop_pct=pre["crop_pct"], eval_crop_mode=pre["eval_crop_mode"])  # fmt: skip
    tf = SampleTransform(data, tuple(pre["image_size"]), pre["channels"], 0, train=False)
    t = tf.decode(str(path), 0, 0, fast=False).image
    mean, std = torch.tensor(pre["mean"]).view(-1, 1, 1), torch.tensor(pre["std"]).view(-1, 1, 1)
    return ((t.float() / 255 - mean) / std)[None]


def _serve(export_dir: Path, images: list[Path]) -> list[dict]:
    run = subprocess.run([sys.executable, str(SERVE), str(export_dir), *map(str, images), "--json"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    return [json.loads(line) for line in run.stdout.splitlines()]


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "vit"
    over = ["model.num_layers=1", "model.hidden_size=32", "model.ffn_hidden_size=64", "train.ema_decay=0.5",
            f"train.output_dir={out}"]  # fmt: skip
    assert main(["train", "digits_vit", *TINY, *over]) == 0
    return out


@pytest.fixture(scope="module")
def clip_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "clip"
    over = ["model.overrides.vision.num_layers=1", "model.overrides.text.num_layers=1", f"train.output_dir={out}"]
    assert main(["train", "digits_clip", *TINY, *over]) == 0
    return out


def test_vit_onnx_dynamic_batch_matches_eager_and_serves(vit_run, tmp_path, capsys):
    assert main(["export", str(vit_run), "--format", "onnx", "--batch", "dynamic"]) == 0
    printed = capsys.readouterr().out
    assert "check passed: onnxruntime" in printed
    out = vit_run / "export" / "onnx"
    info = json.loads((out / "export.json").read_text())
    graph = info["graphs"]["image"]
    assert list(info["graphs"]) == ["image"] and info["batch"] == "dynamic" and info["check"]["passed"]
    assert set(graph["check"]["max_rel_error_by_batch"]) == {"1", "5"} and graph["check"]["max_rel_error"] <= 1e-4
    assert graph["sha256"] == hashlib.sha256((out / "image.onnx").read_bytes()).hexdigest()
    assert graph["input"] == {"name": "image", "dtype": "float32", "shape": ["batch", 3, 32, 32]}
    pre = info["preprocess"]
    assert (pre["image_size"], pre["mean"], pre["std"], pre["crop_pct"], pre["interpolation"], pre["eval_crop_mode"]) == (
        [32, 32], [0.5] * 3, [0.5] * 3, 1.0, "bilinear", "center")  # digits_vit.yaml's
    assert info["labels"] == NUMBER_WORDS and info["num_classes"] == 10 and info["model"]["step"] == 2

    # the file itself, by ONNX Runtime, at batch sizes the check did not use
    model = _eager(vit_run / "model.safetensors")
    sess = _session(out / "image.onnx")
    x = _val_images(vit_run / "config.yaml", 7)
    with torch.no_grad():
        for b in (2, 7):
            assert rel_max(sess.run(None, {"image": x[:b].numpy()})[0], model(x[:b])) < 1e-4

    # the serving script, as its own process, on image files: its preprocessing is vitscale's
    files = _image_files(tmp_path)
    served = _serve(out, files)
    spec = importlib.util.spec_from_file_location("serve_onnx", SERVE)
    serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve)
    for path, res in zip(files, served):
        ours = _vitscale_preprocess(path, pre)
        theirs = torch.from_numpy(serve.preprocess(path, pre))
        assert (theirs - ours).abs().max() <= 2.5 / 255 / 0.5  # PIL vs torchvision resampling: a level or two
        with torch.no_grad():
            probs = torch.softmax(model(ours), dim=-1)[0]
        assert res["image"] == str(path) and len(res["top"]) == 5
        assert [t["label"] for t in res["top"]] == [NUMBER_WORDS[t["index"]] for t in res["top"]]
        assert all(abs(t["prob"] - float(probs[t["index"]])) < 1e-2 for t in res["top"])
        assert [t["prob"] for t in res["top"]] == sorted((t["prob"] for t in res["top"]), reverse=True)


def test_torch_export_of_the_ema_weights_matches_eager(vit_run, tmp_path):
    from vitscale.export.pt2 import load_program

    out = tmp_path / "pt2"
    assert main(["export", str(vit_run), "--ema", "--format", "torch-export", "--out", str(out)]) == 0
    info = json.loads((out / "export.json").read_text())
    assert info["batch"] == 1 and info["check"]["passed"] and info["graphs"]["image"]["file"] == "image.pt2"
    assert info["model"]["ema"] and info["model"]["weights"] == str(vit_run / "model_ema.safetensors")
    assert info["preprocess"]["from"] == str(vit_run / "config.yaml")
    program = load_program(out / "image.pt2").module()  # refuses archives with unrestricted pickles
    x = _val_images(vit_run / "config.yaml", 3)
    ema, plain = _eager(vit_run / "model_ema.safetensors"), _eager(vit_run / "model.safetensors")
    with torch.no_grad():
        assert rel_max(ema(x), plain(x)) > 1e-3  # the EMA weights are other weights
        for i in range(3):
            assert rel_max(program(x[i : i + 1]), ema(x[i : i + 1])) < 1e-4
        with pytest.raises((AssertionError, RuntimeError, ValueError)):  # a static batch of 1
            program(x[:2])


def test_linear_and_fewshot_probes_on_the_vit_features(vit_run, tmp_path):
    summary = json.loads((vit_run / "summary.json").read_text())
    res_file = tmp_path / "linear.json"
    args = ["eval", str(vit_run / "config.yaml"), f"checkpoint.path={vit_run}"]
    assert main([*args, "eval.probe=linear", "eval.probe_l2=1e-2,1e-4", "--output", str(res_file)]) == 0
    res = json.loads(res_file.read_text())
    # the linear_probe evaluator's metrics, under its name
    assert (res["linear_probe_train_images"], res["linear_probe_val_images"], res["linear_probe_feature_dim"]) == (1497, 300, 32)
    assert set(res["linear_probe_holdout_top1"]) == {"0.01", "0.0001"} and res["linear_probe_l2"] in (1e-2, 1e-4)
    # a linear classifier fitted on the frozen features of a 2-step model beats its own head by far
    assert res["linear_probe_top1"] > max(60.0, summary["val_top1"] + 20.0), (res, summary["val_top1"])
    assert res["linear_probe_top5"] >= res["linear_probe_top1"]
    # DINOv2's linear-evaluation features: the last block's class token and its mean patch token (32 + 32)
    assert main([*args, "eval.probe=linear", "eval.probe_features=class_token_patch_mean", "--output", str(res_file)]) == 0
    res = json.loads(res_file.read_text())
    assert res["linear_probe_feature_dim"] == 64 and res["linear_probe_top1"] > 60.0, res
    assert main([*args, "eval.probe=fewshot", "eval.shots=1,5", "eval.fewshot_seeds=2", "--output", str(res_file)]) == 0
    res = json.loads(res_file.read_text())
    for k in (1, 5):
        seeds = res[f"fewshot_{k}shot_top1_seeds"]
        assert len(seeds) == 2 and res[f"fewshot_{k}shot_top1"] == pytest.approx(sum(seeds) / 2)
    assert res["fewshot_5shot_top1"] > res["fewshot_1shot_top1"] > 10.0  # above chance, better with more shots


@pytest.mark.slow
def test_clip_towers_export_as_two_graphs_and_probe(clip_run, tmp_path):
    from vitscale.models.clip.tokenizer import CLIPTokenizer, create_tokenizer

    assert main(["export", str(clip_run), "--batch", "dynamic"]) == 0
    out = clip_run / "export" / "onnx"
    info = json.loads((out / "export.json").read_text())
    assert set(info["graphs"]) == {"image", "text"} and info["check"]["passed"]
    assert info["graphs"]["text"]["input"] == {"name": "tokens", "dtype": "int64", "shape": ["batch", 16]}
    tok = info["tokenizer"]
    assert (tok["context_length"], tok["vocab_size"], tok["sot_token_id"], tok["eot_token_id"]) == (16, 49408, 49406, 49407)
    assert tok["vocab_sha256"] == hashlib.sha256((out / tok["vocab_file"]).read_bytes()).hexdigest()
    assert info["zeroshot"]["class_names"] == NUMBER_WORDS and info["preprocess"]["image_size"] == [16, 16]

    model = _eager(clip_run / "model.safetensors")
    captions = ["a photo of the number seven.", "a handwritten two.", "a blurry photo of a temple at dusk."]
    tokens = CLIPTokenizer(out / tok["vocab_file"], context_length=16)(captions)  # the server's tokenizer
    assert torch.equal(tokens, create_tokenizer(context_length=16)(captions))
    x = _val_images(clip_run / "config.yaml", 4)
    with torch.no_grad():
        text = _session(out / "text.onnx").run(None, {"tokens": tokens.numpy()})[0]
        assert rel_max(text, model.encode_text(tokens, normalize=True)) < 1e-4
        image = _session(out / "image.onnx").run(None, {"image": x.numpy()})[0]
        assert rel_max(image, model.encode_image(x, normalize=True)) < 1e-4
        assert np.allclose(np.linalg.norm(image, axis=1), 1.0, atol=1e-5)
    # served as a zero-shot classifier: the image graph against the text graph's class prompts
    digit = _image_files(tmp_path)[0]
    res = _serve(out, [digit])[0]
    assert len(res["top"]) == 5 and {t["label"] for t in res["top"]} <= set(NUMBER_WORDS)

    res_file = tmp_path / "fewshot.json"
    args = ["eval", str(clip_run / "config.yaml"), f"checkpoint.path={clip_run}", "eval.probe=fewshot", "eval.shots=5",
            "eval.fewshot_seeds=1", "--output", str(res_file)]  # fmt: skip
    assert main(args) == 0
    res = json.loads(res_file.read_text())
    assert res["fewshot_feature_dim"] == 64 and res["fewshot_5shot_top1"] > 10.0  # the image embedding, above chance


@pytest.mark.slow
def test_volo_from_bare_weights_with_a_named_config(tmp_path):
    """A .safetensors file alone (its header names the model); --config gives the preprocessing."""
    import vitscale
    from vitscale.checkpoint import export_safetensors
    from vitscale.config import load_config

    over = dict(load_config("digits_volo").model.overrides)
    torch.manual_seed(0)
    model = vitscale.create_model("volo_debug", **over)
    model.init_weights()
    with torch.no_grad():  # trained-looking BatchNorm statistics, so that folding them is exercised
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    weights = tmp_path / "volo.safetensors"
    export_safetensors(model, weights, {"model": "volo_debug", "overrides": json.dumps(over)})
    assert main(["export", str(weights), "--config", "digits_volo", "--batch", "dynamic"]) == 0
    out = tmp_path / "export" / "onnx"
    info = json.loads((out / "export.json").read_text())
    assert info["check"]["passed"] and info["model"]["family"] == "volo" and info["preprocess"]["from"] == "digits_volo"
    x = _val_images(Path(vitscale.__file__).parent / "configs" / "digits_volo.yaml", 3)
    with torch.no_grad():
        assert rel_max(_session(out / "image.onnx").run(None, {"image": x.numpy()})[0], model.eval()(x)) < 1e-4


def test_export_errors_are_one_line(vit_run, tmp_path, monkeypatch, capsys):
    assert main(["export", str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err.strip() == f"vitscale export: {tmp_path / 'missing'}: no such run folder or .safetensors file"
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if `pip install onnxscript` had not been run
    assert main(["export", str(vit_run), "--out", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("vitscale export: onnxscript is not installed: pip install 'vitscale[export]'"), err
    assert len(err.splitlines()) == 1
