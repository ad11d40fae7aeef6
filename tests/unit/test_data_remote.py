"""Data where it lives (issue 21): WebDataset shards and Parquet files read from local disk, a localhost
HTTP server, moto's S3 server and ``pipe:`` commands give the image folder's batches; the stream keeps
its workers across epochs and resumes exactly; every bad input gets one line before work starts, or a
counted skip with the reason."""

from __future__ import annotations

import gc
import io
import json
import logging
import shutil
import tarfile

import pytest
import torch

from vitscale.data import build_loaders, data_config
from vitscale.data.loader import skip_summary
from vitscale.errors import CheckError

FAST = dict(remote_retries=1, remote_backoff_s=0.01, remote_timeout_s=1.0)


def _loaders(cfg, micro=64, workers=0, world=1, rank=0, drop_last=True):
    cfg.num_workers = workers
    return build_loaders(cfg, img_size=(8, 8), num_channels=1, seed=5, micro_batch_size=micro, eval_batch_size=100,
                         rank=rank, world_size=world, drop_last=drop_last)  # fmt: skip


def _cfg(fmt, train, val=None, **kw):
    return data_config(format=fmt, train_path=str(train), val_path=str(val) if val else None, num_workers=0,
                      rrc_scale=(0.5, 1.0), hflip=0.5, mean=(0.5,), std=(0.5,), **kw)  # fmt: skip


def _batches(loader, n=None):
    out = []
    for b in loader:
        out.append({k: b[k] for k in ("image", "label", "index", "crop", "flip")})
        if n is not None and len(out) == n:
            break
    return out


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for k in x:
            assert torch.equal(x[k], y[k]), k


def _png(v: int, fmt: str = "PNG") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (8, 8), v).save(buf, format=fmt)
    return buf.getvalue()


def _write_shard(path, samples):
    import webdataset as wds

    with wds.TarWriter(str(path)) as sink:
        for s in samples:
            sink.write(s)


# ---------------------------------------------------------------------------------- same batches
def test_shards_from_http_s3_and_pipe_give_the_image_folders_batches(digits_data, http_serve, s3_server, tmp_path,
                                                                     monkeypatch):  # fmt: skip
    endpoint, env = s3_server
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.mkdir("digits")
    fs.put(str(digits_data / "wds") + "/", "digits/wds/", recursive=True)
    ref = _loaders(_cfg("imagefolder", digits_data / "folder/train", digits_data / "folder/val"))
    want_train, want_val = _batches(ref.train, 4), _batches(ref.val)
    base = http_serve(digits_data / "wds")
    wds = digits_data / "wds"
    specs = {
        "local": (wds / "train", wds / "val"),
        "http": (f"{base}/train/train-{{000000..000002}}.tar", f"{base}/val/val-000000.tar"),
        "s3": ("s3://digits/wds/train/", "s3://digits/wds/val/*.tar"),
        "pipe": (f"pipe:cat {wds}/train/train-{{000000..000002}}.tar", f"pipe:cat {wds}/val/val-000000.tar"),
    }
    for name, (train, val) in specs.items():
        got = _loaders(_cfg("webdataset", train, val, shard_cache=str(tmp_path / name)))
        assert got.class_names == ref.class_names and got.num_classes == 10, name
        _same(_batches(got.train, 4), want_train)
        _same(_batches(got.val), want_val)
    # the Parquet files read by index: the same batches too
    pq = _loaders(_cfg("parquet", digits_data / "parquet/train", digits_data / "parquet/val", parquet_mode="index"))
    _same(_batches(pq.train, 4), want_train)
    _same(_batches(pq.val), want_val)


# ---------------------------------------------------------------------------------- the stream
def test_stream_over_http_every_sample_once_workers_kept_and_exact_resume(digits_data, http_serve):
    base = http_serve(digits_data / "wds")
    train = f"{base}/train/train-{{000000..000002}}.tar"
    cfg = _cfg("webdataset", train, webdataset_mode="stream", samples_per_epoch=2200, shuffle_buffer=50, **FAST)
    seen = []
    for rank in range(2):  # 2 ranks x 1 worker, the epoch longer than the data: every sample once
        seen += [i for b in _batches(_loaders(cfg, micro=50, world=2, rank=rank, drop_last=False).train)
                 for i in b["index"].tolist()]  # fmt: skip
    assert sorted(seen) == sorted((s << 32) | n for s in range(3) for n in range(500 if s < 2 else 497))

    cfg = _cfg("webdataset", train, webdataset_mode="stream", samples_per_epoch=640, shuffle_buffer=50, **FAST)
    a = _loaders(cfg, workers=2).train  # 10 batches an epoch from 2 worker processes
    epoch0 = _batches(a)
    pids = sorted(w.pid for w in a._live._workers)
    epoch1 = _batches(a)  # the same iterator ran on into epoch 1: the same worker processes
    assert len(epoch0) == len(epoch1) == 10 and sorted(w.pid for w in a._live._workers) == pids
    fresh = _loaders(cfg, workers=2).train
    fresh.set_epoch(1)
    _same(_batches(fresh), epoch1)  # batches of epoch 1 do not depend on how the iterator got there
    # stopped after 5 batches (an odd number: the next comes from the other worker) and resumed
    b = _loaders(cfg, workers=2).train
    head = _batches(b, 5)
    state = b.state_dict()
    assert state["epoch"] == 0 and state["batch_index"] == 5 and state["stream_layout"] == [1, 2]
    c = _loaders(cfg, workers=2).train
    c.load_state_dict(state)
    _same(head + _batches(c), epoch0)
    _same(_batches(c), epoch1)


def test_a_stream_retries_then_skips_and_names_shards_that_fail_mid_epoch(digits_data, http_serve, tmp_path, caplog):
    served = tmp_path / "served"
    served.mkdir()
    for name in ("train-000000", "forbidden-000001", "slow-000002"):
        shutil.copy(digits_data / f"wds/train/train-{name[-6:]}.tar", served / f"{name}.tar")
    data = (digits_data / "wds/train/train-000001.tar").read_bytes()
    (served / "cut-000004.tar").write_bytes(data[: len(data) // 3])  # a truncated tar
    base = http_serve(served)
    spec = f"{base}/{{train-000000,forbidden-000001,slow-000002,missing-000003,cut-000004}}.tar"
    (served / "classnames.txt").write_text((digits_data / "wds/train/classnames.txt").read_text())
    cfg = _cfg("webdataset", spec, webdataset_mode="stream", samples_per_epoch=2000, shuffle_buffer=0, **FAST)
    with caplog.at_level(logging.WARNING, logger="vitscale.data"):
        loader = _loaders(cfg, micro=50, drop_last=False).train  # the first shard opens: the run starts
        got = [i for b in _batches(loader) for i in b["index"].tolist()]
    assert {i >> 32 for i in got} <= {0, 2, 4} and sum(1 for i in got if i >> 32 == 0) == 500
    summary = skip_summary(loader.reporter)
    reasons = {s["url"].rsplit("/", 1)[1]: s["reason"] for s in summary["skipped_shards"]}
    assert set(reasons) == {"forbidden-000001.tar", "slow-000002.tar", "missing-000003.tar", "cut-000004.tar"}, reasons
    assert "403" in reasons["forbidden-000001.tar"] and "not found" in reasons["missing-000003.tar"]
    assert "ReadError" in reasons["cut-000004.tar"]  # its first samples were delivered, the rest skipped
    assert "Timeout" in reasons["slow-000002.tar"] or "timeout" in reasons["slow-000002.tar"].lower()
    text = caplog.text
    assert "retrying in" in text and all(f"skipped shard {base}/{n}" in text for n in reasons)


def test_bad_samples_of_a_stream_are_counted_with_the_reason(tmp_path, caplog):
    good = [{"__key__": f"k{n:02d}", "png": _png(n * 10), "cls": str(n % 3)} for n in range(12)]
    good[3]["cls"] = "7"  # outside the 3 classes
    del good[5]["cls"]  # no label
    good[8]["cls"] = "x"  # not a number
    (tmp_path / "s").mkdir()
    _write_shard(tmp_path / "s" / "a.tar", good)
    cfg = _cfg("webdataset", tmp_path / "s", webdataset_mode="stream", num_classes=3, samples_per_epoch=12,
               shuffle_buffer=0)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="vitscale.data"):
        loader = _loaders(cfg, micro=3, drop_last=False).train
        batches = list(loader)
    assert sorted(i & 0xFFFF for b in batches for i in b["index"].tolist()) == [0, 1, 2, 4, 6, 7, 9, 10, 11]
    assert sum(b["skipped"] for b in batches) == 3
    assert "k03 (label 7 outside [0, 3))" in caplog.text and "k05 (no .cls member)" in caplog.text
    assert "k08 (its .cls member is 'x', not a class index)" in caplog.text


# ---------------------------------------------------------------------------------- labels, members
def test_classification_from_json_labels_and_mixed_image_types(tmp_path):
    samples = []
    for n in range(12):
        fmt, ext = [("PNG", "png"), ("JPEG", "jpg"), ("WEBP", "webp")][n % 3]
        samples.append({"__key__": f"s{n:02d}", ext: _png(20 * n, fmt), "json": json.dumps({"meta": {"y": n % 4}})})
    (tmp_path / "s").mkdir()
    _write_shard(tmp_path / "s" / "a-0.tar", samples)
    L = _loaders(_cfg("webdataset", tmp_path / "s", label_key="json.meta.y"), micro=4)
    assert L.num_classes == 4
    labels = {int(i): int(y) for b in L.train for i, y in zip(b["index"], b["label"])}
    assert labels == {n: n % 4 for n in range(12)}  # every image type decoded, every label read


def _one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert len(text.strip().splitlines()) == 1, text
    return text


def test_index_mode_finds_bad_input_before_work_starts(tmp_path, digits_data, http_serve):
    def shard(name, samples, folder="x"):
        (tmp_path / folder).mkdir(exist_ok=True)
        _write_shard(tmp_path / folder / name, samples)
        return tmp_path / folder

    base = [{"__key__": f"k{n}", "png": _png(n), "cls": str(n % 2)} for n in range(6)]
    cases = {
        "no label": (shard("a.tar", base[:2] + [{"__key__": "bare", "png": _png(1)}] + base[3:], "nolabel"),
                     "sample bare in", "has no .cls member while others have one"),
        "huge label": (shard("a.tar", base[:5] + [{"__key__": "huge", "png": _png(1), "cls": "999999999"}], "huge"),
                       "labels reach 999999999 but only 3 distinct values occur", "set data.num_classes"),
        "negative": (shard("a.tar", base[:5] + [{"__key__": "neg", "png": _png(1), "cls": "-5"}], "neg"),
                     "label -5 is not a class index", ""),
    }
    for name, (path, *parts) in cases.items():
        with pytest.raises(CheckError) as e:
            _loaders(_cfg("webdataset", path))
        assert all(p in _one_line(e) for p in parts), (name, str(e.value))
    # with classnames.txt (2 names) a label 2 is outside the classes
    (cases["no label"][0] / "classnames.txt").write_text("a\nb\n")
    out = shard("a.tar", base[:5] + [{"__key__": "two", "png": _png(1), "cls": "2"}], "named")
    (out / "classnames.txt").write_text("a\nb\n")
    with pytest.raises(CheckError, match=r"label 2 is outside \[0, 2\)"):
        _loaders(_cfg("webdataset", out))
    # a cut shard, a shard that is not there (404), a server that refuses (403), nothing at all
    cut = tmp_path / "cut"
    cut.mkdir()
    data = (digits_data / "wds/train/train-000001.tar").read_bytes()
    (cut / "train-000001.tar").write_bytes(data[: len(data) // 2])
    shutil.copy(digits_data / "wds/train/train-000000.tar", cut)
    with pytest.raises(CheckError) as e:
        _loaders(_cfg("webdataset", cut))
    assert "shard " in _one_line(e) and "train-000001.tar cannot be read (ReadError" in str(e.value)
    url = http_serve(digits_data / "wds")
    with pytest.raises(CheckError) as e:
        _loaders(_cfg("webdataset", f"{url}/train/train-{{000000..000003}}.tar", shard_cache=str(tmp_path / "c"), **FAST))
    assert "train-000003.tar cannot be read (not found" in _one_line(e)
    with pytest.raises(CheckError) as e:
        _loaders(_cfg("webdataset", f"{url}/forbidden/train-000000.tar", **FAST))
    assert _one_line(e).endswith("cannot be read: HTTP 403 Forbidden")
    (tmp_path / "empty").mkdir()
    for spec in (tmp_path / "empty", f"{tmp_path}/x/nothing-*.tar"):
        with pytest.raises(CheckError, match="expands to no .tar files"):
            _loaders(_cfg("webdataset", spec))
    with pytest.raises(CheckError) as e:  # gcsfs is not installed here
        _loaders(_cfg("webdataset", "gs://bucket/train-{000000..000009}.tar"))
    assert "reading gs:// needs the gcsfs package: pip install 'vitscale[gcs]'" in _one_line(e)


# ---------------------------------------------------------------------------------- Parquet
def _table(rows, image_type="struct"):
    import pyarrow as pa

    if image_type == "struct":  # as the datasets library writes an Image feature
        t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        images = pa.array([{"bytes": b, "path": f"{i}.png"} for i, (b, _) in enumerate(rows)], type=t)
    else:
        images = pa.array([b for b, _ in rows], type=pa.binary())
    return pa.table({"image": images, "label": [y for _, y in rows]})


def test_parquet_struct_images_string_labels_and_bad_files(tmp_path):
    import pyarrow.parquet as pq

    words = ["cat", "dog", "ant"]
    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    pq.write_table(_table([(_png(10 * n), words[n % 3]) for n in range(30)]), tmp_path / "train/a.parquet", row_group_size=8)
    pq.write_table(_table([(_png(5 * n), words[n % 3]) for n in range(9)], "binary"), tmp_path / "val/b.parquet")
    L = _loaders(_cfg("parquet", tmp_path / "train", tmp_path / "val", shuffle_buffer=4), micro=5)
    assert L.class_names == ["ant", "cat", "dog"]  # string labels: sorted names, then indices
    labels = {int(k.split("#")[1]): int(y) for b in L.train for k, y in zip(b["key"], b["label"])}  # key: file#row
    assert len(labels) == 30 and all(y == ["ant", "cat", "dog"].index(words[r % 3]) for r, y in labels.items())
    val = list(L.val)
    assert torch.cat([b["label"] for b in val]).tolist() == [["ant", "cat", "dog"].index(words[n % 3]) for n in range(9)]
    # row groups are the stream's units: resumed after 3 batches, the same batches as without a stop
    cfg = _cfg("parquet", tmp_path / "train", shuffle_buffer=4)
    full = _batches(_loaders(cfg, micro=5, workers=2).train)
    a = _loaders(cfg, micro=5, workers=2).train
    head = _batches(a, 3)
    b = _loaders(cfg, micro=5, workers=2).train
    b.load_state_dict(a.state_dict())
    _same(head + _batches(b), full)
    del a, b
    gc.collect()  # these streams' workers run on through the epochs: end them here, not in a later test's GC pass

    pq.write_table(_table([(_png(1), "cat"), (_png(2), "zebra")]), tmp_path / "val/b.parquet")
    with pytest.raises(CheckError) as e:
        _loaders(_cfg("parquet", tmp_path / "train", tmp_path / "val"), micro=5)
    assert "label 'zebra' is not one of the 3 training classes" in _one_line(e)
    (tmp_path / "bad").mkdir()
    data = (tmp_path / "train/a.parquet").read_bytes()
    (tmp_path / "bad/a.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckError) as e:
        _loaders(_cfg("parquet", tmp_path / "bad"))
    assert "a.parquet cannot be read as Parquet" in _one_line(e)
    with pytest.raises(CheckError) as e:
        _loaders(_cfg("parquet", tmp_path / "train", label_column="class"))
    assert "has no column 'class' (data.label_column); its columns: image, label" in _one_line(e)
    with pytest.raises(CheckError) as e:
        _loaders(_cfg("parquet", tmp_path / "train", image_column="img"))
    assert "has no column 'img' (data.image_column)" in _one_line(e)


def test_hf_urls_offline_read_the_local_hub_cache_only(tmp_path, digits_data, monkeypatch):
    """``hf://datasets/...`` with HF_HUB_OFFLINE: the cached snapshot, never the network, and one line when
    it is not cached. (huggingface_hub reads HF_HUB_OFFLINE / HF_HUB_CACHE when imported: set here as
    it would have read them.)"""
    from huggingface_hub import constants

    from vitscale.config import load_config
    from vitscale.data.inspect import inspect_data

    cache = tmp_path / "hub"
    repo = cache / "datasets--someone--digits"
    (repo / "snapshots" / ("a" * 40) / "data").mkdir(parents=True)
    shutil.copy(digits_data / "parquet/val/val-00000.parquet", repo / "snapshots" / ("a" * 40) / "data")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))

    def cfg(url):
        return load_config(None, ["data.format=parquet", f"data.train_path={url}"]).data

    report = inspect_data(cfg("hf://datasets/someone/digits/data/*.parquet"), samples=8)
    assert report["samples"] == 300 and report["classes"] == 10 and report["decode"]["images"] == 8
    with pytest.raises(CheckError) as e:
        inspect_data(cfg("hf://datasets/someone/other/data/*.parquet"))
    assert "HF_HUB_OFFLINE is set and someone/other is not in the local Hub cache" in _one_line(e)


def test_convert_and_inspect_round_trip(digits_data, tmp_path):
    from vitscale.cli import main

    # Parquet -> shards: the same samples, labels and classes in the same order
    assert main(["data", "convert", str(digits_data / "parquet/val"), str(tmp_path / "w"), "--to", "webdataset",
                 "--no-shuffle"]) == 0  # fmt: skip
    a = _loaders(_cfg("webdataset", tmp_path / "w", tmp_path / "w"))
    b = _loaders(_cfg("imagefolder", digits_data / "folder/val", digits_data / "folder/val"))
    b_val = list(b.val)
    _same(_batches(a.val), _batches(b_val))
    assert a.class_names == b.class_names
    with tarfile.open(tmp_path / "w" / "val-000000.tar") as tf:
        assert set(tf.getnames()[:2]) == {"00000000.png", "00000000.cls"}
    # by default the order is shuffled (keyed): the same samples, another order
    s = _loaders(_cfg("parquet", digits_data / "shuffled/val", digits_data / "shuffled/val"))
    shuffled, ordered = torch.cat([b["label"] for b in s.val]), torch.cat([b["label"] for b in b_val])
    assert shuffled.bincount().tolist() == ordered.bincount().tolist() and not torch.equal(shuffled, ordered)


def test_token_labels_of_shards_are_found_by_sample_key_when_streamed(digits_data, tmp_path):
    """label-tokens writes each row's sample key (index mode); a run streaming the shards, in another
    order, finds every sample's row by its key."""
    from vitscale.data.token_labels import TokenLabelStore, TokenLabelWriter

    indexed = _loaders(_cfg("webdataset", digits_data / "wds/train"), micro=100, drop_last=False)
    keys = indexed.train.dataset.source.keys
    n = len(keys)
    writer = TokenLabelWriter(tmp_path / "tl", "train", n, (2, 2), 1, 10, keys=keys)
    rows = torch.arange(n)
    probs = torch.nn.functional.one_hot(rows % 10, 10).float().view(n, 1, 1, 10).expand(n, 2, 2, 10)  # by row
    writer.write(rows, probs, probs[:, 0, 0])
    writer.close()
    store = TokenLabelStore(tmp_path / "tl")
    stream = _loaders(_cfg("webdataset", digits_data / "wds/train", webdataset_mode="stream", samples_per_epoch=300),
                      micro=50).train  # fmt: skip
    for b in stream:
        found = store.rows(b["index"], b["key"])
        assert [keys[r] for r in found.tolist()] == b["key"]  # not the stream's index: the sample's own row
        assert torch.equal(store.topk_maps(found)[1][:, 0, 0, 0], found % 10)  # that row's labels
