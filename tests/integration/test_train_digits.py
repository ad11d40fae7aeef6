"""Tiny end-to-end runs through the CLI on real shipped data (digits) and on an image folder with
bad files."""

import json
import logging

import pytest
import yaml

from vitscale.cli import main
from vitscale.config import load_config

SHORT = ["train.epochs=0", "train.max_steps=100", "train.batch_size=32", "model.num_layers=2", "model.hidden_size=64",
         "model.ffn_hidden_size=128", "schedule.warmup_steps=10", "optim.lr=3e-3", "train.log_every=25",
         "eval.every=50", "log.progress=none"]  # fmt: skip


def test_demo_command_trains_digits_and_eval_agrees(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--output-dir", str(out), *SHORT]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    # it ends with a short summary: the accuracy, then where the report is (and what to run next)
    lines = printed.splitlines()
    tail = lines[max(i for i, line in enumerate(lines) if line.startswith("vit_debug: ")) :]
    assert tail[0].startswith("vit_debug: 100 steps in ") and tail[1].startswith(f"  val_top1 {summary['val_top1']:.2f}%")
    assert f"  report       {out / 'report.html'}  (open {(out / 'report.html').resolve().as_uri()})" in tail
    assert (out / "report.html").is_file() and tail[-3:] == [
        f"  vitscale eval {out / 'config.yaml'} checkpoint.path={out}", f"  vitscale report {out}",
        f"  vitscale export {out} --format onnx"]  # fmt: skip
    assert summary["steps"] == 100 and summary["skipped_files"] == 0
    # 100 steps of a 2-block ViT: well above chance (10%; measured 32.7%), loss well below ln 10 (measured 1.87)
    assert summary["val_top1"] >= 25.0 and summary["val_loss"] < 2.0, summary
    assert summary["val_top5"] >= summary["val_top1"] and summary["img_per_s"] > 0 and summary["wall_time_s"] > 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 25, 50, 75, 100]
    assert all({"step", "loss", "lr", "img_per_s"} <= r.keys() for r in rows)
    # TFLOP/s and MFU (in percent) on CPU too: MFU against one measured matmul peak for the whole run
    assert all(r["tflops"] > 0 and 0 < r["mfu"] <= 100 for r in rows)
    assert len({round(100 * r["tflops"] / r["mfu"], 9) for r in rows}) == 1
    assert {"val_top1", "val_top5", "val_loss"} <= rows[2].keys() and {"val_top1", "val_top5", "val_loss"} <= rows[-1].keys()
    assert rows[-1]["loss"] < rows[0]["loss"]
    # the resolved config is in the run folder and reloads to the same config
    resolved = load_config(out / "config.yaml")
    assert resolved.train.max_steps == 100 and resolved.model.overrides["hidden_size"] == 64
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["output_dir"] == str(out)

    # `vitscale eval` on the checkpoint and on the exported safetensors gives the same top-1
    over = [f"model.{o}" for o in ("num_layers=2", "hidden_size=64", "ffn_hidden_size=128")]
    for path in (out, out / "model.safetensors"):
        capsys.readouterr()
        assert main(["eval", "digits_vit", f"checkpoint.path={path}", *over]) == 0
        res = json.loads(capsys.readouterr().out)
        assert res["val_top1"] == pytest.approx(summary["val_top1"])


def test_misspelt_override_is_refused_with_suggestion(capsys):
    assert main(["train", "digits_vit", "optim.lrr=1e-3"]) == 2
    assert "did you mean 'optim.lr'" in capsys.readouterr().err


def _image_folder(root, n_per_class=6):
    from PIL import Image

    for split, n in (("train", n_per_class), ("val", 2)):
        for c, color in enumerate(((250, 10, 10), (10, 250, 10), (10, 10, 250))):
            d = root / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(n):
                img = Image.new("RGB", (20 + i, 24), color)
                mode = ("RGB", "L", "RGBA", "P", "CMYK", "I;16")[i % 6]  # odd modes are converted, not skipped
                if mode == "CMYK":
                    img.convert("CMYK").save(d / f"{i}.jpg")
                else:
                    (img.convert(mode) if mode != "I;16" else img.convert("L").convert("I;16")).save(d / f"{i}.png")
    bad = root / "train" / "class0"
    (bad / "empty.png").write_bytes(b"")
    (bad / "notes.jpg").write_text("not an image")
    good = (root / "train" / "class1" / "0.png").read_bytes()
    (root / "train" / "class1" / "truncated.png").write_bytes(good[: len(good) // 2])
    (root / "val" / "class2" / "broken.png").write_bytes(good[: len(good) // 3])  # left out of the evaluation
    (root / "val" / "class0" / "empty.jpg").write_bytes(b"")
    return 5


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_image_folder_with_bad_files_trains_and_reports_skips(tmp_path, capsys):
    n_bad = _image_folder(tmp_path / "data")
    out = tmp_path / "run"
    over = ["data.format=imagefolder", f"data.train_path={tmp_path / 'data' / 'train'}",
            f"data.val_path={tmp_path / 'data' / 'val'}", "data.num_workers=0", "model.num_layers=1",
            "train.batch_size=7", "train.epochs=1", "train.max_steps=0", "log.progress=none", "log.report=false",
            f"train.output_dir={out}", "checkpoint.export_safetensors=false"]  # fmt: skip
    handler = _Collect()
    logging.getLogger("vitscale").addHandler(handler)
    try:
        assert main(["train", "digits_vit", *over]) == 0
    finally:
        logging.getLogger("vitscale").removeHandler(handler)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3  # 21 files / batch 7: the whole epoch, bad files included
    assert summary["skipped_files"] == n_bad  # training's 3 and validation's 2: what the warnings say
    warned = [m for m in handler.messages if "skipped" in m]
    assert len(warned) == n_bad and any("empty.png" in w for w in warned)
    assert sum(w.endswith("; left out") for w in warned) == 2  # validation leaves them out, never duplicates
    log = (out / "train.log").read_text().splitlines()  # the warnings are in the run's log too
    assert all(w in log for w in warned) and any(line.startswith("  skipped 5 undecodable files") for line in log)
    assert 0 <= summary["val_top1"] <= 100
    # a class folder without images would be a 4th class no image teaches: refused in one line
    (tmp_path / "data" / "train" / "class3").mkdir()
    assert main(["train", "digits_vit", *over[:-2], f"train.output_dir={tmp_path / 'empty'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "class folder 'class3' has no images" in err and len(err.splitlines()) == 1, err


def test_train_sdpa_setting_holds_during_the_steps(tmp_path, monkeypatch):
    import torch

    from vitscale.train import trainer as T

    seen = []
    step = T.Trainer.train_step

    def spy(self, batches):
        seen.append((torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
        return step(self, batches)

    monkeypatch.setattr(T.Trainer, "train_step", spy)
    tiny = ["train.max_steps=2", "train.epochs=0", "train.batch_size=16", "model.num_layers=1", "eval.every=0",
            "checkpoint.every=0", "log.progress=none", "data.num_workers=0", "log.report=false"]  # fmt: skip
    assert main(["train", "digits_vit", "train.sdpa=math", f"train.output_dir={tmp_path / 'math'}", *tiny]) == 0
    assert seen == [(False, True)] * 2  # only the math kernel allowed inside the loop
    assert torch.backends.cuda.flash_sdp_enabled()  # and restored after it
    seen.clear()
    assert main(["train", "digits_vit", f"train.output_dir={tmp_path / 'auto'}", *tiny]) == 0
    assert seen == [(True, True)] * 2  # auto: every kernel allowed (flash first, math last)
