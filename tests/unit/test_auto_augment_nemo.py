"""``data.auto_augment: nemo``: NeMo's ImageNetPolicy (NVIDIA/NeMo
``nemo/collections/vision/data/megatron/autoaugment.py``) op by op on real photos, against Pillow
called as that module calls it (NeMo itself is not installable here: its arguments are the reference,
written out below from its ``ranges`` table and ``func_dict``), and NeMo's order: colour jitter first."""

from __future__ import annotations

import random

import numpy as np
import pytest
from PIL import Image, ImageEnhance, ImageOps

from vitscale.data.auto_augment import (
    NEMO_OPS,
    ORIGINAL_POLICY,
    ColorJitter,
    Draw,
    NeMoAutoAugment,
    build_augment,
)

LEVELS = 11  # NeMo: num_levels = _MAX_LEVEL + 1; each range is np.linspace(lo, hi, 11)[m]
RANGES = {
    "ShearX": np.linspace(0, 0.3, LEVELS), "Rotate": np.linspace(0, 30, LEVELS), "Color": np.linspace(0.0, 0.9, LEVELS),
    "PosterizeOriginal": np.round(np.linspace(8, 4, LEVELS), 0).astype(int), "Solarize": np.linspace(256, 0, LEVELS),
    "Contrast": np.linspace(0.0, 0.9, LEVELS), "Sharpness": np.linspace(0.0, 0.9, LEVELS),
}  # fmt: skip
GREY = (128, 128, 128)


def _nemo(img: Image.Image, name: str, m: int, sign: int) -> Image.Image:
    """The op as NeMo's ``func_dict`` applies it, ``sign`` its ``random.choice([-1, 1])``."""
    mag = RANGES.get(name, [0] * LEVELS)[m]
    if name == "ShearX":  # NeMo passes (128, 128, 128), which Pillow refuses for a grey image: 128 there
        fill = GREY if img.mode == "RGB" else 128
        return img.transform(img.size, Image.AFFINE, (1, mag * sign, 0, 0, 1, 0), Image.BICUBIC, fillcolor=fill)
    if name == "Rotate":  # rotate_with_fill: RGBA rotation composited over grey
        rotated = img.convert("RGBA").rotate(mag)
        return Image.composite(rotated, Image.new("RGBA", rotated.size, (128,) * 4), rotated).convert(img.mode)
    enhance = {"Color": ImageEnhance.Color, "Contrast": ImageEnhance.Contrast, "Sharpness": ImageEnhance.Sharpness}
    if name in enhance:
        return enhance[name](img).enhance(1 + mag * sign)
    return {
        "PosterizeOriginal": lambda: ImageOps.posterize(img, int(mag)), "Solarize": lambda: ImageOps.solarize(img, mag),
        "AutoContrast": lambda: ImageOps.autocontrast(img), "Equalize": lambda: ImageOps.equalize(img),
        "Invert": lambda: ImageOps.invert(img),
    }[name]()  # fmt: skip


@pytest.fixture(scope="module")
def photos():
    from sklearn.datasets import load_sample_images

    return [Image.fromarray(a).resize((160, 107), Image.Resampling.BICUBIC) for a in load_sample_images().images]


def test_every_nemo_op_equals_nemos_pillow_calls(photos):
    policy = NeMoAutoAugment(None)
    used = {name for sub in ORIGINAL_POLICY for name, _, _ in sub}
    assert used == set(NEMO_OPS)  # the ops its 25 sub-policies use, no more
    for img in photos + [photos[0].convert("L")]:
        for name in NEMO_OPS:
            for m in (0, 2, 3, 5, 7, 8, 9, 10):
                for negate in (False, True):
                    got = policy.apply(img, [Draw(name, float(m), negate)])
                    want = _nemo(img, name, m, -1 if negate else 1)
                    assert got.mode == want.mode and got.size == want.size
                    diff = np.abs(np.asarray(got, dtype=np.int16) - np.asarray(want, dtype=np.int16)).max()
                    assert diff == 0, f"{name} m={m} negate={negate} ({img.mode}): {diff} grey levels apart"


def test_nemo_draws_follow_its_subpolicies():
    """One of the 25 sub-policies per image, each op kept with its probability, no magnitude noise."""
    rng = random.Random(0)
    policy = NeMoAutoAugment(None)
    seen = {}
    for _ in range(4000):
        for d in policy.draw(rng):
            seen.setdefault(d.op, set()).add(d.magnitude)
    assert set(seen) == set(NEMO_OPS)
    for name, mags in seen.items():  # the magnitudes are the table's indices exactly
        assert mags <= {float(m) for sub in ORIGINAL_POLICY for n, _, m in sub if n == name}


def test_nemo_jitter_comes_first_and_needs_no_force():
    aug = build_augment("nemo", [0.4, 0.4, 0.4, 0.1], mean=(0.5, 0.5, 0.5), interpolation="bilinear")
    assert isinstance(aug.policies[0], ColorJitter) and isinstance(aug.policies[1], NeMoAutoAugment)
    assert aug.policies[0].ranges == {"Brightness": (0.6, 1.4), "Contrast": (0.6, 1.4), "Saturation": (0.6, 1.4), "Hue": (-0.1, 0.1)}
