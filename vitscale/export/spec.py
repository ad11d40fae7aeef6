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
    "take the centre box that resizing to floor(image_size / crop_pct) (the shorter side, for square "
    "image_size; each side otherwise) and centre-cropping image_size would keep; resize that box to "
    "image_size with `interpolation` (antialiased); scale to [0, 1] (/255); subtract mean, divide by std "
    "per channel; NCHW float32"
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
        "recipe": PREPROCESS_RECIPE,
        "from": source.config_from,
    }


def _data_class_names(cfg) -> list[str] | None:
    """The class names of a run's data, read without its images."""
    d = cfg.data
    if d.format == "digits":
        from vitscale.data.digits import CLASS_NAMES

        return list(CLASS_NAMES)
    if d.format == "imagefolder" and d.train_path:
        from vitscale.data.imagefolder import find_classes

        return list(find_classes(d.train_path))
    if d.format == "synthetic":
        return [str(i) for i in range(d.num_classes or 1000)]
    if d.format in ("webdataset", "csv") and d.train_path:
        from vitscale.data.captions import read_class_names

        return read_class_names(d.train_path)
    return None


def run_class_names(source) -> list[str] | None:
    """The run's readable class names (digits: 'zero' … 'nine'), or None when unknown."""
    from vitscale.eval.zeroshot import readable_class_names

    if source.config_from == "defaults":
        return None
    if source.cfg.clip.class_names:
        return list(source.cfg.clip.class_names)
    try:
        names = _data_class_names(source.cfg)
    except (FileNotFoundError, OSError):  # the training images are not on this machine
        return None
    return readable_class_names(names) if names else None


def class_names(source, count: int) -> list[str] | None:
    """:func:`run_class_names` when there are ``count`` of them."""
    names = run_class_names(source)
    return names if names and len(names) == count else None


def context_length(source) -> int:
    """Tokens per caption: ``clip.context_length`` (what training tokenized to), at most the text
    tower's ``encoder_seq_length``."""
    return min(int(source.cfg.clip.context_length), int(source.model.cfg.text.encoder_seq_length))


def tokenizer_spec(source, out_dir: Path) -> dict:
    """CLIP's tokenizer settings; its vocabulary file is copied beside the graphs."""
    import shutil

    from vitscale.models.clip import tokenizer as tok

    t = tok.create_tokenizer("clip", context_length=context_length(source))
    vocab = out_dir / tok.VOCAB_FILE.name
    shutil.copyfile(tok.VOCAB_FILE, vocab)
    return {
        "kind": "clip_bpe",
        "reference": "open_clip SimpleTokenizer with its default 'lower' cleaning (same ids)",
        "vocab_file": vocab.name,
        "vocab_sha256": sha256(vocab),
        "vocab_size": int(t.vocab_size),
        "bpe_merges": int(tok.NUM_MERGES),
        "context_length": int(t.context_length),
        "sot_token_id": int(t.sot_token_id),
        "eot_token_id": int(t.eot_token_id),
        "pad_token_id": 0,
        "truncate": "cut to context_length; the last id becomes eot_token_id",
        "lower_case": True,
        "clean": ["ftfy.fix_text", "html.unescape twice", "collapse whitespace runs to one space", "strip"],
        "pretokenize_regex": t._pattern.pattern,
    }
