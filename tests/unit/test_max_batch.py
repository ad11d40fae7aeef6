"""The largest-batch search of ``benchmarks/max_batch.py`` (doubling, then bisection), the script on
CPU at debug size, and its result read into ``vitscale memory --table`` beside the estimate."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from vitscale.cli import main as cli
from vitscale.tools.memory import estimate, largest_batch

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("max_batch", ROOT / "benchmarks" / "max_batch.py")
max_batch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(max_batch)


def test_search_doubles_then_bisects_to_the_multiple():
    calls = []

    def fits(b):
        calls.append(b)
        return b <= 100

    largest, tried, at_limit = max_batch.search(fits, start=8, limit=4096, multiple=8)
    assert (largest, at_limit) == (96, False)
    assert calls == [8, 16, 32, 64, 128, 96, 112, 104] and tried[96] and not tried[104]
    assert max_batch.search(lambda b: b <= 3, start=8, multiple=1)[0] == 3  # the start itself fails
    assert max_batch.search(lambda b: False, start=8, multiple=8)[:2] == (0, {8: False})
    assert max_batch.search(lambda b: True, start=8, limit=40)[0::2] == (32, True)


def test_estimate_of_the_largest_batch_fits_and_one_more_does_not():
    for ac in ("none", "full"):
        n = largest_batch("vit_l16", 79.6, ac)
        assert estimate("vit_l16", micro_batch=n, ac=ac).total_gib <= 79.6 < estimate("vit_l16", micro_batch=n + 1, ac=ac).total_gib


@pytest.mark.slow
def test_script_on_cpu_and_the_measured_column(tmp_path, capsys):
    out = tmp_path / "max_batch_cpu_202611.json"
    assert max_batch.main(["--models", "vit_debug", "--ac", "none", "full", "--device", "cpu", "--start", "2",
                           "--limit", "4", "--json", str(out)]) == 0  # fmt: skip
    res = json.loads(out.read_text())
    assert [(r["model"], r["ac"], r["max_batch"], r["reached_limit"]) for r in res["results"]] == [
        ("vit_debug", "none", 4, True), ("vit_debug", "full", 4, True)]  # no out-of-memory on a CPU: the limit
    capsys.readouterr()
    assert cli(["memory", "--table", "vit_debug", "vit_b16", "--measured", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith("| vit_debug |"))
    assert row.endswith(f" | {largest_batch('vit_debug')} / >= 4 |"), row
    assert next(line for line in table.splitlines() if line.startswith("| vit_b16 |")).endswith(" / unmeasured |")
    assert "measured: max_batch_cpu_202611.json" in table
    assert cli(["memory", "--table", "vit_debug", "--measured", str(tmp_path / "none")]) == 0
    assert capsys.readouterr().out.splitlines()[2].endswith(" / unmeasured |")
