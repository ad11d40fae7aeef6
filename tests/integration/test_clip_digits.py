"""CLIP end to end through the CLI: captioned digit shards -> `vitscale train` -> `vitscale eval`."""

from __future__ import annotations

import json

from vitscale.cli import main


def test_clip_train_and_eval_on_digit_shards(tmp_path):
    shards = tmp_path / "wds"
    assert main(["data", "digits-captions", str(shards), "--size", "16"]) == 0
    out = tmp_path / "run"
    common = [
        "data.format=webdataset", f"data.train_path={shards}/train", f"data.val_path={shards}/val",
        "data.caption_context_length=77",  # cut to the model's 16 tokens by the task
    ]  # fmt: skip
    rc = main(["train", "digits_clip", *common, f"train.output_dir={out}", "train.max_steps=3", "train.epochs=0",
               "train.batch_size=32", "eval.every=0", "checkpoint.every=0", "log.progress=none"])  # fmt: skip
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("zeroshot_top1", "zeroshot_top5", "text_retrieval_recall@1", "image_retrieval_recall@10"):
        assert 0.0 <= summary[key] <= 100.0, key  # percent, as every accuracy
    assert summary["zeroshot_top5"] >= summary["zeroshot_top1"]
    assert summary["skipped_files"] == 0
    # the run's report draws CLIP's evaluation: zero-shot accuracy and retrieval recall
    report = (out / "report.html").read_text()
    assert 'id="plot-zeroshot"' in report and 'id="plot-retrieval"' in report
    assert f"{summary['zeroshot_top1']:.2f}%" in report  # percent in the files and here
    # `vitscale eval` on the exported weights gives the same zero-shot numbers
    res_file = tmp_path / "eval.json"
    rc = main(
        [
            "eval",
            "digits_clip",
            *common,
            f"checkpoint.path={out}/model.safetensors",
            "--output",
            str(res_file),
        ]
    )
    assert rc == 0
    res = json.loads(res_file.read_text())
    assert abs(res["zeroshot_top1"] - summary["zeroshot_top1"]) < 1e-6
    assert abs(res["text_retrieval_recall@1"] - summary["text_retrieval_recall@1"]) < 1e-6
