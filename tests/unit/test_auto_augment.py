"""``data.auto_augment`` / ``data.color_jitter`` against their references, op by op on real photos.

Each op of each policy runs through vitscale and through the reference at the same draws (op,
magnitude, sign, uniform draw, fill, interpolation) on scikit-learn's two sample photos (china.jpg,
flower.jpg); the outputs agree within 1 grey level. References: timm's ``timm/data/auto_augment.py``
(RandAugment, AutoAugment ``original`` / ``originalr``, 3-Augment ``3a``), torchvision's
``TrivialAugmentWide`` (``ta_wide``) and ``ColorJitter`` functions on PIL images.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from vitscale.data import data_config
from vitscale.data.auto_augment import (
    TA_BINS,
    AutoAugment,
    ColorJitter,
    Draw,
    RandAugment,
    TrivialAugmentWide,
    build_augment,
    jitter_factors,
    parse_auto_augment,
)
from vitscale.errors import ConfigError

timm_aa = pytest.importorskip("timm.data.auto_augment")
MEAN = (0.485, 0.456, 0.406)  # timm's fill is round(255 x mean): (124, 116, 104)
PIL_FILTER = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


@pytest.fixture(scope="module")
def photos():
    from sklearn.datasets import load_sample_images

    # the two photos (427 x 640), at 2/5 size to keep the test quick: 256 x 171
    return [Image.fromarray(a).resize((256, 171), Image.Resampling.BICUBIC) for a in load_sample_images().images]


def _close(a: Image.Image, b: Image.Image, what: str) -> None:
    assert a.size == b.size and a.mode == b.mode, what
    diff = np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16))
    assert diff.max() <= 1, f"{what}: {int(diff.max())} grey levels apart at {np.argwhere(diff > 1)[0].tolist()}"


def _timm(img, name, magnitude, interpolation, seed):
    """timm's op at ``magnitude`` (probability 1, no noise) with its one random draw taken from
    Python's ``random`` seeded with ``seed``: returns (output, that draw)."""
    hp = dict(translate_const=100, img_mean=tuple(min(255, round(255 * x)) for x in MEAN), interpolation=PIL_FILTER[interpolation])
    op = timm_aa.AugmentOp(name, prob=1.0, magnitude=magnitude, hparams=hp)
    random.seed(seed)
    u = random.random()  # the sign (negated when > 0.5) or the blur radius' uniform draw
    random.seed(seed)
    return op(img), u


def _posterize_bits(name: str, magnitude: float) -> int:
    return timm_aa.LEVEL_TO_ARG[name](magnitude, {})[0]


def _ops_of(spec: str) -> list[str]:
    """The op names timm's own parser builds for ``spec``."""
    if spec.startswith("rand"):
        return [op.name for op in timm_aa.rand_augment_transform(spec, {}).ops]
    return sorted({op.name for sub in timm_aa.auto_augment_policy(spec.split("-")[0], {}) for op in sub})


@pytest.mark.parametrize("spec", ["rand-m9-mstd0.5-inc1", "rand-m7-mstd0.5", "original", "originalr", "3a"])
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_each_timm_op_matches_timm_on_real_photos(spec, interpolation, photos):
    policy = parse_auto_augment(spec, mean=MEAN, interpolation=interpolation)
    names = _ops_of(spec)
    if isinstance(policy, RandAugment):
        assert list(policy.ops) == names  # the same op set, in timm's order
    assert len(names) >= 3
    for name in names:
        for magnitude in (0, 2.5, 5, 7.3, 9, 10):
            for seed in (0, 3):  # seed 0 draws 0.84 (negated), seed 3 draws 0.24 (not negated)
                for k, img in enumerate(photos):
                    try:
                        ref, u = _timm(img, name, magnitude, interpolation, seed)
                    except ValueError as e:
                        # timm keeps 0 bits (PosterizeIncreasing at m10, Posterize below m2.5), which the
                        # installed Pillow's (13) ImageOps.posterize refuses; keeping no bit makes the image black
                        assert name.startswith("Posterize") and _posterize_bits(name, magnitude) == 0, e
                        ours = policy.apply(img, [Draw(name, magnitude)])
                        assert not np.asarray(ours).any()
                        continue
                    assert (u > 0.5) == (seed == 0) and abs(u - [0.844, 0.238][seed > 0]) < 1e-3
                    ours = policy.apply(img, [Draw(name, magnitude, negate=u > 0.5, u=u)])
                    _close(ours, ref, f"{spec} {name} m={magnitude} u={u:.2f} photo {k} {interpolation}")


def test_policies_are_timms(photos):
    """Sub-policies (op, probability, magnitude) and RandAugment's parameters as timm parses them."""
    for name in ("original", "originalr", "3a"):
        ours = parse_auto_augment(name).policy
        theirs = timm_aa.auto_augment_policy(name, {})
        assert [[(o.name, o.prob, o.magnitude) for o in sub] for sub in theirs] == [list(sub) for sub in ours]
    for spec in ("rand-m9-mstd0.5-inc1", "rand-m7-mstd0.5", "rand-m9-n3-p0.7-mmax12", "rand-n1-mstd101", "original-mstd0.5"):
        ours = parse_auto_augment(spec)
        if spec.startswith("rand"):
            t = timm_aa.rand_augment_transform(spec, {})
            assert (ours.num_ops, ours.prob, ours.magnitude) == (t.num_layers, t.ops[0].prob, t.ops[0].magnitude), spec
            op = t.ops[0]
        else:
            op = timm_aa.auto_augment_transform(spec, {}).policy[0][0]
        assert (ours.mstd, ours.mmax) == (op.magnitude_std, op.magnitude_max), spec


def test_noisy_magnitudes_are_timms_distribution():
    """mstd: Gaussian noise on the magnitude, clamped to [0, 10] (or mmax); above 100: uniform in [0, m]."""
    rng = random.Random(0)
    ra = parse_auto_augment("rand-m9-mstd0.5-p1.0")
    mags = np.array([d.magnitude for _ in range(4000) for d in ra.draw(rng)])
    # N(9, 0.5) clamped at 10: 2.3% at 10 (1 - Phi(2)); below it the mean is 9 - 0.5 phi(2) / Phi(2) = 8.972
    assert len(mags) == 8000 and mags.max() == 10.0 and abs((mags == 10).mean() - 0.0228) < 0.008
    assert abs(mags[mags < 10].mean() - 8.972) < 0.03 and abs(mags[mags < 10].std() - 0.47) < 0.03
    uni = np.array([d.magnitude for _ in range(2000) for d in parse_auto_augment("rand-m9-mstd101-p1.0").draw(rng)])
    assert 0 <= uni.min() < 0.1 and 8.9 < uni.max() <= 9 and abs(uni.mean() - 4.5) < 0.2
    applied = sum(len(parse_auto_augment("rand-m9").draw(rng)) for _ in range(4000))
    assert abs(applied / 8000 - 0.5) < 0.03  # each chosen op applied with probability 0.5


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_trivial_augment_matches_torchvision_on_real_photos(interpolation, photos):
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import TrivialAugmentWide as TVTrivial
    from torchvision.transforms.autoaugment import _apply_op

    space = TVTrivial()._augmentation_space(TA_BINS)
    policy = parse_auto_augment("ta_wide", interpolation=interpolation)
    assert isinstance(policy, TrivialAugmentWide) and set(policy.table) == set(space)
    mode = InterpolationMode(interpolation)
    for name, (mags, signed) in space.items():
        for b in (0, 1, 7, 15, 22, 30):
            for negate in (False, True) if signed else (False,):
                mag = float(mags[b].item()) if mags.ndim > 0 else 0.0
                for k, img in enumerate(photos):
                    ref = _apply_op(img, name, -mag if negate else mag, interpolation=mode, fill=None)
                    ours = policy.apply(img, [Draw(name, b, negate=negate)])
                    _close(ours, ref, f"ta_wide {name} bin {b} negate={negate} photo {k}")


def test_color_jitter_matches_torchvision_on_real_photos(photos):
    from torchvision.transforms import functional as F

    ref_fn = {"Brightness": F.adjust_brightness, "Contrast": F.adjust_contrast, "Saturation": F.adjust_saturation,
              "Hue": F.adjust_hue}  # fmt: skip
    cj = ColorJitter(0.4, 0.4, 0.4, 0.1)
    rng = random.Random(5)
    for _ in range(6):
        draws = cj.draw(rng)
        assert sorted(d.op for d in draws) == sorted(ref_fn) and len({d.op for d in draws}) == 4
        for k, img in enumerate(photos):
            ref = img
            for d in draws:
                ref = ref_fn[d.op](ref, d.magnitude)
            _close(cj.apply(img, draws), ref, f"jitter {draws} photo {k}")
    for h in (-0.5, -0.13, 0.02, 0.37, 0.5):
        _close(cj.apply(photos[0], [Draw("Hue", h)]), F.adjust_hue(photos[0], h), f"hue {h}")
    assert jitter_factors(0.3) == jitter_factors([0.3]) == (0.3, 0.3, 0.3, 0.0)
    assert jitter_factors([0.4, 0.4, 0.4, 0.1]) == (0.4, 0.4, 0.4, 0.1) and jitter_factors(()) == (0.0,) * 4
    assert [d.op for d in ColorJitter(0.3, 0.3, 0.3).draw(random.Random(0))] != []  # DeiT III: no hue
    assert "Hue" not in {d.op for d in ColorJitter(0.3, 0.3, 0.3).draw(random.Random(0))}


def test_bad_strings_are_one_line_errors():
    for spec, words in [("m9-n2", "rand-m9-n2"), ("rand-m9-x2", "unknown section 'x2'"), ("augmix-m3", "timm's 'augmix' policy is not implemented"), ("flip", "unknown policy"),
                        ("original-m3", "unknown section 'm3'"), ("rand-mstdx", "unknown section")]:  # fmt: skip
        with pytest.raises(ConfigError, match=words) as e:
            parse_auto_augment(spec)
        assert "\n" not in str(e.value) and "data.auto_augment" in str(e.value)
    with pytest.raises(ConfigError, match="set data.color_jitter=0"):
        build_augment("rand-m9-mstd0.5-inc1", (0.4,), mean=MEAN, interpolation="bicubic")
    assert build_augment("3a", (0.3,), mean=MEAN, interpolation="bicubic") is not None  # DeiT III: 3a + jitter 0.3
    forced = build_augment("original", (0.4, 0.4, 0.4, 0.1), mean=MEAN, interpolation="bicubic", force_color_jitter=True)
    assert [type(p).__name__ for p in forced.policies] == ["AutoAugment", "ColorJitter"]  # timm's order
    with pytest.raises(ConfigError, match="data.auto_augment=rand-m9-n2 for 'm9-n2'"):
        data_config(randaugment="m9-n2")


def _photo_jpeg(tmp_path, k=0):
    from sklearn.datasets import load_sample_images

    path = tmp_path / f"photo{k}.jpg"
    Image.fromarray(load_sample_images().images[k]).save(path, quality=90)
    return path


@pytest.mark.parametrize("spec", ["rand-m9-mstd0.5-inc1", "original", "3a", "ta_wide"])
def test_a_samples_augmentation_is_keyed(spec, tmp_path):
    """Decoded and augmented twice, by two transforms built apart (a re-run, another worker or rank):
    the same pixels for the same (seed, epoch, index); other indices and epochs draw otherwise."""
    from vitscale.data.transforms import SampleTransform

    photo = _photo_jpeg(tmp_path)
    cfg = data_config(format="imagefolder", auto_augment=spec, color_jitter=(0.3,) if spec == "3a" else (),
                     interpolation="bicubic", hflip=0.0)  # fmt: skip
    plain = SampleTransform(data_config(format="imagefolder", interpolation="bicubic", hflip=0.0), (96, 96), 3, seed=7, train=True)

    def run(epoch, index):
        return SampleTransform(cfg, (96, 96), 3, seed=7, train=True).decode(str(photo), epoch, index).image

    first = {(e, i): run(e, i) for e in (0, 1) for i in range(8)}
    for key, img in first.items():
        assert torch.equal(img, run(*key)), key
    changed = [k for k, img in first.items() if not torch.equal(img, plain.decode(str(photo), *k).image)]
    assert len(changed) >= 4  # the policy did something to most samples (the crop alone is keyed too)
    assert len({first[k].sum().item() for k in first}) == len(first)


def test_loader_batches_with_auto_augment_are_the_same_on_any_worker_count():
    from vitscale.data import build_loaders

    cfg = dict(format="synthetic", synthetic_size=24, num_classes=3, val_split=0.0, auto_augment="rand-m9-mstd0.5-inc1")
    kw = dict(img_size=(32, 32), num_channels=3, seed=1, micro_batch_size=6, eval_batch_size=6)
    a = [b["image"] for b in build_loaders(data_config(**cfg, num_workers=0), **kw).train]
    b = [b["image"] for b in build_loaders(data_config(**cfg, num_workers=2, persistent_workers=False), **kw).train]
    assert len(a) == len(b) == 4 and all(torch.equal(x, y) for x, y in zip(a, b))
    plain = [b["image"] for b in build_loaders(data_config(**{**cfg, "auto_augment": ""}, num_workers=0), **kw).train]
    assert not all(torch.equal(x, y) for x, y in zip(a, plain))


def test_one_channel_images_take_every_policy():
    img = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (1, 40, 48), dtype=np.uint8))
    for spec in ("rand-m9-mstd0.5-inc1", "original", "3a", "ta_wide"):
        aug = build_augment(spec, (0.3,) if spec == "3a" else (), mean=(0.5,), interpolation="bicubic")
        for i in range(30):
            out = aug(img, random.Random(i))
            assert out.shape == img.shape and out.dtype == torch.uint8
    assert isinstance(parse_auto_augment("original"), AutoAugment)


def test_random_interpolation_draws_bilinear_or_bicubic_per_op(photos):
    """timm's ``random``: each geometric op samples with bilinear or bicubic, drawn per op."""
    rand = parse_auto_augment("rand-m9-mstd0.5-inc1-p1.0", mean=MEAN, interpolation="random")
    fixed = {m: parse_auto_augment("rand-m9-mstd0.5-inc1-p1.0", mean=MEAN, interpolation=m) for m in PIL_FILTER}
    rng, seen = random.Random(0), set()
    for _ in range(40):
        for d in rand.draw(rng):
            seen.add(d.resample)
            mode = next(m for m, f in PIL_FILTER.items() if f == d.resample)
            if d.op in ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"):
                _close(rand.apply(photos[0], [d]), fixed[mode].apply(photos[0], [replace(d, resample=None)]), f"{d}")
    assert seen == set(PIL_FILTER.values())


def test_random_train_interpolation_keeps_the_crop_and_picks_a_filter_per_image(tmp_path):
    """``data.train_interpolation=random``: the same boxes as a fixed filter, each image resized with
    bilinear or bicubic (its own key), the same on a re-run; evaluation keeps ``interpolation``."""
    from vitscale.data.transforms import SampleTransform

    photo = _photo_jpeg(tmp_path, 1)

    def tf(**kw):
        return SampleTransform(data_config(format="imagefolder", hflip=0.0, **kw), (64, 64), 3, seed=2, train=True)

    rand, bil, bic = tf(train_interpolation="random"), tf(interpolation="bilinear"), tf(interpolation="bicubic")
    picked = []
    for i in range(12):
        r = rand.decode(str(photo), 0, i)
        a, b = bil.decode(str(photo), 0, i), bic.decode(str(photo), 0, i)
        assert r.crop == a.crop == b.crop and torch.equal(r.image, rand.decode(str(photo), 0, i).image)
        assert torch.equal(r.image, a.image) or torch.equal(r.image, b.image)
        picked.append(torch.equal(r.image, b.image))
    assert 0 < sum(picked) < 12
    assert tf(train_interpolation="random").interpolation == "bilinear"  # evaluation's filter
