"""CLIP data: WebDataset shards and CSV/TSV pairs through the keyed loader, bad samples, resume."""

from __future__ import annotations

import io
import os

import pytest
import torch
from PIL import Image

import vitscale
from vitscale.data import build_loaders, data_config


def _png(value: int, size: int = 12) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), (value, 255 - value, value // 2)).save(buf, format="PNG")
    return buf.getvalue()


def _write_shards(folder, n=20, per_shard=8, bad=()):
    import webdataset as wds

    os.makedirs(folder, exist_ok=True)
    captions = {}
    with wds.ShardWriter(os.path.join(folder, "s-%04d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(n):
            cap = f"picture number {i} of a small square"
            sample = {"__key__": f"k{i:04d}", "png": _png(i * 10), "txt": cap, "cls": str(i % 3)}
            if i in bad:  # 3 kinds of bad samples: corrupt image, empty caption, no caption
                kind = bad[i]
                if kind == "corrupt":
                    sample["png"] = b"not an image"
                elif kind == "empty":
                    sample["txt"] = "   "
                else:
                    del sample["txt"]
            captions[i] = sample.get("txt")
            sink.write(sample)
    return captions


def _cfg(**kw):
    base = dict(num_workers=0, caption_context_length=77, rrc_scale=(0.5, 1.0))
    base.update(kw)
    return data_config(**base)


def _loaders(cfg, micro=4, rank=0, world=1):
    tokenize = vitscale.create_tokenizer("clip", cfg.caption_context_length)  # as the run assembly hands it over
    return build_loaders(cfg, img_size=(16, 16), num_channels=3, seed=0, micro_batch_size=micro,
                         eval_batch_size=5, rank=rank, world_size=world, tokenize=tokenize)  # fmt: skip


def test_webdataset_batches_carry_caption_tokens_and_skip_bad(tmp_path):
    bad = {3: "corrupt", 7: "empty", 12: "missing"}
    caps = _write_shards(tmp_path / "train", bad=bad)
    _write_shards(tmp_path / "val", n=10)
    (tmp_path / "classnames.txt").write_text("a\nb\nc\n")
    cfg = _cfg(format="webdataset", train_path=str(tmp_path / "train"), val_path=str(tmp_path / "val"))
    L = _loaders(cfg)
    assert len(L.train) == 5 and L.num_classes == 3 and L.class_names == ["a", "b", "c"]
    tok = vitscale.create_tokenizer("clip")
    seen, skipped = [], 0
    for batch in L.train:
        assert batch["image"].shape == (4, 3, 16, 16) and batch["text"].shape == (4, 77)
        for t, i, y in zip(batch["text"], batch["index"].tolist(), batch["label"].tolist()):
            assert i not in bad  # bad samples are replaced by good ones
            assert torch.equal(t, tok(caps[i])[0]) and y == i % 3
            seen.append(i)
        skipped += batch["skipped"]
    assert skipped == 3  # each bad sample counted once
    val = [b for b in L.val]
    assert sum(b["image"].shape[0] for b in val) == 10 and all("text" in b for b in val)


def test_webdataset_resume_and_rank_split(tmp_path):
    _write_shards(tmp_path / "train", n=24)
    cfg = _cfg(format="webdataset", train_path=str(tmp_path / "train" / "s-{0000..0002}.tar"))
    L = _loaders(cfg)
    it = iter(L.train)
    next(it)
    state = L.train.state_dict()
    expected = next(it)
    L2 = _loaders(cfg)
    L2.train.load_state_dict(state)
    got = next(iter(L2.train))
    assert torch.equal(got["text"], expected["text"]) and torch.equal(got["image"], expected["image"])
    # two ranks together see exactly the one-process samples of a step
    one = next(iter(_loaders(cfg, micro=4).train))["index"].tolist()
    two = [next(iter(_loaders(cfg, micro=2, rank=r, world=2).train))["index"].tolist() for r in range(2)]
    assert sorted(one) == sorted(two[0] + two[1])


def test_csv_pairs(tmp_path):
    rows = ["filepath\ttitle\tlabel"]
    for i in range(6):
        (tmp_path / f"im{i}.png").write_bytes(_png(i * 40))
        rows.append(f"im{i}.png\ta caption for image {i}\t{i % 2}")
    rows.append("missing.png\tan image that is not there\t0")
    rows.append("im0.png\t\t1")  # empty caption
    (tmp_path / "pairs.tsv").write_text("\n".join(rows) + "\n")
    cfg = _cfg(format="csv", train_path=str(tmp_path / "pairs.tsv"), val_path=str(tmp_path / "pairs.tsv"),
               csv_label_key="label")  # fmt: skip
    L = _loaders(cfg, micro=2)
    tok = vitscale.create_tokenizer("clip")
    total_skipped = 0
    for batch in L.train:
        for t, i in zip(batch["text"], batch["index"].tolist()):
            assert i < 6 and torch.equal(t, tok(f"a caption for image {i}")[0])
        total_skipped += batch["skipped"]
    assert total_skipped == 2
    with pytest.raises(KeyError):
        _loaders(_cfg(format="csv", train_path=str(tmp_path / "pairs.tsv"), csv_caption_key="caption"))


def test_digits_captions_writes_shards(tmp_path):
    from vitscale.data.captions import write_digits_captions

    counts = write_digits_captions(str(tmp_path), size=8, shard_size=1000)
    assert counts == {"train": 1497, "val": 300}
    cfg = _cfg(format="webdataset", train_path=str(tmp_path / "train"), val_path=str(tmp_path / "val"))
    L = _loaders(cfg, micro=16)
    assert L.num_classes == 10 and L.class_names[7] == "seven"
    batch = next(iter(L.train))
    tok = vitscale.create_tokenizer("clip")
    texts = [tok.decode(t[1 : int(t.argmax())]) for t in batch["text"]]
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    assert all(words[y] in s for s, y in zip(texts, batch["label"].tolist()))
    assert (
        len(set(s.replace(words[y], "{}") for s, y in zip(texts, batch["label"].tolist()))) > 1
    )  # several templates
