"""The input-pipeline benchmark runs end to end on a tiny setting (no timing is asserted)."""

import json

from PIL import Image

from vitscale.bench.data_pipeline import make_jpegs, run, write_results


def test_make_jpegs_are_natural_imagenet_sized(tmp_path):
    paths = make_jpegs(str(tmp_path), n=4, quality=90)
    sizes = [Image.open(p).size for p in paths]
    assert sizes.count((500, 375)) == 3 and sizes.count((375, 500)) == 1
    assert all(Image.open(p).format == "JPEG" for p in paths)


def test_benchmark_smoke(tmp_path):
    lines = []
    res = run(n_images=8, out=32, batch_size=4, rounds=1, log=lines.append)
    assert set(res["speedup_vs_torchvision"]) >= {"vitscale", "vitscale_full_decode", "vitscale_uint8"}
    for name, r in res["results"].items():
        assert r["images"] == 8 and r["img_per_s"] > 0, name
    js, log = write_results(res, lines, str(tmp_path))
    assert json.load(open(js))["out_size"] == 32 and "round 0 torchvision" in open(log).read()
