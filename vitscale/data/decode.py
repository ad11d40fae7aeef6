"""Image decoding: odd modes converted to RGB (or L), reduced-size JPEG decoding, resized crops.

Decodable odd modes never fail a run: CMYK, 16/32-bit integer (``I;16*``, ``I``), float (``F``),
palette (``P``, also with transparency), ``RGBA`` / ``LA`` / ``PA`` (alpha composited onto white),
grayscale ``L`` and bilevel ``1`` all become ``RGB`` (or ``L`` for 1-channel models). Files that
cannot be decoded raise :class:`BadImageError`; the dataset replaces them (see ``imagefolder``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image

RESAMPLE = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


class BadImageError(Exception):
    """The file is not a decodable image (empty, truncated, not an image, ...)."""


def open_image(path: str) -> Image.Image:
    """Open lazily (reads the header only); raises :class:`BadImageError` for non-images."""
    try:
        img = Image.open(path)
    except Exception as e:  # UnidentifiedImageError, OSError, SyntaxError, ...
        raise BadImageError(f"{type(e).__name__}: {e}") from None
    return img


def _to_8bit(img: Image.Image) -> Image.Image:
    """High bit-depth grayscale (``I;16*``, ``I``, ``F``) -> ``L`` by scaling its range to 0..255."""
    arr = np.asarray(img)
    if img.mode.startswith("I;16"):
        top = 65535.0
    elif img.mode == "F":
        top = float(max(1.0, np.nanmax(arr))) if arr.size else 1.0
    else:  # "I": 32-bit ints, in practice 16-bit PNGs; 8-bit data stays as it is
        top = 65535.0 if arr.size and arr.max() > 255 else 255.0
    arr = np.clip(arr.astype(np.float32) * (255.0 / top), 0, 255)
    return Image.fromarray(np.rint(arr).astype(np.uint8), mode="L")


def _flatten_alpha(img: Image.Image) -> Image.Image:
    """Composite an image with alpha onto white and return it as RGB."""
    rgba = img.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def convert_mode(img: Image.Image, num_channels: int = 3) -> Image.Image:
    """Convert any decodable PIL mode to ``RGB`` (``num_channels=3``) or ``L`` (``num_channels=1``)."""
    mode = img.mode
    if mode.startswith("I") or mode == "F":
        img = _to_8bit(img)
    elif mode == "P":
        img = _flatten_alpha(img) if "transparency" in img.info else img.convert("RGB")
    elif mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        img = _flatten_alpha(img)
    target = "RGB" if num_channels == 3 else "L"
    if img.mode != target:
        img = img.convert(target)
    return img


def pil_to_uint8_tensor(img: Image.Image) -> torch.Tensor:
    """PIL ``RGB``/``L`` -> uint8 tensor (C, H, W)."""
    arr = np.array(img, dtype=np.uint8, copy=True)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return torch.from_numpy(arr).permute(2, 0, 1)  # (C, H, W)


def draft_factor(box_h: float, box_w: float, out_h: int, out_w: int) -> int:
    """Largest DCT reduction (1, 2, 4, 8) that keeps the box at least ``out_h`` x ``out_w`` pixels."""
    for a in (8, 4, 2):
        if box_h / a >= out_h and box_w / a >= out_w:
            return a
    return 1


def apply_draft(img: Image.Image, factor: int) -> float:
    """Ask the JPEG decoder to decode at 1/``factor`` scale; returns the achieved scale factor."""
    if factor <= 1 or img.format != "JPEG":
        return 1.0
    w, h = img.size
    ret = img.draft(None, (max(1, w // factor), max(1, h // factor)))
    if ret is None or ret[1] is None:
        return 1.0
    box = ret[1]
    return w / box[2] if box[2] else 1.0


def load_resized_crop(
    path: str,
    box_fn,
    out_size: tuple[int, int],
    *,
    num_channels: int = 3,
    interpolation: str = "bilinear",
    fast: bool = True,
) -> tuple[Image.Image, tuple[float, float, float, float], tuple[int, int]]:
    """Decode ``path`` and return the crop ``box_fn(H, W) -> (top, left, h, w)`` resized to ``out_size``.

    The box is computed from the header's size before decoding, so with ``fast`` a JPEG is decoded
    at the smallest DCT scale that still has at least ``out_size`` pixels inside the box. Returns the
    PIL image (``out_size``), the box in original pixels and the original (H, W).
    """
    src = open_image(path)
    try:
        width, height = src.size
        if width <= 0 or height <= 0:
            raise BadImageError("empty image")
        top, left, bh, bw = box_fn(height, width)
        scale = apply_draft(src, draft_factor(bh, bw, out_size[0], out_size[1])) if fast else 1.0
        src.load()
        img = convert_mode(src, num_channels)
        crop = (left / scale, top / scale, (left + bw) / scale, (top + bh) / scale)
        out = img.resize((out_size[1], out_size[0]), RESAMPLE[interpolation], box=crop)
    except BadImageError:
        raise
    except Exception as e:  # truncated data, decoder errors, bombs, ...
        raise BadImageError(f"{type(e).__name__}: {e}") from None
    finally:
        src.close()
    return out, (top, left, bh, bw), (height, width)


def center_crop_box(height: int, width: int, out_size: tuple[int, int], crop_pct: float):
    """The eval box (top, left, h, w) in original pixels equivalent to resize + center crop.

    Square outputs resize the shorter side to ``out / crop_pct``; other sizes resize to
    ``(out_h / crop_pct, out_w / crop_pct)``; then the center ``out_size`` is cut out.
    """
    oh, ow = out_size
    if oh == ow:
        short = math.floor(oh / crop_pct)
        r = short / min(height, width)
        rh, rw = r, r
    else:
        rh, rw = math.floor(oh / crop_pct) / height, math.floor(ow / crop_pct) / width
    bh, bw = min(height, oh / rh), min(width, ow / rw)
    return (height - bh) / 2.0, (width - bw) / 2.0, bh, bw
