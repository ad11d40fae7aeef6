"""``benchmarks/run_gpu.sh``'s groups for issue 15 (22B block, fp8 speed and loss curves, CUDA graphs,
largest batch): the arguments it takes and refuses, and every command of these groups parsed and
checked in one dry run on CPU (models, overrides, baselines, recipes, the scripts' own arguments);
plus the loss-curve comparison of ``benchmarks/loss_curve.py``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vitscale.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "run_gpu.sh"
ENV = {"PYTHON": sys.executable, "PATH": "/usr/bin:/bin", **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {})}

try:
    from vitscale.distributed.float8 import require_torchao

    require_torchao()
    NO_TORCHAO = False
except ConfigError:  # e.g. torch 2.6 with the newest torchao: the fp8 commands refuse their dry run
    NO_TORCHAO = True
NEW_GROUPS = ("block22b", "fp8_l16", "fp8_h14", "fp8_g14", "fp8_curve_h14", "fp8_curve_g14", "cudagraphs",
              "maxbatch_small", "maxbatch_large")  # fmt: skip


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=ENV, timeout=timeout)


def test_arguments():
    help_ = _run("--help")
    assert help_.returncode == 0 and all(f" {g}" in help_.stdout for g in NEW_GROUPS), help_.stdout
    bad = _run("--dry-run", "fp8")
    assert bad.returncode == 2 and bad.stderr.startswith("unknown argument: fp8 (groups: table train infer"), bad.stderr


@pytest.mark.slow
def test_every_group_dry_runs_in_one_process():
    """``run_gpu.sh --dry-run``: every group's commands parsed and checked in one python process (the
    speed table's five rows, the training / inference / CLIP rows, issue 15's groups); MODELS narrows."""
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    proc = _run("--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checked = [ln for ln in proc.stdout.splitlines() if ln.startswith(("ok", "FAIL"))]
    assert len(checked) >= 10 and all(ln.startswith("ok") for ln in checked), proc.stdout
    lines = [ln[5:] for ln in checked]

    def having(*parts):
        return [ln for ln in lines if all(p in ln for p in parts)]

    for model in ("vit_b16", "vit_l16", "vit_h14", "clip_b32"):
        assert having(f"bench {model} ")
    assert having("--mode infer")
    # the speed table: each row against its compiled peer where it has one, one profiled step each
    table = having("--profile-top 15")
    peers = {ln.split()[3]: ln.split("--compare ")[1].split()[0] if "--compare" in ln else None for ln in table}
    assert len(table) == 5 and peers == {"vit_b16": "timm", "vit_l16": None, "vit_h14": None, "clip_b32": "open_clip",
                                         "volo_d1": "timm"}  # fmt: skip
    assert all("--device cuda" in ln and "--mode train" in ln for ln in table)
    # issue 15's groups
    if NO_TORCHAO:  # e.g. torch 2.6 with the newest torchao: the fp8 runs are left out, saying so
        assert proc.stderr.count("WARNING: torchao is not importable") == 9, proc.stderr
        assert not [ln for ln in lines if "--fp8" in ln or "loss_curve.py" in ln]
    else:
        assert len(having("--baseline fp8=none")) == 7
        assert having("bench vit_h14 ", "--fp8 tensorwise") and having("bench vit_g14 ", "--fp8 rowwise")
        assert len(having("loss_curve.py", "--steps 300", "--fp8 tensorwise rowwise")) == 2
    assert len(having("--set parallel_block=True", "--baseline parallel_block=False")) == 3
    assert {m for m in ("vit_l16", "vit_g14", "vit_bigg14") if having(f"bench {m} ", "parallel_block=False")} == {
        "vit_l16", "vit_g14", "vit_bigg14"}  # fmt: skip
    assert len(having("--compile-mode reduce-overhead", "--baseline compile_mode=default")) == 3
    assert having("max_batch.py --models vit_b16 vit_l16 --ac none full")
    assert having("max_batch.py --models vit_h14 vit_g14 --ac none full")
    # MODELS narrows the set to some models' runs (to split the set over 10-minute device calls)
    narrow = subprocess.run(["bash", str(SCRIPT), "--dry-run", "train", "infer", "clip"], capture_output=True, text=True,
                            timeout=300, env={**ENV, "MODELS": "clip_b32 vit_h14"})  # fmt: skip
    ran = [ln for ln in narrow.stdout.splitlines() if ln.startswith("ok")]
    assert narrow.returncode == 0 and len(ran) == 3, narrow.stdout + narrow.stderr
    assert all(" clip_b32 " in ln or " vit_h14 " in ln for ln in ran)


def test_loss_curve_comparison():
    spec = importlib.util.spec_from_file_location("loss_curve", ROOT / "benchmarks" / "loss_curve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    base = {s: 2.0 - s / 1000 for s in range(10, 310, 10)}
    other = {s: v * (1.03 if s <= 100 else 1.01) for s, v in base.items()}
    c = mod.compare(base, other, window=100)
    assert c["steps_compared"] == 10  # steps 210 ... 300
    assert c["rel_diff_last"] == pytest.approx(0.01) and c["max_rel_gap"] == pytest.approx(0.03)
