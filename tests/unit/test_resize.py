"""The data layer's resize, resized crop and pad (``vitscale/data/decode.py``) give torchvision's
``transforms.v2.functional`` values, without importing torchvision (whose package imports
``torch._dynamo``: about a second of start-up for every process that reads images)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest
import torch
from torchvision.transforms.v2 import functional as TF

from vitscale.data.decode import pad, resize, resized_crop

MODES = {"bilinear": TF.InterpolationMode.BILINEAR, "bicubic": TF.InterpolationMode.BICUBIC}
# torchvision resamples uint8 as uint8 on these CPUs (elsewhere bilinear goes through float32): the
# values are then the same to the bit; on another CPU they may differ by one level
SAME_PATH = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") or platform.machine() in ("aarch64", "arm64")


def _images(seed: int):
    g = torch.Generator().manual_seed(seed)
    for c, h, w in ((3, 37, 53), (1, 8, 8), (3, 224, 160)):
        yield torch.randint(0, 256, (c, h, w), generator=g, dtype=torch.uint8)
        yield torch.rand((c, h, w), generator=g) * 1.4 - 0.2  # float32, outside [0, 1] too
    yield torch.randint(0, 256, (2, 3, 30, 41), generator=g, dtype=torch.uint8)  # a batch


@pytest.mark.parametrize("mode", sorted(MODES))
def test_resize_gives_torchvisions_values(mode):
    for img in _images(0):
        h, w = img.shape[-2:]
        for size in ((h, w), (2 * h + 1, w // 2 + 3), (max(1, h // 3), max(1, w // 5)), (32, 32), (96, 96)):
            got, ref = resize(img, size, mode), TF.resize(img, list(size), interpolation=MODES[mode], antialias=True)
            assert got.dtype == ref.dtype == img.dtype and got.shape == ref.shape, (img.shape, size)
            if img.dtype == torch.uint8 and not SAME_PATH and mode == "bilinear":
                assert (got.int() - ref.int()).abs().max() <= 1, (img.shape, size)
            else:
                assert torch.equal(got, ref), (img.dtype, img.shape, size, (got.double() - ref.double()).abs().max())
        assert resize(img, (h, w), mode) is img  # the size it has: the same tensor, no copy


def test_resized_crop_of_a_view_and_pad_give_torchvisions_values():
    img = torch.randint(0, 256, (3, 61, 47), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    for top, left, h, w, size in ((3, 5, 40, 30, (24, 24)), (0, 0, 61, 47, (96, 64)), (10, 2, 7, 40, (32, 20))):
        for mode in MODES:
            ref = TF.resized_crop(img, top, left, h, w, list(size), interpolation=MODES[mode], antialias=True)
            assert torch.equal(resized_crop(img, top, left, h, w, size, mode), ref), (top, left, h, w, size, mode)
    for fill in (0, 17, [1, 128, 255]):
        for l, t, r, b in ((0, 2, 0, 3), (4, 0, 5, 0), (1, 2, 3, 4)):
            ref = TF.pad(img, [l, t, r, b], fill=fill)
            assert torch.equal(pad(img, l, t, r, b, fill), ref), (fill, (l, t, r, b))
    f = torch.rand(1, 5, 6)
    assert torch.equal(pad(f, 1, 1, 2, 0, 0.25), TF.pad(f, [1, 1, 2, 0], fill=0.25))


def test_an_unknown_interpolation_is_refused():
    with pytest.raises(ValueError, match="interpolation must be one of"):
        resize(torch.zeros(1, 4, 4), (2, 2), "nearest")


def test_training_and_evaluation_code_imports_no_torchvision():
    """A training or evaluation process reads images without torchvision (timm, open_clip and the
    token-labeling teacher's ROI align still import it where they are used)."""
    code = ("import sys\nimport vitscale.train, vitscale.data, vitscale.eval, vitscale.commands.train\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torchvision'))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
