"""What a server needs beside the graphs: preprocessing constants, tokenizer settings, class names.

Written into the export's ``export.json``. The preprocessing is vitscale's evaluation transform
(``vitscale.data.transforms.SampleTransform`` with ``train=False``, then the loader's normalisation);
``scripts/serve_onnx.py`` implements it from these fields alone.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PREPROCESS_RECIPE = (
    "decode; convert to RGB (channels=3) or L (channels=1), alpha composited onto white; "
    "resize the whole image with `interpolation` (antialiased) as `eval_crop_mode` says, with scale "
    "size floor(image_size / crop_pct) per side: center = the shorter side to it, the longer "
    "int(scale x long / short) (non-square image_size: round(side / min ratio)), squash = exactly it, "
    "border = round(side / max ratio); cut the centre image_size out (top round((H - h) / 2)), padding "
    "first where the image is smaller (half before, the rest after) with 0, or for border "
    "round(255 x mean); scale to [0, 1] (/255); subtract mean, divide by std per channel; NCHW float32"
)


def sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def channel_stats(mean, std, channels: int) -> tuple[list[float], list[float]]:
    """Per-channel mean / std as the loader applies them (``vitscale.data.loader.ResumableLoader``:
    a 1-channel model given RGB statistics uses their average)."""
    mean, std = [float(m) for m in mean], [float(s) for s in std]
    if len(mean) == 3 and channels == 1:
        mean, std = [sum(mean) / 3], [sum(std) / 3]
    if len(mean) != channels or len(std) != channels:
        raise ValueError(f"data.mean / data.std need {channels} values, got {mean} / {std}")
    return mean, std


def preprocess_spec(source) -> dict:
    """The evaluation preprocessing of ``source`` (a :class:`vitscale.export.source.Source`)."""
    mc, data = source.model.cfg, source.cfg.data
    mean, std = channel_stats(data.mean, data.std, mc.num_channels)
    return {
        "image_size": [int(mc.img_h), int(mc.img_w)],
        "channels": int(mc.num_channels),
        "mean": mean,
        "std": std,
        "interpolation": data.interpolation,
        "crop_pct": float(data.crop_pct),
        "eval_crop_mode": data.eval_crop_mode,
        "recipe": PREPROCESS_RECIPE,
        "from": source.config_from,
    }


def _data_class_names(cfg) -> list[str] | None:
    """The class names of a run's data, read without its images (the data format's ``class_names``)."""
    from vitscale.data.formats import get_format

    fmt = get_format(cfg.data.format)
    return fmt.class_names(cfg.data) if fmt.class_names is not None else None


def run_class_names(source) -> list[str] | None:
    """The run's readable class names (digits: 'zero' … 'nine'): ``clip.class_names``, else its folder's
    ``classnames.txt`` (the classes training mapped the labels to), else the config's dataset's; None
    when unknown."""
    from vitscale.data.classes import run_class_names as saved
    from vitscale.eval.zeroshot import readable_class_names

    if source.config_from == "defaults":
        return None
    clip = getattr(source.cfg, "clip", None)  # the contrastive task's group
    if clip is not None and clip.class_names:
        return list(clip.class_names)
    names = saved(source.weights)
    if names:
        return readable_class_names(names)
    try:
        names = _data_class_names(source.cfg)
    except (FileNotFoundError, OSError):  # the training images are not on this machine
        return None
    return readable_class_names(names) if names else None


def class_names(source, count: int) -> list[str] | None:
    """:func:`run_class_names` when there are ``count`` of them."""
    names = run_class_names(source)
    return names if names and len(names) == count else None


def context_length(source, text_length: int) -> int:
    """Tokens per caption: ``clip.context_length`` (what training tokenized to), at most the
    ``text_length`` the text graph takes (``Serving.text_length``)."""
    return min(int(source.cfg.clip.context_length), int(text_length))


def tokenizer_spec(tokenizer, out_dir: Path) -> dict:
    """The model family's tokenizer settings (its ``describe()``); each file it names (``files()``,
    e.g. ``vocab_file``) is copied beside the graphs and recorded by name with its SHA-256
    (``vocab_sha256``)."""
    import shutil

    files = {}
    for key, path in tokenizer.files().items():
        copy = out_dir / Path(path).name
        shutil.copyfile(path, copy)
        files[key] = copy.name
        files[key.removesuffix("_file") + "_sha256"] = sha256(copy)
    return {**files, **tokenizer.describe()}
