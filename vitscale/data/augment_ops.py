"""The image operations of AutoAugment-style policies and colour jitter, on PIL images.

Each operation takes the image, its argument (degrees, a shear factor, pixels, a blend factor, a
threshold, bits, a radius) and the :class:`Geometry` of the policy (resampling filter and fill
colour for geometric ops); none draws random numbers: the policies (:mod:`vitscale.data.auto_augment`)
draw the arguments from the sample's keyed generator and call these.

The operations are Pillow's own where Pillow has one (``ImageOps``, ``ImageEnhance``, affine
``Image.transform``), as the reference implementations use them: timm's
``timm/data/auto_augment.py``, torchvision's ``transforms/autoaugment.py`` (TrivialAugmentWide) and
``transforms/_functional_pil.py`` (ColorJitter), so the pixels agree with theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter, ImageOps

RESAMPLE = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC, "nearest": Image.Resampling.NEAREST}


@dataclass(frozen=True)
class Geometry:
    """How geometric ops sample and what they fill the uncovered area with."""

    resample: int | tuple[int, ...] = Image.Resampling.BILINEAR  # a tuple: the policy draws one per op
    fill: tuple[int, ...] | None = None  # per channel; None = black (Pillow's default)

    def fill_for(self, img: Image.Image):
        if self.fill is None:
            return None
        return self.fill[0] if img.mode == "L" else tuple(self.fill)


def _affine(img: Image.Image, coeffs, geo: Geometry) -> Image.Image:
    """``coeffs`` (a, b, c, d, e, f) maps each output pixel (x, y) to the input (ax+by+c, dx+ey+f)."""
    return img.transform(img.size, Image.Transform.AFFINE, tuple(coeffs), resample=geo.resample, fillcolor=geo.fill_for(img))


def shear_x(img, factor: float, geo: Geometry):
    return _affine(img, (1, factor, 0, 0, 1, 0), geo)


def shear_y(img, factor: float, geo: Geometry):
    return _affine(img, (1, 0, 0, factor, 1, 0), geo)


def translate_x(img, pixels: float, geo: Geometry):
    """Content moves ``pixels`` to the left (the output samples the input ``pixels`` further right)."""
    return _affine(img, (1, 0, pixels, 0, 1, 0), geo)


def translate_y(img, pixels: float, geo: Geometry):
    return _affine(img, (1, 0, 0, 0, 1, pixels), geo)


def rotate(img, degrees: float, geo: Geometry):
    """Counter-clockwise about the centre, the size kept."""
    return img.rotate(degrees, resample=geo.resample, fillcolor=geo.fill_for(img))


def identity(img, *_):
    return img


def auto_contrast(img, *_):
    return ImageOps.autocontrast(img)


def equalize(img, *_):
    return ImageOps.equalize(img)


def invert(img, *_):
    return ImageOps.invert(img)


def solarize(img, threshold: float, *_):
    """Values at or above ``threshold`` are inverted."""
    return ImageOps.solarize(img, threshold)


def solarize_add(img, add: int, *_, threshold: int = 128):
    """``add`` is added (saturating at 255) to the values below ``threshold``."""
    v = np.arange(256)
    lut = np.where(v < threshold, np.minimum(v + int(add), 255), v).tolist()
    return img.point(lut * len(img.getbands()))


def posterize(img, bits: int, *_):
    """Keep the ``bits`` most significant bits of each value: 8 or more unchanged, 0 black (timm's
    increasing posterize reaches 0 bits at magnitude 10; Pillow's ``ImageOps.posterize`` takes 1..8)."""
    bits = int(bits)
    if bits >= 8:
        return img
    mask = (0xFF << (8 - max(0, bits))) & 0xFF
    return img.point([v & mask for v in range(256)] * len(img.getbands()))


def brightness(img, factor: float, *_):
    return ImageEnhance.Brightness(img).enhance(factor)


def contrast(img, factor: float, *_):
    return ImageEnhance.Contrast(img).enhance(factor)


def saturation(img, factor: float, *_):
    """0 = grey, 1 = unchanged (Pillow's ``ImageEnhance.Color``)."""
    return ImageEnhance.Color(img).enhance(factor)


def sharpness(img, factor: float, *_):
    return ImageEnhance.Sharpness(img).enhance(factor)


def gaussian_blur(img, radius: float, *_):
    return img.filter(ImageFilter.GaussianBlur(radius=radius))


def hue(img, shift: float, *_):
    """Rotate the hue by ``shift`` of a turn (-0.5..0.5): the HSV hue channel (0..255) plus
    ``trunc(shift * 255)``, wrapping around (torchvision's ``adjust_hue`` on PIL images)."""
    if img.mode != "RGB":
        return img
    h, s, v = img.convert("HSV").split()
    h_arr = (np.asarray(h, dtype=np.int32) + int(shift * 255)) % 256
    h = Image.fromarray(h_arr.astype(np.uint8), mode="L")
    return Image.merge("HSV", (h, s, v)).convert("RGB")
