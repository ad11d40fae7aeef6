"""``vitscale models`` prints declared facts (vitscale/models/zoo.json) without importing torch or a
model family: the file is what the models give, its parameter counts are those of the real models,
and a plug-in's family, which the file does not list, is measured (issue 49, the README walk: 15 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vitscale.cli import main

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def _zoo() -> dict[str, list[dict]]:
    return json.loads((ROOT / "vitscale/models/zoo.json").read_text())["families"]


def test_every_row_is_of_the_variant_config_of_today():
    """Each built-in family's variants, in order, each row of the config the code declares now (a
    changed variant: run python scripts/make_zoo.py)."""
    from vitscale.commands.models import config_digest
    from vitscale.registry import FAMILIES

    zoo = _zoo()
    assert list(zoo) == list(FAMILIES.builtin)
    for fam, rows in zoo.items():
        spec = FAMILIES.get(fam)
        assert [r["name"] for r in rows] == list(spec.variants), fam
        for r in rows:
            cfg = spec.variants[r["name"]]
            assert r["config"] == config_digest(cfg), f"{r['name']} changed: run python scripts/make_zoo.py"
            assert (r["family"], r["img_size"], r["patch"]) == (fam, cfg.img_h, cfg.patch_dim)


@pytest.mark.slow
def test_the_zoo_file_is_what_the_models_give():
    """Every built-in variant built on the meta device again: the file is unchanged (its parameters and
    FLOPs are what the models and their families count today)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import make_zoo
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert make_zoo.ZOO.read_text() == make_zoo.render(), "vitscale/models/zoo.json is out of date: run python scripts/make_zoo.py"


@pytest.mark.parametrize("name", ["vit_debug", "clip_debug", "volo_debug", "naflex_debug"])
def test_printed_parameter_counts_are_the_real_models(name, capsys):
    import vitscale

    capsys.readouterr()
    assert main(["models", "--json", name]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    model = vitscale.create_model(name)  # on the CPU, initialised
    assert round(row["params_m"] * 1e6) == sum(p.numel() for p in model.parameters())
    assert main(["models", name]) == 0
    assert f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}" in capsys.readouterr().out.splitlines()[1].split()


def test_the_table_imports_neither_torch_nor_a_mock():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from vitscale.cli import main; rc = main(['models']); "
            "print('LOADED', sorted(m for m in ('torch', 'unittest.mock', 'vitscale.models') if m in sys.modules)); sys.exit(rc)")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "LOADED []", lines[-1]
    assert len(lines) == 2 + sum(len(f) for f in _zoo().values())


def test_a_plugin_family_and_a_changed_variant_are_measured(capsys, monkeypatch):
    """tests/toy_family, loaded with --import, is not in zoo.json: its row is measured on the meta
    device; so is a built-in variant whose config a plug-in changed."""
    import dataclasses

    import vitscale.models
    from vitscale.registry import FAMILIES

    monkeypatch.syspath_prepend(str(TESTS))
    vit = vitscale.models.get_family("vit")
    monkeypatch.setitem(vit.variants, "vit_debug", dataclasses.replace(vit.variants["vit_debug"], num_layers=3))
    try:
        capsys.readouterr()
        assert main(["--import", "toy_family", "models", "--json", "*debug"]) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        real = {n: sum(p.numel() for p in vitscale.create_model(n).parameters()) for n in ("toy_debug", "vit_debug")}
    finally:  # the toy family known to this process only while the test runs (as test_new_family.py keeps it)
        FAMILIES.entries.pop("toy", None)
        for m in [m for m in sys.modules if m == "toy_family" or m.startswith("toy_family.")]:
            del sys.modules[m]
    assert [x["name"] for x in rows] == ["vit_debug", "clip_debug", "volo_debug", "naflex_debug", "toy_debug"]
    assert rows[-1]["family"] == "toy" and round(rows[-1]["params_m"] * 1e6) == real["toy_debug"]
    assert rows[-1]["gflops"] > 0 and (rows[-1]["img_size"], rows[-1]["patch"]) == (32, 8)
    declared = _zoo()["vit"][0]
    assert declared["name"] == "vit_debug" and declared["params"] != real["vit_debug"]
    assert round(rows[0]["params_m"] * 1e6) == real["vit_debug"]
