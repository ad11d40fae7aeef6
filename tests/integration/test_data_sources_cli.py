"""Through the CLI on digits: WebDataset shards served by a localhost HTTP server, by moto's S3 server and
through ``pipe:cat`` train the same run as the image folder they were converted from (the same
batches: the same accuracy to the last digit); Parquet with string labels trains in stream mode, and
its class map, kept in the run folder, is what ``vitscale eval`` and ``vitscale export`` use."""

from __future__ import annotations

import json

import pytest

from vitscale.cli import main

SHORT = ["train.max_steps=80", "train.epochs=0", "train.batch_size=32", "model.num_layers=1", "eval.every=0",
         "train.log_every=40", "log.progress=none", "log.report=false", "checkpoint.export_safetensors=false"]  # fmt: skip


def _train(out, *data, after=()) -> dict:
    assert main(["train", "digits_vit", *data, *SHORT, *after, f"train.output_dir={out}"]) == 0
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_shards_over_http_s3_and_pipe_train_as_the_image_folder(digits_data, http_serve, s3_server, tmp_path,
                                                                monkeypatch):  # fmt: skip
    endpoint, env = s3_server
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.mkdir("runs-data")
    fs.put(str(digits_data / "wds") + "/", "runs-data/wds/", recursive=True)
    folder = _train(tmp_path / "folder", "data.format=imagefolder", f"data.train_path={digits_data}/folder/train",
                    f"data.val_path={digits_data}/folder/val")  # fmt: skip
    assert folder["val_top1"] > 30  # learning (chance: 10%)
    base, wds = http_serve(digits_data / "wds"), digits_data / "wds"
    sources = {
        "http": (f"{base}/train/train-{{000000..000002}}.tar", f"{base}/val/val-000000.tar"),
        "s3": ("s3://runs-data/wds/train/", "s3://runs-data/wds/val/"),
        "pipe": (f"pipe:cat {wds}/train/train-{{000000..000002}}.tar", f"pipe:cat {wds}/val/val-000000.tar"),
    }
    for name, (train, val) in sources.items():
        got = _train(tmp_path / name, "data.format=webdataset", f"data.train_path={train}", f"data.val_path={val}",
                     f"data.shard_cache={tmp_path / 'cache' / name}")  # fmt: skip
        assert (got["val_top1"], got["val_loss"]) == (folder["val_top1"], folder["val_loss"]), name
        assert got["skipped_files"] == 0 and got["skipped_shards"] == []


def test_parquet_string_labels_train_streamed_and_eval_export_use_the_runs_class_map(digits_data, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from vitscale.data.digits import CLASS_NAMES

    # the digits (as vitscale data convert writes them: in a random order) with their class names as
    # string labels, images as {bytes, path} structs
    for split in ("train", "val"):
        t = pq.read_table(digits_data / f"shuffled/{split}/{split}-00000.parquet")
        words = pa.array([CLASS_NAMES[y] for y in t.column("label").to_pylist()])
        (tmp_path / split).mkdir()
        pq.write_table(pa.table({"image": t.column("image"), "label": words}), tmp_path / split / "d.parquet",
                       row_group_size=100)  # fmt: skip
    data = ["data.format=parquet", f"data.train_path={tmp_path}/train", f"data.val_path={tmp_path}/val",
            "data.shuffle_buffer=300"]  # fmt: skip
    run = tmp_path / "run"
    summary = _train(run, *data, after=["checkpoint.export_safetensors=true"])
    assert summary["val_top1"] > 30 and summary["skipped_files"] == 0
    names = sorted(CLASS_NAMES)  # strings are mapped to indices in sorted order
    assert (run / "classnames.txt").read_text().split() == names
    # vitscale eval reads the map from the run folder: the same numbers as at the end of training
    capsys.readouterr()
    assert main(["eval", str(run / "config.yaml"), f"checkpoint.path={run}"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["val_top1"] == pytest.approx(summary["val_top1"]) and result["val_loss"] == pytest.approx(summary["val_loss"])
    # export names the outputs from it (export.json's "labels")
    from vitscale.export.source import load_source
    from vitscale.export.spec import class_names

    assert class_names(load_source(run), 10) == names
