#!/usr/bin/env python3
"""Serve a ``vitscale export --format onnx`` folder with ONNX Runtime: the top-5 classes of image files.

Reads everything from the folder's ``export.json`` (preprocessing constants, class names, batch size,
CLIP's tokenizer settings); a classifier needs only numpy, Pillow and onnxruntime. A CLIP export is
served as a zero-shot classifier over ``export.json``'s class names and prompt templates (its text
graph embeds the prompts once); tokenizing them uses vitscale's CLIP tokenizer with the vocabulary
file copied into the folder.

    python scripts/serve_onnx.py runs/digits_vit/export/onnx digit.png photo.jpg
    python scripts/serve_onnx.py runs/digits_vit/export/onnx digit.png --json   # one JSON line per image
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from PIL import Image

RESAMPLE = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def eval_size(height: int, width: int, size: tuple[int, int], crop_pct: float, mode: str) -> tuple[int, int]:
    """(H, W) the whole image is resized to before the centre crop (export.json's ``recipe``)."""
    oh, ow = size
    sh, sw = math.floor(oh / crop_pct), math.floor(ow / crop_pct)
    if mode == "squash":
        return sh, sw
    if mode == "center" and sh == sw:
        return (int(sh * height / width), sh) if width <= height else (sh, int(sh * width / height))
    ratio = (max if mode == "border" else min)(height / sh, width / sw)
    return round(height / ratio), round(width / ratio)


def centre_crop_or_pad(img: Image.Image, size: tuple[int, int], fill) -> Image.Image:
    """The centre ``size`` of ``img``, padded first with ``fill`` where it is smaller (export.json's ``recipe``)."""
    oh, ow = size
    if oh > img.height or ow > img.width:
        dh, dw = max(0, oh - img.height), max(0, ow - img.width)
        canvas = Image.new(img.mode, (img.width + dw, img.height + dh), fill)
        canvas.paste(img, (dw // 2, dh // 2))
        img = canvas
    top, left = int(round((img.height - oh) / 2.0)), int(round((img.width - ow) / 2.0))
    return img.crop((left, top, left + ow, top + oh))


def preprocess(path: str | Path, pre: dict) -> np.ndarray:
    """An image file -> ``(1, C, H, W)`` float32, as export.json's ``preprocess`` says."""
    img = Image.open(path)
    img.load()
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        white = Image.new("RGBA", img.size, (255, 255, 255, 255))
        img = Image.alpha_composite(white, img.convert("RGBA"))
    img = img.convert("RGB" if pre["channels"] == 3 else "L")
    oh, ow = pre["image_size"]
    mode = pre.get("eval_crop_mode", "center")
    rh, rw = eval_size(img.height, img.width, (oh, ow), pre["crop_pct"], mode)
    img = img.resize((rw, rh), RESAMPLE[pre["interpolation"]])
    mean = pre["mean"] if mode == "border" else [0.0] * pre["channels"]
    fill = tuple(round(255 * m) for m in mean) if pre["channels"] == 3 else round(255 * mean[0])
    img = centre_crop_or_pad(img, (oh, ow), fill)
    x = np.asarray(img, dtype=np.float32).reshape(oh, ow, -1) / 255.0  # (H, W, C)
    x = (x - np.asarray(pre["mean"], np.float32)) / np.asarray(pre["std"], np.float32)
    return x.transpose(2, 0, 1)[None]  # (1, C, H, W)


class Graph:
    """One ONNX graph of the export, fed in the batch size it was exported with."""

    def __init__(self, folder: Path, spec: dict, batch):
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(folder / spec["file"]), providers=["CPUExecutionProvider"])
        self.input = spec["input"]["name"]
        self.batch = batch if isinstance(batch, int) else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        step = self.batch or len(x)
        outs = []
        for i in range(0, len(x), step):
            chunk = x[i : i + step]
            n = len(chunk)
            if n < step:  # a fixed-batch graph: pad the last chunk by repeating its rows
                chunk = np.concatenate([chunk] * math.ceil(step / n))[:step]
            outs.append(self.session.run(None, {self.input: chunk})[0][:n])
        return np.concatenate(outs)


def zeroshot_weights(folder: Path, info: dict) -> np.ndarray:
    """``(num_classes, dim)``: the mean L2-normalised text embedding of each class's prompts."""
    from vitscale.models.clip.tokenizer import CLIPTokenizer

    tok = info["tokenizer"]
    tokenizer = CLIPTokenizer(folder / tok["vocab_file"], context_length=tok["context_length"])
    text = Graph(folder, info["graphs"]["text"], info["batch"])
    zs = info["zeroshot"]
    rows = []
    for name in zs["class_names"]:
        emb = text(tokenizer([t.format(name) for t in zs["templates"]]).numpy()).mean(axis=0)
        rows.append(emb / np.linalg.norm(emb))
    return np.stack(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export_dir", help="a folder written by `vitscale export --format onnx`")
    ap.add_argument("images", nargs="+", help="image files")
    ap.add_argument("--top", type=int, default=5, help="how many classes to print (default 5)")
    ap.add_argument("--json", action="store_true", help="print one JSON object per image")
    args = ap.parse_args(argv)
    folder = Path(args.export_dir)
    info = json.loads((folder / "export.json").read_text())
    if info.get("format") != "onnx":
        print(f"{folder}: not an ONNX export (format {info.get('format')!r})", file=sys.stderr)
        return 2
    x = np.concatenate([preprocess(p, info["preprocess"]) for p in args.images])
    out = Graph(folder, info["graphs"]["image"], info["batch"])(x)
    if "text" in info["graphs"]:  # CLIP: zero-shot logits against the class prompts
        out = info["logit_scale"] * out @ zeroshot_weights(folder, info).T
        labels = info["zeroshot"]["class_names"]
    else:
        labels = info.get("labels") or [str(i) for i in range(out.shape[-1])]
    probs = np.exp(out - out.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    for path, p in zip(args.images, probs):
        top = np.argsort(-p, kind="stable")[: args.top]
        if args.json:
            print(json.dumps({"image": str(path), "top": [{"label": labels[i], "index": int(i), "prob": float(p[i])} for i in top]}))
        else:
            print(f"{path}: " + ", ".join(f"{labels[i]} {p[i]:.3f}" for i in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
