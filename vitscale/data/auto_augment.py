"""``data.auto_augment`` and ``data.color_jitter``: per-sample photometric / geometric augmentation
policies with the semantics of their references, every random choice drawn from the sample's keyed
generator (:mod:`vitscale.data.keyed`), so a sample gets the same augmentation on any layout and
after a resume.

Accepted ``data.auto_augment`` strings (sections joined by ``-``, as timm's
``timm/data/auto_augment.py`` parses them):

- ``rand-m9-mstd0.5-inc1`` (timm's RandAugment, arXiv 1909.13719): ``m`` magnitude out of 10 (default
  10), ``n`` ops per image (default 2, chosen uniformly with replacement), ``p`` probability of each
  chosen op (default 0.5), ``mstd`` std of Gaussian noise on the magnitude per op (above 100: uniform
  in [0, m]), ``mmax`` upper clamp of the noisy magnitude (default 10), ``inc1`` the
  increasing-severity op set. Geometric ops fill with the mean colour (``data.mean`` x 255).
- ``original`` / ``originalr`` (AutoAugment's ImageNet policy, arXiv 1805.09501, as timm
  tabulates it; ``r``: the increasing posterize), optionally ``-mstd<x>``.
- ``3a`` (DeiT III's 3-Augment, arXiv 2204.07118: one of grayscale, solarize at 128, Gaussian blur
  of radius U(0.1, 2)); ``data.color_jitter`` (DeiT III: 0.3) is applied after it.
- ``ta_wide`` (TrivialAugment, arXiv 2103.10158, the wide space of torchvision's
  ``TrivialAugmentWide``, named ``ta_wide`` as in torchvision's ``references/classification``; timm
  has none): one op, a magnitude bin of 31 drawn uniformly, black fill.
- ``nemo`` (NeMo's ImageNetPolicy, NVIDIA/NeMo ``nemo/collections/vision/data/megatron/autoaugment.py``:
  AutoAugment's 25 sub-policies with DeepVoltaire/AutoAugment's arguments, grey 128 fill;
  ``NEMO_OPS``); ``data.color_jitter`` (NeMo: 0.4, 0.4, 0.4, 0.1) is applied before it, as NeMo's
  ``ClassificationTransform`` orders them.

``data.color_jitter``: brightness, contrast, saturation (one value: all three), and optionally hue,
applied in a random order with factors U(1 - x, 1 + x) (hue U(-h, h)), as torchvision's
``ColorJitter``. timm's ``create_transform`` turns colour jitter off under RandAugment / AutoAugment
(except ``3a``) unless ``force_color_jitter``: here that combination is refused rather than ignored,
and ``data.force_color_jitter`` applies it after the policy as timm's does.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, replace

import numpy as np
import torch
from PIL import Image

from ..errors import ConfigError
from . import augment_ops as ops
from .decode import pil_to_uint8_tensor

LEVELS = 10.0  # timm's magnitudes are out of 10 (``_LEVEL_DENOM``)
TA_BINS = 31  # torchvision's TrivialAugmentWide magnitude bins


@dataclass(frozen=True)
class Draw:
    """One operation as drawn for one image: the op's name in its policy's table, its magnitude
    (timm: a level 0..10 after noise and clamping; ``ta_wide``: a bin 0..30; jitter: the factor),
    the sign of signed ops, and ``u``, a uniform [0, 1) draw for an op with a random argument."""

    op: str
    magnitude: float = 0.0
    negate: bool = False
    u: float = 0.0
    resample: int | None = None  # the filter drawn for this op (``random`` interpolation); None: the policy's


def _sign(x: float, d: Draw) -> float:
    return -x if d.negate else x


def _clamp(x: float, lo: float, hi: float) -> float:
    return max(lo, min(hi, x))


# timm's ops: name -> (operation, argument from (level / 10, draw, image)); None: no argument.
# The level -> argument maps are timm's ``LEVEL_TO_ARG`` (timm/data/auto_augment.py).
def _enhance(m, d, img):
    return m * 1.8 + 0.1  # 0.1 .. 1.9


def _enhance_increasing(m, d, img):
    return max(0.1, 1.0 + _sign(m * 0.9, d))  # 1 -/+ up to 0.9


TIMM_OPS = {
    "AutoContrast": (ops.auto_contrast, None),
    "Equalize": (ops.equalize, None),
    "Invert": (ops.invert, None),
    "Rotate": (ops.rotate, lambda m, d, img: _sign(m * 30.0, d)),
    "Posterize": (ops.posterize, lambda m, d, img: int(m * 4)),
    "PosterizeIncreasing": (ops.posterize, lambda m, d, img: 4 - int(m * 4)),
    "PosterizeOriginal": (ops.posterize, lambda m, d, img: int(m * 4) + 4),
    "Solarize": (ops.solarize, lambda m, d, img: min(256, int(m * 256))),
    "SolarizeIncreasing": (ops.solarize, lambda m, d, img: 256 - min(256, int(m * 256))),
    "SolarizeAdd": (ops.solarize_add, lambda m, d, img: min(128, int(m * 110))),
    "Color": (ops.saturation, _enhance),
    "ColorIncreasing": (ops.saturation, _enhance_increasing),
    "Contrast": (ops.contrast, _enhance),
    "ContrastIncreasing": (ops.contrast, _enhance_increasing),
    "Brightness": (ops.brightness, _enhance),
    "BrightnessIncreasing": (ops.brightness, _enhance_increasing),
    "Sharpness": (ops.sharpness, _enhance),
    "SharpnessIncreasing": (ops.sharpness, _enhance_increasing),
    "ShearX": (ops.shear_x, lambda m, d, img: _sign(m * 0.3, d)),
    "ShearY": (ops.shear_y, lambda m, d, img: _sign(m * 0.3, d)),
    "TranslateXRel": (ops.translate_x, lambda m, d, img: _sign(m * 0.45, d) * img.size[0]),
    "TranslateYRel": (ops.translate_y, lambda m, d, img: _sign(m * 0.45, d) * img.size[1]),
    # 3-Augment: grayscale at level 10 (saturation factor 1 - clamp(0.5 + 0.5 m, 0.5, 1))
    "Desaturate": (ops.saturation, lambda m, d, img: _clamp(1.0 - _clamp(0.5 + 0.5 * m, 0.5, 1.0), 0.0, 1.0)),
    # radius U(0.1, 2 x level) (uniform as Python's random.uniform: a + (b - a) u)
    "GaussianBlurRand": (ops.gaussian_blur, lambda m, d, img: 0.1 + (2.0 * _clamp(m, 0.0, 1.0) - 0.1) * d.u),
}

# timm's ``_RAND_TRANSFORMS`` / ``_RAND_INCREASING_TRANSFORMS`` (Cutout is random erasing here too)
RAND_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color", "Contrast",
            "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")  # fmt: skip
RAND_INCREASING_OPS = tuple(
    {"Posterize": "PosterizeIncreasing", "Solarize": "SolarizeIncreasing", "Color": "ColorIncreasing",
     "Contrast": "ContrastIncreasing", "Brightness": "BrightnessIncreasing", "Sharpness": "SharpnessIncreasing"}.get(o, o)
    for o in RAND_OPS
)  # fmt: skip

# AutoAugment's ImageNet policy (arXiv 1805.09501, appendix table 9), as timm's
# ``auto_augment_policy_original`` lists it: 25 sub-policies of two (op, probability, magnitude).
ORIGINAL_POLICY = (
    (("PosterizeOriginal", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)), (("PosterizeOriginal", 0.6, 7), ("PosterizeOriginal", 0.6, 6)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)), (("Equalize", 0.4, 4), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, 7)), (("PosterizeOriginal", 0.8, 5), ("Equalize", 1.0, 2)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, 8), ("PosterizeOriginal", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, 2)),
    (("Equalize", 0.0, 7), ("Equalize", 0.8, 8)), (("Invert", 0.6, 4), ("Equalize", 1.0, 8)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, 8)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, 9)), (("Color", 0.4, 0), ("Equalize", 0.6, 3)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Invert", 0.6, 4), ("Equalize", 1.0, 8)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
)  # fmt: skip
ORIGINALR_POLICY = tuple(tuple(("PosterizeIncreasing" if o == "PosterizeOriginal" else o, p, m) for o, p, m in sub)
                         for sub in ORIGINAL_POLICY)  # fmt: skip
# DeiT III's 3-Augment (facebookresearch/deit README_revenge.md, augment.py), as timm's
# ``auto_augment_policy_3a``: solarize at threshold 128, grayscale, Gaussian blur; one per image.
THREE_AUGMENT_POLICY = ((("Solarize", 1.0, 5),), (("Desaturate", 1.0, 10),), (("GaussianBlurRand", 1.0, 10),))


# NeMo's ImageNetPolicy (NVIDIA/NeMo nemo/collections/vision/data/megatron/autoaugment.py, after
# DeepVoltaire/AutoAugment): the same 25 sub-policies as ORIGINAL_POLICY, with its own arguments for a
# magnitude index m of 0..10 (``np.linspace(lo, hi, 11)[m]``): rotation by +3m degrees (no random sign;
# nearest-neighbour, the uncovered corners grey 128), posterize to round(8 - 0.4 m) bits, solarize at
# 256 - 25.6 m, enhancements 1 -/+ 0.09 m, shear -/+ 0.03 m (bicubic, grey 128 fill); no magnitude noise.
_NEMO_ROTATE = ops.Geometry(ops.RESAMPLE["nearest"], (128, 128, 128))
_NEMO_SHEAR = ops.Geometry(ops.RESAMPLE["bicubic"], (128, 128, 128))


def _nemo_enhance(m, d, img):
    return 1.0 + _sign(m * 0.9, d)


NEMO_OPS = {
    "AutoContrast": (ops.auto_contrast, None),
    "Equalize": (ops.equalize, None),
    "Invert": (ops.invert, None),
    "Rotate": (lambda img, deg, geo: ops.rotate(img, deg, _NEMO_ROTATE), lambda m, d, img: m * 30.0),
    "PosterizeOriginal": (ops.posterize, lambda m, d, img: int(np.round(8.0 - 4.0 * m))),
    "Solarize": (ops.solarize, lambda m, d, img: 256.0 - 256.0 * m),
    "Color": (ops.saturation, _nemo_enhance),
    "Contrast": (ops.contrast, _nemo_enhance),
    "Sharpness": (ops.sharpness, _nemo_enhance),
    "ShearX": (lambda img, f, geo: ops.shear_x(img, f, _NEMO_SHEAR), lambda m, d, img: _sign(m * 0.3, d)),
}


def _bins(lo: float, hi: float) -> list[float]:
    """torchvision's ``torch.linspace(lo, hi, 31)`` (float32), the values its bins take."""
    return torch.linspace(lo, hi, TA_BINS).tolist()


_SHEAR, _TRANSLATE, _ROTATE, _ENHANCE = _bins(0.0, 0.99), _bins(0.0, 32.0), _bins(0.0, 135.0), _bins(0.0, 0.99)
_SOLARIZE = _bins(255.0, 0.0)

# TrivialAugmentWide's space (torchvision ``TrivialAugmentWide._augmentation_space``): name ->
# (operation, argument from (bin, draw, image)). Shears are factors (torchvision shears by
# atan(factor) degrees, the same map); translations are whole pixels, the content moving right / down
# for a positive draw.
TA_WIDE_OPS = {
    "Identity": (ops.identity, None),
    "ShearX": (ops.shear_x, lambda b, d, img: _sign(_SHEAR[int(b)], d)),
    "ShearY": (ops.shear_y, lambda b, d, img: _sign(_SHEAR[int(b)], d)),
    "TranslateX": (ops.translate_x, lambda b, d, img: -int(_sign(_TRANSLATE[int(b)], d))),
    "TranslateY": (ops.translate_y, lambda b, d, img: -int(_sign(_TRANSLATE[int(b)], d))),
    "Rotate": (ops.rotate, lambda b, d, img: _sign(_ROTATE[int(b)], d)),
    "Brightness": (ops.brightness, lambda b, d, img: 1.0 + _sign(_ENHANCE[int(b)], d)),
    "Color": (ops.saturation, lambda b, d, img: 1.0 + _sign(_ENHANCE[int(b)], d)),
    "Contrast": (ops.contrast, lambda b, d, img: 1.0 + _sign(_ENHANCE[int(b)], d)),
    "Sharpness": (ops.sharpness, lambda b, d, img: 1.0 + _sign(_ENHANCE[int(b)], d)),
    "Posterize": (ops.posterize, lambda b, d, img: 8 - round(int(b) / ((TA_BINS - 1) / 6))),
    "Solarize": (ops.solarize, lambda b, d, img: _SOLARIZE[int(b)]),
    "AutoContrast": (ops.auto_contrast, None),
    "Equalize": (ops.equalize, None),
}

JITTER_OPS = {  # torchvision ColorJitter's four adjustments; the draw's magnitude is the factor
    "Brightness": (ops.brightness, lambda f, d, img: f),
    "Contrast": (ops.contrast, lambda f, d, img: f),
    "Saturation": (ops.saturation, lambda f, d, img: f),
    "Hue": (ops.hue, lambda f, d, img: f),
}


class Policy:
    """A policy: ``draw(rng)`` the operations of one image from a ``random.Random``, ``apply`` them."""

    table: dict = TIMM_OPS
    level_scale: float = LEVELS  # the argument maps see magnitude / level_scale (bins and factors: 1)

    def __init__(self, geometry: ops.Geometry):
        self.geometry = geometry

    def draw(self, rng: random.Random) -> list[Draw]:
        raise NotImplementedError

    def apply(self, img: Image.Image, draws: list[Draw]) -> Image.Image:
        for d in draws:
            fn, arg = self.table[d.op]
            geo = self.geometry if d.resample is None else replace(self.geometry, resample=d.resample)
            img = fn(img, None if arg is None else arg(d.magnitude / self.level_scale, d, img), geo)
        return img

    def _resample(self, rng: random.Random) -> int | None:
        """A filter per op when the interpolation is ``random`` (timm: ``random.choice`` per call)."""
        r = self.geometry.resample
        return r[rng.randrange(len(r))] if isinstance(r, tuple) else None


class _TimmPolicy(Policy):
    def __init__(self, geometry, mstd: float = 0.0, mmax: float | None = None):
        super().__init__(geometry)
        self.mstd, self.mmax = float(mstd), mmax

    def _op(self, rng: random.Random, name: str, prob: float, magnitude: float) -> Draw | None:
        """One op of probability ``prob`` at ``magnitude`` with timm's noise and clamp, or None."""
        if prob < 1.0 and rng.random() >= prob:
            return None
        m = float(magnitude)
        if math.isinf(self.mstd):
            m = rng.uniform(0.0, m)
        elif self.mstd > 0:
            m = rng.gauss(m, self.mstd)
        m = _clamp(m, 0.0, float(self.mmax or LEVELS))
        return Draw(name, m, rng.random() < 0.5, rng.random(), self._resample(rng))


class RandAugment(_TimmPolicy):
    def __init__(self, geometry, magnitude: float = 10, num_ops: int = 2, prob: float = 0.5, increasing: bool = False, **kw):
        super().__init__(geometry, **kw)
        self.magnitude, self.num_ops, self.prob = float(magnitude), int(num_ops), float(prob)
        self.ops = RAND_INCREASING_OPS if increasing else RAND_OPS

    def draw(self, rng):
        chosen = [self.ops[rng.randrange(len(self.ops))] for _ in range(self.num_ops)]
        return [d for d in (self._op(rng, name, self.prob, self.magnitude) for name in chosen) if d is not None]


class AutoAugment(_TimmPolicy):
    def __init__(self, geometry, policy, **kw):
        super().__init__(geometry, **kw)
        self.policy = policy

    def draw(self, rng):
        sub = self.policy[rng.randrange(len(self.policy))]
        return [d for d in (self._op(rng, name, p, m) for name, p, m in sub) if d is not None]


class NeMoAutoAugment(Policy):
    """NeMo's ImageNetPolicy (``NEMO_OPS``): one of the 25 sub-policies, each op with its probability."""

    table = NEMO_OPS

    def draw(self, rng):
        sub = ORIGINAL_POLICY[rng.randrange(len(ORIGINAL_POLICY))]
        return [Draw(name, float(m), rng.random() < 0.5) for name, p, m in sub if rng.random() < p]


class TrivialAugmentWide(Policy):
    table = TA_WIDE_OPS
    level_scale = 1.0

    def draw(self, rng):
        names = list(TA_WIDE_OPS)
        return [Draw(names[rng.randrange(len(names))], rng.randrange(TA_BINS), rng.random() < 0.5, resample=self._resample(rng))]


class ColorJitter(Policy):
    """Brightness, contrast, saturation, hue in a random order, each factor drawn uniformly."""

    table = JITTER_OPS
    level_scale = 1.0

    def __init__(self, brightness: float, contrast: float, saturation: float, hue: float = 0.0):
        super().__init__(ops.Geometry())
        self.ranges = {}
        for name, x in (("Brightness", brightness), ("Contrast", contrast), ("Saturation", saturation)):
            if x > 0:
                self.ranges[name] = (max(0.0, 1.0 - x), 1.0 + x)
        if hue > 0:
            self.ranges["Hue"] = (-hue, hue)

    def draw(self, rng):
        order = list(JITTER_OPS)
        rng.shuffle(order)
        return [Draw(n, rng.uniform(*self.ranges[n])) for n in order if n in self.ranges]


# ----------------------------------------------------------------------------------------- parsing
_KEY = "data.auto_augment"
_FORMS = "e.g. rand-m9-mstd0.5-inc1, original, 3a, ta_wide or nemo (docs/data.md)"


def _sections(spec: str, rest: str, allowed: tuple[str, ...]) -> dict[str, str]:
    """``rest`` = ``"m9-mstd0.5"`` -> {"m": "9", "mstd": "0.5"}: timm's ``<letters><number>`` sections."""
    out = {}
    for sec in rest.split("-"):
        m = re.fullmatch(r"([a-z]+)(\d[\d.]*)", sec)
        if m is None or m.group(1) not in allowed:
            raise ConfigError(f"{_KEY}: unknown section {sec!r} in {spec!r} (this policy takes {', '.join(allowed)}; {_FORMS})")
        out[m.group(1)] = m.group(2)
    return out


SECTION_RANGES = {"m": (0, 30), "n": (1, 16), "p": (0.0, 1.0), "mstd": (0.0, math.inf), "mmax": (0, 30), "inc": (0, 1)}
"""Each section's bounds: ``m`` / ``mmax`` magnitudes out of 10 (timm's scale, which ``mmax`` may lift
past 10; 30 is three times the strongest), ``n`` ops per image (the RandAugment paper searches 1 to 3;
past 16 an image is noise, and ``n100000`` drew 100,000 ops per image: no step, SIGTERM ignored),
``p`` a probability, ``mstd`` a standard deviation (above 100: uniform), ``inc`` a switch."""


def _number(spec: str, key: str, text: str, kind=float):
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(f"{_KEY}: {key}{text} in {spec!r} is not a number ({_FORMS})") from None
    low, high = SECTION_RANGES[key]
    if not low <= value <= high:
        raise ConfigError(f"{_KEY}: {key}{text} in {spec!r} is out of range: {key} takes {low} to {high} "
                          f"({_FORMS})")  # fmt: skip
    return value


def parse_auto_augment(spec: str, *, mean=(0.5, 0.5, 0.5), interpolation: str = "bilinear") -> Policy | None:
    """The policy of a ``data.auto_augment`` string (``""`` -> None); a ConfigError names a bad one.
    ``mean`` (of pixels in [0, 1]) sets timm's fill colour, ``interpolation`` the geometric ops' filter
    (``random``: bilinear or bicubic drawn per op)."""
    spec = (spec or "").strip()
    if not spec:
        return None
    if interpolation == "random":  # timm's: bilinear or bicubic, drawn per op
        resample = (ops.RESAMPLE["bilinear"], ops.RESAMPLE["bicubic"])
    elif interpolation in ops.RESAMPLE:
        resample = ops.RESAMPLE[interpolation]
    else:
        raise ConfigError(f"data.interpolation={interpolation!r} has no Pillow filter here: use one of {', '.join(ops.RESAMPLE)}")
    mean_fill = ops.Geometry(resample, tuple(min(255, round(255 * x)) for x in mean))  # timm's ``img_mean``
    head, _, rest = spec.partition("-")
    if head == "rand":
        s = _sections(spec, rest, ("m", "n", "p", "mstd", "mmax", "inc")) if rest else {}
        mstd = _number(spec, "mstd", s.get("mstd", "0"))
        return RandAugment(
            mean_fill, magnitude=_number(spec, "m", s.get("m", "10"), int), num_ops=_number(spec, "n", s.get("n", "2"), int),
            prob=_number(spec, "p", s.get("p", "0.5")), increasing=bool(_number(spec, "inc", s.get("inc", "0"), int)),
            mstd=math.inf if mstd > 100 else mstd, mmax=_number(spec, "mmax", s["mmax"], int) if "mmax" in s else None,
        )  # fmt: skip
    policies = {"original": ORIGINAL_POLICY, "originalr": ORIGINALR_POLICY, "3a": THREE_AUGMENT_POLICY}
    if head in policies:
        s = _sections(spec, rest, ("mstd",)) if rest else {}
        return AutoAugment(mean_fill, policies[head], mstd=_number(spec, "mstd", s.get("mstd", "0")))
    if head == "ta_wide" and not rest:
        return TrivialAugmentWide(ops.Geometry(resample, None))
    if head == "nemo" and not rest:
        return NeMoAutoAugment(ops.Geometry())
    if spec.startswith("m") and re.fullmatch(r"[mn]\d+(-[mn]\d+)*", spec):
        raise ConfigError(f"{_KEY}={spec!r}: a policy name comes first, as timm writes it (rand-{spec})")
    if head in ("v0", "v0r", "augmix"):
        raise ConfigError(f"{_KEY}: timm's {head!r} policy is not implemented here; use rand-..., original, originalr, 3a, ta_wide or nemo (docs/data.md)")
    raise ConfigError(f"{_KEY}: unknown policy {spec!r} ({_FORMS})")


def jitter_factors(values) -> tuple[float, float, float, float]:
    """``data.color_jitter`` -> (brightness, contrast, saturation, hue): () or [x] (x for the first three, as
    timm's scalar), [b, c, s] or [b, c, s, h]; a ConfigError for another length or a bad value."""
    if isinstance(values, (int, float)):  # data_config(color_jitter=0.4), as timm's scalar
        values = (values,)
    v = tuple(float(x) for x in (values or ()))
    if len(v) == 0:
        return (0.0, 0.0, 0.0, 0.0)
    if len(v) not in (1, 3, 4):
        raise ConfigError(f"data.color_jitter={list(v)}: give 1, 3 or 4 values (brightness, contrast, saturation[, hue]), e.g. 0.4 or [0.4,0.4,0.4,0.1]")
    b, c, s, h = (v * 3 + (0.0,)) if len(v) == 1 else (v + (0.0,))[:4]
    if min(b, c, s, h) < 0:
        raise ConfigError(f"data.color_jitter={list(v)}: the values must be >= 0 (0 = that adjustment off)")
    if h > 0.5:
        raise ConfigError(f"data.color_jitter={list(v)}: the hue value must be at most 0.5 (a fraction of the colour circle)")
    return b, c, s, h


class Augment:
    """The photometric stage of one sample: the ``data.auto_augment`` policy, then colour jitter (with
    ``nemo``: colour jitter first, as NeMo's ``ClassificationTransform``)."""

    def __init__(self, policies: list[Policy]):
        self.policies = policies

    def draw(self, rng: random.Random) -> list[list[Draw]]:
        return [p.draw(rng) for p in self.policies]

    def __call__(self, image: torch.Tensor, rng: random.Random) -> torch.Tensor:
        """uint8 (C, H, W) -> uint8 (C, H, W), every choice drawn from ``rng``."""
        drawn = self.draw(rng)
        if not any(drawn):  # every op skipped by its probability: no round trip through PIL
            return image
        c = image.shape[0]
        arr = np.ascontiguousarray(image.permute(1, 2, 0).numpy())  # (H, W, C)
        img = Image.fromarray(arr[:, :, 0], mode="L") if c == 1 else Image.fromarray(arr, mode="RGB")
        for p, draws in zip(self.policies, drawn, strict=True):
            img = p.apply(img, draws)
        return pil_to_uint8_tensor(img)


def build_augment(spec: str, color_jitter, *, mean, interpolation: str, force_color_jitter: bool = False) -> Augment | None:
    """The photometric stage of ``data.auto_augment`` / ``data.color_jitter`` (None when both are off).
    Colour jitter beside a policy other than ``3a`` needs ``force_color_jitter`` (timm's rule); with
    ``nemo`` it comes first (NVIDIA/NeMo ``vit_dataset.py`` ``ClassificationTransform``: ColorJitter,
    then ImageNetPolicy)."""
    policy = parse_auto_augment(spec, mean=mean, interpolation=interpolation)
    b, c, s, h = jitter_factors(color_jitter)
    jitter = ColorJitter(b, c, s, h) if max(b, c, s, h) > 0 else None
    three_augment = isinstance(policy, AutoAugment) and policy.policy is THREE_AUGMENT_POLICY
    if isinstance(policy, NeMoAutoAugment):
        stages = [p for p in (jitter, policy) if p is not None]
        return Augment(stages)
    if jitter is not None and policy is not None and not three_augment and not force_color_jitter:
        raise ConfigError(
            f"data.color_jitter is not applied with data.auto_augment={spec!r} (timm turns colour jitter off under "
            "RandAugment / AutoAugment; only 3a adds it): set data.color_jitter=0, or data.force_color_jitter=true to apply it after the policy"
        )  # fmt: skip
    stages = [p for p in (policy, jitter) if p is not None]
    return Augment(stages) if stages else None
