"""Image folders: odd image modes are converted, undecodable files are skipped, counted and warned about."""

import io
import logging
import os

import numpy as np
import pytest
import torch
from PIL import Image

from vitscale.data import build_loaders, data_config
from vitscale.data.decode import BadImageError, convert_mode, decode_resized_crop, draft_factor, open_image


def _odd_images():
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (20, 24), dtype=np.uint8)
    pal = Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    pal_t = pal.copy()
    pal_t.info["transparency"] = 0
    return {
        "cmyk.jpg": Image.fromarray(rgb).convert("CMYK"),
        "i16.png": Image.fromarray(gray.astype(np.uint16) * 257),  # 16-bit PNG
        "i32.tif": Image.fromarray(gray.astype(np.int32) * 200, mode="I"),
        "pal.png": pal,
        "pal_transparent.png": pal_t,
        "rgba.png": Image.fromarray(np.dstack([rgb, gray])),
        "la.png": Image.fromarray(np.dstack([gray, gray])).convert("LA"),
        "gray.png": Image.fromarray(gray),
        "bilevel.png": Image.fromarray(gray).convert("1"),
        "rgb.jpg": Image.fromarray(rgb),
    }


@pytest.mark.parametrize("name", list(_odd_images()))
def test_odd_modes_convert_to_rgb(tmp_path, name, monkeypatch):
    img = _odd_images()[name]
    path = tmp_path / name
    img.save(path)
    src = Image.open(path)
    src.load()
    rgb = convert_mode(src, 3)
    assert rgb.mode == "RGB" and rgb.size == (24, 20)
    assert convert_mode(Image.open(path), 1).mode == "L"
    from vitscale.data import decode

    for fast, sj in ((True, True), (True, False), (False, False)):
        monkeypatch.setattr(decode, "USE_SIMPLEJPEG", sj)
        out, box, (h, w) = decode_resized_crop(str(path), lambda h, w: (0, 0, h, w), (16, 16), fast=fast)
        assert out.dtype == torch.uint8 and out.shape == (3, 16, 16) and (h, w) == (20, 24)
        assert out.float().std() > 0  # real content survived the conversion (not a blank image)
        gray, _, _ = decode_resized_crop(str(path), lambda h, w: (0, 0, h, w), (16, 16), num_channels=1, fast=fast)
        assert gray.shape == (1, 16, 16)


def test_16bit_scaled_not_clipped(tmp_path):
    gray = np.full((8, 8), 40000, dtype=np.uint16)  # 40000 / 65535 * 255 = 155.6
    Image.fromarray(gray).save(tmp_path / "a.png")
    img = Image.open(tmp_path / "a.png")
    img.load()
    assert np.asarray(convert_mode(img, 3))[0, 0].tolist() == [156, 156, 156]


def test_transparent_palette_and_alpha_composite_on_white(tmp_path):
    rgba = np.zeros((4, 4, 4), dtype=np.uint8)  # fully transparent black
    Image.fromarray(rgba).save(tmp_path / "t.png")
    img = Image.open(tmp_path / "t.png")
    img.load()
    assert np.asarray(convert_mode(img, 3)).min() == 255


def _make_folder(root, n_per_class=6, size=(40, 52)):
    rng = np.random.default_rng(1)
    for c in ("cat", "dog"):
        os.makedirs(root / c)
        for i in range(n_per_class):
            Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(root / c / f"{i}.jpg", quality=90)
    (root / "cat" / "notes.txt").write_text("ignored: not an image extension")


def _add_bad_files(root):
    (root / "cat" / "empty.jpg").write_bytes(b"")
    (root / "dog" / "not_an_image.png").write_text("this is text, not a PNG")
    data = (root / "cat" / "0.jpg").read_bytes()
    (root / "dog" / "truncated.jpg").write_bytes(data[: len(data) // 2])
    return [str(root / "cat" / "empty.jpg"), str(root / "dog" / "not_an_image.png"), str(root / "dog" / "truncated.jpg")]


def test_each_kind_of_bad_file_raises_bad_image(tmp_path):
    _make_folder(tmp_path)
    for path in _add_bad_files(tmp_path):
        with pytest.raises(BadImageError):
            decode_resized_crop(path, lambda h, w: (0, 0, h, w), (16, 16))


@pytest.mark.parametrize("workers", [0, 2])
def test_bad_files_skipped_counted_once_and_warned(tmp_path, caplog, workers):
    _make_folder(tmp_path)
    bad = _add_bad_files(tmp_path)
    cfg = data_config(format="imagefolder", train_path=str(tmp_path), num_workers=workers, hflip=0.5)
    L = build_loaders(cfg, img_size=(16, 16), num_channels=3, seed=0, micro_batch_size=5, eval_batch_size=5)
    assert L.class_names == ["cat", "dog"] and L.num_classes == 2 and L.val is None
    assert len(L.train) == 15 // 5
    skipped, seen = 0, []
    with caplog.at_level(logging.WARNING, logger="vitscale.data"):
        for _ in range(2):  # two epochs: each bad file is still counted and warned about once
            for b in L.train:
                skipped += b["skipped"]
                seen += b["index"].tolist()
                assert b["image"].shape == (5, 3, 16, 16) and torch.isfinite(b["image"]).all()
    assert skipped == 3
    lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(lines) == 3
    for path in bad:
        assert sum(path in line for line in lines) == 1
    bad_idx = {L.train.dataset.source.paths.index(p) for p in bad}
    assert not bad_idx & set(seen)  # replaced samples carry the replacement's index
    state = L.train.state_dict()
    assert sorted(state["skipped_paths"]) == sorted(bad)
    # a resumed run does not report / count the same files again
    R = build_loaders(cfg, img_size=(16, 16), num_channels=3, seed=0, micro_batch_size=5, eval_batch_size=5)
    R.train.load_state_dict(state)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitscale.data"):
        assert sum(b["skipped"] for b in R.train) == 0
    assert not [r for r in caplog.records if "skipped" in r.getMessage()]


def test_validation_leaves_bad_files_out_and_counts_them(tmp_path, caplog):
    _make_folder(tmp_path / "train")
    _make_folder(tmp_path / "val", n_per_class=3)
    bad = _add_bad_files(tmp_path / "val")
    cfg = data_config(format="imagefolder", train_path=str(tmp_path / "train"), val_path=str(tmp_path / "val"),
                     num_workers=0)  # fmt: skip
    L = build_loaders(cfg, img_size=(16, 16), num_channels=3, seed=0, micro_batch_size=4, eval_batch_size=4)
    with caplog.at_level(logging.WARNING, logger="vitscale.data"):
        batches = list(L.val)
    index = torch.cat([b["index"] for b in batches]).tolist()
    real = [i for i in index if i >= 0]
    paths = L.val.dataset.source.paths
    # every good image once, no bad one, none twice: a bad file is a padding row (index -1), not a neighbour
    assert sorted(real) == sorted(i for i, p in enumerate(paths) if p not in bad) and len(index) == len(paths)
    assert sum(b["skipped"] for b in batches) == len(bad) == 3
    assert sum(r.getMessage().endswith("; left out") for r in caplog.records) == 3
    assert L.skips() == {"skipped_files": 3, "skipped_shards": []}  # what summary.json gets


def test_replacement_is_deterministic(tmp_path):
    _make_folder(tmp_path)
    _add_bad_files(tmp_path)
    cfg = data_config(format="imagefolder", train_path=str(tmp_path), num_workers=0)
    runs = [list(build_loaders(cfg, img_size=(16, 16), num_channels=3, seed=0, micro_batch_size=5,
                               eval_batch_size=5).train) for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["image"], b["image"])


def test_imagefolder_val_path_and_split(tmp_path):
    _make_folder(tmp_path / "train")
    _make_folder(tmp_path / "val", n_per_class=2)
    cfg = data_config(format="imagefolder", train_path=str(tmp_path / "train"), val_path=str(tmp_path / "val"),
                     num_workers=0, crop_pct=0.875)
    L = build_loaders(cfg, img_size=(16, 16), num_channels=3, seed=0, micro_batch_size=4, eval_batch_size=3)
    v = list(L.val)
    assert [b["image"].shape[0] for b in v] == [3, 1]
    assert torch.cat([b["label"] for b in v]).tolist() == [0, 0, 1, 1]
    assert torch.equal(list(L.val)[0]["image"], v[0]["image"])  # eval is deterministic
    split = data_config(format="imagefolder", train_path=str(tmp_path / "train"), val_split=0.5, num_workers=0)
    S = build_loaders(split, img_size=(16, 16), num_channels=3, seed=0, micro_batch_size=2, eval_batch_size=8)
    val_paths = set(S.val.dataset.source.paths)
    assert len(val_paths) == 6 and not val_paths & set(S.train.dataset.source.paths)
    assert torch.cat([b["label"] for b in S.val]).bincount().tolist() == [3, 3]


@pytest.mark.parametrize("simplejpeg", [True, False])
def test_fast_decode_uses_reduced_jpeg_and_matches_full_decode(tmp_path, monkeypatch, simplejpeg):
    from vitscale.data import decode

    monkeypatch.setattr(decode, "USE_SIMPLEJPEG", simplejpeg)
    # a smooth natural-like image: reduced-DCT decoding + resize ~ full decode + resize
    y, x = np.mgrid[0:480, 0:640]
    arr = np.dstack([(x / 640 * 255), (y / 480 * 255), ((x + y) / 1120 * 255)]).astype(np.uint8)
    path = str(tmp_path / "big.jpg")
    Image.fromarray(arr).save(path, quality=90)
    assert draft_factor(480, 640, 112, 112) == 4 and draft_factor(200, 640, 112, 112) == 1
    assert draft_factor(240, 300, 112, 112) == 2
    box = lambda h, w: (10, 20, 460, 600)  # noqa: E731
    fast, b1, _ = decode_resized_crop(path, box, (112, 112), fast=True)
    full, b2, _ = decode_resized_crop(path, box, (112, 112), fast=False)
    assert b1 == b2
    assert fast.shape == full.shape == (3, 112, 112)
    t, scale, hw = decode.decode_reduced(path, lambda h, w: 4)  # the DCT reduction asked for, by either decoder
    arr = np.ascontiguousarray(t.permute(1, 2, 0).numpy())
    assert scale == 4.0 and arr.shape == (120, 160, 3) and hw == (480, 640)
    assert (fast.float() - full.float()).abs().mean() < 2.0
    img = open_image(path)
    from vitscale.data.decode import apply_draft
    assert apply_draft(img, 4) == 4.0 and img.size == (160, 120)
    png = io.BytesIO()
    Image.fromarray(arr).save(png, format="PNG")
    (tmp_path / "big.png").write_bytes(png.getvalue())
    assert apply_draft(open_image(str(tmp_path / "big.png")), 4) == 1.0  # only JPEGs are drafted


def test_fast_and_full_decode_same_keyed_boxes(tmp_path):
    _make_folder(tmp_path, size=(300, 400))
    kw = dict(img_size=(32, 32), num_channels=3, seed=0, micro_batch_size=4, eval_batch_size=4)
    a = next(iter(build_loaders(data_config(format="imagefolder", train_path=str(tmp_path), num_workers=0,
                                           fast_decode=True), **kw).train))
    b = next(iter(build_loaders(data_config(format="imagefolder", train_path=str(tmp_path), num_workers=0,
                                           fast_decode=False), **kw).train))
    for k in ("index", "crop", "flip", "label"):
        assert torch.equal(a[k], b[k])
