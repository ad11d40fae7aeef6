"""The GPU check (``benchmarks/gpu_check.sh``, ``benchmarks/gpu_curves.py``) prepared on the CPU (the
speed table's commands, ``benchmarks/run_gpu.sh table``: tests/unit/test_run_gpu.py): every command
parses and every run's config loads without a GPU, the curves' comparison works on real (tiny, CPU) training runs, and the tests'
outcomes reach the JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PYTHON": sys.executable, "PATH": "/usr/bin:/bin",
       **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {})}  # fmt: skip


def _curves():
    spec = importlib.util.spec_from_file_location("gpu_curves", ROOT / "benchmarks" / "gpu_curves.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_gpu_check_dry_run_collects_the_tests_and_loads_every_run():
    """The prepared call of issue 50: the tests (the epilogue / residual tests among them) collect,
    the 10 default curve runs load, and every speed row's ``vitscale bench`` command parses, each
    before / after pair in one process (``--baseline``), each profiled (``--profile-top 40``); the
    header states the budget estimate inside the 8-minute call."""
    script = ROOT / "benchmarks" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    proc = subprocess.run(["bash", str(script), "--dry-run"], capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    collected = int(proc.stdout.split("ok   ", 1)[1].split()[0])
    assert collected >= 21, proc.stdout  # every GPU-only path, the epilogues and the bf16 stream included
    runs = proc.stdout.split("dry run: ", 1)[1]
    assert runs.startswith("10 runs:"), runs
    for run in ("vit_b16/compile", "vit_b16/graphs", "vit_b16/residual", "volo_d1/compile", "dino_vit_b16/compile", "mae_vit_b16/compile"):
        assert run in runs.split("\n", 1)[0]
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("ok   -m vitscale bench")]
    assert len(rows) == 10 and all("--profile-top 40" in r and "--baseline" in r and "--device cuda" in r for r in rows)
    assert proc.stdout.rstrip().endswith("dry run: 10 speed rows: vit_b16 volo_d1 vit_h14_fp8 clip_b32 vit_l16 vit_h14 "
                                         "vit_b16_residual clip_b32_graphs vit_b16_autotune vit_h14_fp8_torchao")  # fmt: skip
    having = lambda *parts: [r for r in rows if all(p in r for p in parts)]  # noqa: E731
    assert having("bench vit_b16 ", "--compare timm", "--residual bf16", "--mlp-epilogue cublaslt_tanh",
                  "--baseline residual=fp32", "--baseline mlp_epilogue=none")  # fmt: skip
    assert having("bench volo_d1 ", "--compare timm", "--baseline stem_fast=False")
    assert having("bench vit_h14 ", "--fp8 tensorwise", "--fp8-filter all", "--baseline fp8=none")
    assert having("bench vit_h14 ", "--fp8-filter torchao")
    assert len(having("bench clip_b32 ", "--compare open_clip", "--compile-mode reduce-overhead")) == 2
    bad = subprocess.run(["bash", str(script), "--fast"], capture_output=True, text=True, env=ENV, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("unknown argument: --fast (--dry-run, --speed-only, --rows NAME...")
    bad = subprocess.run(["bash", str(script), "--rows", "vit_b99"], capture_output=True, text=True, env=ENV, timeout=60)
    assert bad.returncode == 2 and "unknown argument: vit_b99" in bad.stderr
    helptext = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, env=ENV, timeout=60).stdout
    assert "Budget estimate" in helptext and "CALL_BUDGET" in helptext and helptext.rstrip().endswith("gpu_curves.py).")


def test_gpu_tests_outcomes_reach_the_json(tmp_path):
    """Run without CUDA, the tests marked gpu are all skipped: the JSON lists each as skipped and the
    merge fails (a skip is not a pass); an XML that pytest never wrote is one error entry."""
    xml, out = tmp_path / "gpu.xml", tmp_path / "check.json"
    out.write_text(json.dumps({"failed": [], "runs": {}}))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/gpu",
                           "--junitxml", str(xml)], cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:]
    mod = _curves()
    assert mod.main(["--merge-junit", str(xml), "--json", str(out)]) == 1
    data = json.loads(out.read_text())
    assert data["runs"] == {} and len(data["tests"]) >= 17
    assert {r["outcome"] for r in data["tests"].values()} == {"skipped"} and data["tests_failed"] == list(data["tests"])
    assert any(t.startswith("test_gpu_paths::test_float8_blocks_match_bf16") for t in data["tests"])
    assert mod.main(["--merge-junit", str(tmp_path / "none.xml"), "--json", str(out)]) == 1
    assert json.loads(out.read_text())["tests"] == {
        "(pytest)": {"outcome": "error", "seconds": None, "message": "no none.xml: pytest did not finish"}}


def test_curve_comparison_and_verdicts():
    mod = _curves()
    base = {s: 7.0 - 0.1 * s for s in range(1, 21)}
    ok = {s: v * 1.004 for s, v in base.items()}
    c = mod.compare(base, ok, window=5)
    assert c["steps_compared"] == 20 and c["first_rel"] == pytest.approx(0.004) and c["all_finite"]
    args = type("A", (), {"first_tol": 0.01, "tol": 0.02, "steps": 20, "window": 5})()
    run = {"mem_peak_gib": [1.5] * 20, "checkpoints": ["step_10", "step_20"]}
    assert mod.verdict("compile", run, c, args, on_cuda=True) == []
    drift = {s: v * (1 + 0.01 * s) for s, v in base.items()}  # 1% at step 1, 20% at the end
    assert mod.verdict("compile", run, mod.compare(base, drift, 5), args, on_cuda=True) == [
        "last 5 steps' mean loss 17.96% from eager's (tolerance 2%)"]
    assert mod.verdict("fp8", run, mod.compare(base, {s: v * 1.025 for s, v in base.items()}, 5), args, True) == []
    nan = {**ok, 20: float("nan")}
    assert mod.verdict("compile", run, mod.compare(base, nan, 5), args, True) == ["a non-finite loss"]
    assert mod.verdict("graphs", {"mem_peak_gib": [None] * 20, "checkpoints": []}, c, args, True) == [
        "mem_peak_gib missing or not positive at a log step", "no checkpoint written (checkpoint.async_mode=async_pinned)"]
    # the device's first run: ViT-B/16 under CUDA graphs logged 1.11 GiB where the compiled run logged 3.13
    graphs = {"mem_peak_gib": [3.13, 1.11], "checkpoints": ["step_10"]}
    assert mod.verdict("graphs", graphs, c, args, True, compiled_peak=3.13) == [
        "mem_peak_gib 1.11 under CUDA graphs, below the 3.13 GiB of the compiled run without graphs (the graphs' "
        "memory pools not counted)"]  # fmt: skip
    assert mod.verdict("graphs", {**graphs, "mem_peak_gib": [3.3]}, c, args, True, compiled_peak=3.13) == []
    short = {s: base[s] for s in range(1, 11)}
    assert mod.verdict("compile", run, mod.compare(base, short, 5), args, True) == ["10 of 20 steps logged by both runs"]


@pytest.mark.slow
def test_gpu_curves_tiny_runs_on_the_cpu(tmp_path):
    """The script end to end on the CPU: a NaFlex debug model's padded batches, eager and per-block
    compiled (``aot_eager``: Dynamo's graphs and recompiles, without inductor's code generation), through
    ``vitscale train``; the compiled curve follows eager's (fp32); the ``graphs``
    variant (on a CPU without its CUDA graphs) writes its async_pinned checkpoints and they are found."""
    out = tmp_path / "curves.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_curves.py"), "--tiny", "--models",
                           "naflex_b16_gap", "vit_b16", "--variants", "eager", "compile", "graphs", "--steps", "10",
                           "--window", "2", "--skip", "vit_b16/compile", "--compile-backend", "aot_eager",
                           "--jobs", "2", "--out-dir", str(tmp_path / "runs"), "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["failed"] == [] and set(data["runs"]) == {"naflex_b16_gap/eager", "naflex_b16_gap/compile",
                                                          "vit_b16/eager", "vit_b16/graphs"}  # --skip: no vit_b16/compile
    run = data["runs"]["naflex_b16_gap/compile"]
    assert len(run["losses"]) == 10 and run["problems"] == []
    assert run["vs_eager"]["first_rel"] < 1e-4 and run["vs_eager"]["max_rel"] < 1e-3  # fp32: compile reorders sums only
    cfg = (tmp_path / "runs" / "naflex_b16_gap-compile" / "config.yaml").read_text()
    assert "seq_lens:\n  - 10\n  - 20" in cfg and "compile: true" in cfg and "compile_backend: aot_eager" in cfg
    graphs = data["runs"]["vit_b16/graphs"]
    assert graphs["checkpoints"] == ["step_00000010"] and graphs["problems"] == []  # every 10, keep 2: one save
    assert "all runs agree with eager" in proc.stdout


def test_skip_leaves_runs_out_and_refuses_what_it_cannot(capsys):
    mod = _curves()
    args = mod.argparse.Namespace(models=["naflex_b16_gap", "vit_b16"], variants=["eager", "compile", "graphs"],
                                  skip=["vit_b16/compile"])  # fmt: skip
    assert mod.plan(args) == [("naflex_b16_gap", "compile"), ("vit_b16", "graphs"), ("naflex_b16_gap", "eager"),
                              ("vit_b16", "eager")]  # fmt: skip
    for skip, why in (("vit_b16/fp9", "--skip vit_b16/fp9: not one of the --models x --variants runs"),
                      ("vit_b16/eager", "--skip leaves a run without its model's eager run")):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            mod.main(["--models", "vit_b16", "--variants", "eager", "compile", "--skip", skip, "--dry-run"])
        assert e.value.code == 2 and why in capsys.readouterr().err
