"""The digits figures the README, the docs, the configs' headers and `vitscale demo --help` quote are
the committed five-seed measurement (benchmarks/results/varres_seeds_cpu_202611.json, made by
benchmarks/varres_seeds.py): the mean ± standard deviation of val top-1 over seeds 0-4, one figure per
recipe, the same everywhere, and the README's commands are the ones that measurement ran."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "varres_seeds_cpu_202611.json"
# where each recipe's figure is quoted
QUOTED = {
    "fixed": ("README.md", "docs/training.md", "docs/using.md", "docs/models.md", "vitscale/configs/digits_vit.yaml",
              "vitscale/commands/demo.py"),
    "progressive": ("README.md", "docs/training.md", "docs/models.md", "vitscale/configs/digits_vit.yaml"),
    "multi": ("docs/models.md",),
    "naflex": ("README.md", "docs/training.md", "docs/models.md", "vitscale/configs/digits_naflex.yaml"),
}  # fmt: skip
FILES = sorted({f for files in QUOTED.values() for f in files} | {"docs/volo.md"})
SPREAD = re.compile(r"(\d+\.\d\d) ± (\d+\.\d\d)%")


@pytest.fixture(scope="module")
def measured() -> dict[str, str]:
    data = json.loads(RESULTS.read_text())
    out = {}
    for recipe in QUOTED:
        top1 = [r["val_top1"] for r in data["runs"][recipe]]
        assert sorted(r["seed"] for r in data["runs"][recipe]) == [0, 1, 2, 3, 4], recipe
        out[recipe] = f"{statistics.mean(top1):.2f} ± {statistics.stdev(top1):.2f}%"
    return out


def test_each_recipe_is_quoted_as_its_five_seed_mean_and_spread(measured):
    assert measured["fixed"] == "97.67 ± 0.41%"  # what the prose around the figures reads
    for recipe, files in QUOTED.items():
        for f in files:
            assert measured[recipe] in (ROOT / f).read_text(encoding="utf-8"), (recipe, f)


def test_no_other_spread_is_quoted(measured):
    """Every "mean ± std%" in these files is one of the measured figures (none left from an older run)."""
    allowed = set(measured.values())
    for f in FILES:
        found = {f"{m} ± {s}%" for m, s in SPREAD.findall((ROOT / f).read_text(encoding="utf-8"))}
        assert found <= allowed, (f, found - allowed)


def test_readme_commands_are_the_measured_ones():
    """The README's demo, multi-resolution and NaFlex lines run what the measurement ran (less its seed)."""
    commands = json.loads(RESULTS.read_text())["commands"]
    lines = [line.split("#")[0].strip() for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()]
    for recipe in ("fixed", "progressive", "naflex"):
        command = commands[recipe].removesuffix(" train.seed=SEED")
        assert any(line.startswith(command) for line in lines), command
    multires = [line for line in lines if "data.image_sizes=" in line and line.startswith("vitscale train digits_vit")]
    assert multires and all("data.size_schedule=progressive" in line for line in multires), multires
