"""Image decoding: odd modes converted to RGB (or L), reduced-size JPEG decoding, resized crops.

An image larger than ``max_pixels`` (width x height from its header, ``data.max_image_pixels``) is
never decoded: it raises :class:`BadImageError` like an undecodable file and is skipped and counted.

Decodable odd modes never fail a run: CMYK, 16/32-bit integer (``I;16*``, ``I``), float (``F``),
palette (``P``, also with transparency), ``RGBA`` / ``LA`` / ``PA`` (alpha composited onto white),
grayscale ``L`` and bilevel ``1`` all become ``RGB`` (or ``L`` for 1-channel models). Files that
cannot be decoded raise :class:`BadImageError`; the dataset replaces them (see ``imagefolder``).
"""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
import torch
from PIL import Image

from .files import read_regular


class BadImageError(Exception):
    """The file is not a decodable image (empty, truncated, not an image, ...)."""


def open_image(path) -> Image.Image:
    """Open lazily (reads the header only); raises :class:`BadImageError` for non-images."""
    try:
        with warnings.catch_warnings():  # the size limit is data.max_image_pixels (check_pixels), not PIL's warning
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
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
    """PIL ``RGB``/``L`` -> uint8 tensor (C, H, W) (a channels-last view of the pixel array)."""
    arr = np.array(img, dtype=np.uint8, copy=True)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return torch.from_numpy(arr).permute(2, 0, 1)  # (C, H, W), channels-last strides


def draft_factor(box_h: float, box_w: float, out_h: int, out_w: int) -> int:
    """Largest DCT reduction (1, 2, 4, 8) that keeps the box at least ``out_h`` x ``out_w`` pixels."""
    for a in (8, 4, 2):
        if box_h / a >= out_h and box_w / a >= out_w:
            return a
    return 1


def apply_draft(img: Image.Image, factor: int) -> float:
    """Ask PIL's JPEG decoder to decode at 1/``factor`` scale; returns the achieved scale factor."""
    if factor <= 1 or img.format != "JPEG":
        return 1.0
    w, h = img.size
    ret = img.draft(None, (max(1, w // factor), max(1, h // factor)))
    if ret is None or ret[1] is None:
        return 1.0
    box = ret[1]
    return w / box[2] if box[2] else 1.0


def _simplejpeg():
    if not USE_SIMPLEJPEG:
        return None
    try:
        import simplejpeg
    except ImportError:  # optional: the PIL draft path is the fallback
        return None
    return simplejpeg


# The fast path decodes baseline JPEGs with libjpeg-turbo through simplejpeg when it is installed
# (no PIL object, no extra copy); set False to use PIL's draft mode only (benchmarks compare both).
USE_SIMPLEJPEG = True


def check_pixels(height: int, width: int, max_pixels: int) -> None:
    """:class:`BadImageError` for an image of more than ``max_pixels`` pixels (0 = no limit)."""
    if max_pixels and height * width > max_pixels:
        raise BadImageError(
            f"{width}x{height} = {height * width / 1e6:.1f}M pixels, more than data.max_image_pixels={max_pixels}: not decoded"
        )


def _decode_simplejpeg(data: bytes, factor_fn, num_channels: int, max_pixels: int = 0):
    """-> (uint8 (H', W', C) array, (H, W), scale) or None when simplejpeg can't do this file, or
    ``("fallback", factor)`` when it is corrupt (PIL then reports it)."""
    sj = _simplejpeg()
    if sj is None or data[:2] != b"\xff\xd8":
        return None
    try:
        height, width, colorspace, _ = sj.decode_jpeg_header(data)
    except Exception:
        return None
    if colorspace not in ("Gray", "YCbCr", "RGB", "GRAY") or height <= 0 or width <= 0:
        return None  # CMYK / YCCK / unknown: PIL converts those
    check_pixels(height, width, max_pixels)
    a = factor_fn(height, width)
    try:
        arr = sj.decode_jpeg(
            data, colorspace="RGB" if num_channels == 3 else "GRAY",
            min_height=-(-height // a), min_width=-(-width // a), min_factor=a, strict=True,
            fastdct=True, fastupsample=True,  # ~10% faster; ~40 dB PSNR against the accurate IDCT
        )
    except Exception:
        return "fallback", a  # corrupt / truncated: let PIL decide (it raises BadImageError)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return arr, (height, width), width / arr.shape[1]


def decode_reduced(path, factor_fn, *, num_channels: int = 3, fast: bool = True,
                   max_pixels: int = 0) -> tuple[torch.Tensor, float, tuple[int, int]]:  # fmt: skip
    """Decode ``path`` (a file, or the encoded bytes) at the DCT reduction ``factor_fn(H, W)`` asks
    for (1, 2, 4 or 8: :func:`draft_factor`), called exactly once with the header's size before
    anything is decoded (so the caller draws its boxes from it). With ``fast`` a JPEG is decoded at
    that scale by libjpeg-turbo through ``simplejpeg`` when installed (fast integer IDCT and plain
    chroma upsampling), else PIL ``Image.draft``; other files, and every file without ``fast``, at
    full size. Returns the uint8 tensor (C, h, w), the achieved scale (original pixels per decoded
    pixel) and the original (H, W). An image of more than ``max_pixels`` pixels (read from the
    header; 0 = no limit) raises :class:`BadImageError` before anything is decoded."""
    try:
        if isinstance(path, (bytes, bytearray)):  # already-read bytes (e.g. a tar member)
            data = bytes(path)
        else:
            data = read_regular(path)  # a FIFO or device: skipped like an undecodable file, never blocks
    except OSError as e:
        raise BadImageError(f"{type(e).__name__}: {e}") from None
    if not data:
        raise BadImageError("empty file")
    factor = None
    if fast:
        got = _decode_simplejpeg(data, factor_fn, num_channels, max_pixels)
        if got is not None and isinstance(got[0], str):  # corrupt: PIL reports it
            factor = got[1]
        elif got is not None:
            arr, (h0, w0), scale = got
            return torch.from_numpy(arr).permute(2, 0, 1), scale, (h0, w0)
    src = open_image(io.BytesIO(data))
    try:
        w0, h0 = src.size
        if w0 <= 0 or h0 <= 0:
            raise BadImageError("empty image")
        check_pixels(h0, w0, max_pixels)
        if factor is None:
            factor = factor_fn(h0, w0)
        scale = apply_draft(src, factor) if fast else 1.0
        src.load()
        img = convert_mode(src, num_channels)
        t = pil_to_uint8_tensor(img)
    except BadImageError:
        raise
    except Exception as e:  # truncated data, decoder errors, bombs, ...
        raise BadImageError(f"{type(e).__name__}: {e}") from None
    finally:
        src.close()
    return t, scale, (h0, w0)


def decode_resized_crop(
    path: str,
    box_fn,
    out_size,
    *,
    num_channels: int = 3,
    interpolation: str = "bilinear",
    fast: bool = True,
    max_pixels: int = 0,
) -> tuple[torch.Tensor, tuple[float, float, float, float], tuple[int, int]]:
    """Decode ``path`` and return the crop ``box_fn(H, W) -> (top, left, h, w)`` resized to ``out_size``
    (an ``(H, W)``, or a callable ``(h, w) -> (H, W)`` of the box's size).

    The box is drawn from the header's size BEFORE decoding (``box_fn`` is called exactly once), so
    with ``fast`` a JPEG is decoded at the smallest DCT scale (1/2, 1/4, 1/8) that still has at
    least ``out_size`` pixels inside the box (:func:`decode_reduced`). The crop is resized as a uint8
    tensor (antialiased). Returns the uint8 tensor (C, out_h, out_w), the box in original pixels and
    the original (H, W).
    """
    drawn = {}

    def factor(h: int, w: int) -> int:
        box = drawn["box"] = box_fn(h, w)
        size = drawn["size"] = _out_size(out_size, box)
        return draft_factor(box[2], box[3], size[0], size[1])

    t, scale, hw = decode_reduced(path, factor, num_channels=num_channels, fast=fast, max_pixels=max_pixels)
    return _crop_resize(t, drawn["box"], scale, drawn["size"], interpolation), drawn["box"], hw


def _out_size(out_size, box) -> tuple[int, int]:
    """``out_size``, or a callable ``(h, w) -> (H, W)`` of the box's size (NaFlex: a grid fitted to the crop)."""
    return out_size(box[2], box[3]) if callable(out_size) else out_size


def _crop_resize(t: torch.Tensor, box, scale: float, out_size, interpolation: str) -> torch.Tensor:
    """Cut ``box`` (original pixels) out of ``t`` decoded at 1/``scale`` and resize it to ``out_size``."""
    _, h, w = t.shape
    top, left = int(round(box[0] / scale)), int(round(box[1] / scale))
    bottom = min(h, max(top + 1, int(round((box[0] + box[2]) / scale))))
    right = min(w, max(left + 1, int(round((box[1] + box[3]) / scale))))
    crop = t[:, top:bottom, left:right]  # (C, h', w') view
    return resize(crop, out_size, interpolation)


INTERPOLATIONS = ("bilinear", "bicubic")


def resize(image: torch.Tensor, size, interpolation: str = "bilinear") -> torch.Tensor:
    """``image`` (``(..., C, H, W)``) resized to ``size`` (H, W) with antialiasing
    (``torch.nn.functional.interpolate(..., antialias=True, align_corners=False)``); the same tensor
    when it already has that size. Values as torchvision's ``transforms.v2.functional.resize`` of a
    tensor gives them on an AVX2 / AVX-512 or ARM CPU (``tests/unit/test_resize.py`` compares the two):
    ``uint8`` is resampled as ``uint8`` on the CPU (PyTorch's own uint8 kernels); on another device,
    or for another integer type, through float32, clamped to [0, 255] for uint8 bicubic (its overshoot),
    then rounded. torchvision is not imported for it: its package imports ``torch._dynamo`` (about a
    second of start-up for every process that reads images)."""
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}")
    h, w = (int(s) for s in size)
    *lead, c, h0, w0 = image.shape
    if (h, w) == (h0, w0) or image.numel() == 0:
        return image if (h, w) == (h0, w0) else image.new_empty((*lead, c, h, w))
    x = image.reshape(-1, c, h0, w0)
    native = image.is_floating_point() and image.dtype in (torch.float32, torch.float64)
    native = native or (image.dtype == torch.uint8 and image.device.type == "cpu")
    y = torch.nn.functional.interpolate(x if native else x.float(), size=(h, w), mode=interpolation,
                                        align_corners=False, antialias=True)  # fmt: skip
    if not native:
        if image.dtype == torch.uint8 and interpolation == "bicubic":
            y = y.clamp_(0, 255)
        y = (y.round_() if not image.is_floating_point() else y).to(image.dtype)
    return y.reshape(*lead, c, h, w)


def resized_crop(image: torch.Tensor, top: int, left: int, height: int, width: int, size,
                 interpolation: str = "bilinear") -> torch.Tensor:  # fmt: skip
    """The box (top, left, height, width) of ``image`` (inside it) resized to ``size``: :func:`resize`."""
    return resize(image[..., top : top + height, left : left + width], size, interpolation)


def pad(image: torch.Tensor, left: int, top: int, right: int, bottom: int, fill: list[int] | int = 0) -> torch.Tensor:
    """``image`` (``(..., C, H, W)``) with ``fill`` around it: a value, or one per channel."""
    *lead, c, h, w = image.shape
    value = torch.as_tensor(fill, device=image.device).to(image.dtype).reshape(-1, 1, 1)
    out = value.expand(c, h + top + bottom, w + left + right).expand(*lead, -1, -1, -1).clone()
    out[..., top : top + h, left : left + w] = image
    return out


def eval_resize_size(height: int, width: int, out_size: tuple[int, int], crop_pct: float, mode: str = "center") -> tuple[int, int]:
    """The (H, W) an ``height x width`` image is resized to before the evaluation's centre crop or pad
    to ``out_size``, as timm's ``transforms_imagenet_eval`` (``timm/data/transforms_factory.py``) with
    scale size ``floor(out / crop_pct)`` per side:

    - ``center``: the shorter side to the scale size, the longer in proportion (torchvision's
      ``Resize(int)``: ``int(scale * long / short)``); for a non-square output the image's smaller
      ratio to the scale size decides (timm's ``ResizeKeepRatio``, ``round`` per side);
    - ``squash``: exactly the scale size (the aspect ratio is not kept; ``vit_jax``'s whole-image resize);
    - ``border``: the larger ratio decides, so the whole image fits (``ResizeKeepRatio(longest=1)``).
    """
    oh, ow = out_size
    sh, sw = math.floor(oh / crop_pct), math.floor(ow / crop_pct)
    if mode == "squash":
        return sh, sw
    if mode == "center" and sh == sw:
        if width <= height:
            return int(sh * height / width), sh
        return sh, int(sh * width / height)
    rh, rw = height / sh, width / sw
    ratio = max(rh, rw) if mode == "border" else min(rh, rw)
    return round(height / ratio), round(width / ratio)


def crop_or_pad(image: torch.Tensor, out_size: tuple[int, int], fill: list[int] | int = 0):
    """The centre ``out_size`` of ``image`` (C, H, W), padded first with ``fill`` on the sides where it
    is smaller (torchvision's ``CenterCrop`` pads with 0, timm's ``CenterCropOrPad`` with ``fill``: half
    the missing pixels before, the rest after, then a crop at ``round((size - out) / 2)``). Returns
    the image and its window on ``image`` as (top, left, h, w) in ``image``'s pixels: ``out_size``
    at its place, starting before 0 or ending past the edge where it was padded."""
    oh, ow = out_size
    _, h, w = image.shape
    dh, dw = max(0, oh - h), max(0, ow - w)
    if dh or dw:
        image = pad(image, dw // 2, dh // 2, (dw + 1) // 2, (dh + 1) // 2, fill)
    top, left = int(round((image.shape[-2] - oh) / 2.0)), int(round((image.shape[-1] - ow) / 2.0))
    return image[:, top : top + oh, left : left + ow], (top - dh // 2, left - dw // 2, oh, ow)
