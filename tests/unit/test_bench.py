"""vitscale bench: the CLI end to end on debug models, MFU arithmetic, the peak table, the GPU script."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from vitscale.bench import BenchSettings, run_bench
from vitscale.cli import main as cli_main
from vitscale.models.registry import create_model
from vitscale.models.vit.flops import vit_flops
from vitscale.tools import mfu as M
from vitscale.train.fastpath import compile_blocks, sdpa_backend, transformer_blocks

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {"model", "mode", "device", "batch_size", "flops_per_img", "peak_tflops", "vitscale", "speedup",
          "torch", "commit"}  # fmt: skip
IMPL_FIELDS = {"img_per_s", "tflops", "mfu", "peak_mem_gb"}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VITSCALE_CACHE_DIR", str(tmp_path / "cache"))


def _check_impl(entry: dict, flops: int, mode: str, peak: float) -> None:
    assert IMPL_FIELDS <= set(entry)
    assert entry["img_per_s"] > 0
    factor = 3 if mode == "train" else 1
    assert entry["tflops"] == pytest.approx(entry["img_per_s"] * factor * flops / 1e12)
    assert entry["mfu"] == pytest.approx(100 * entry["tflops"] / peak)  # percent
    assert entry["peak_mem_gb"] is None  # CPU: not measured per implementation


def test_cli_vit_debug_compare_timm_writes_json(tmp_path, capsys):
    out = tmp_path / "res.json"
    rc = cli_main(["bench", "vit_debug", "--device", "cpu", "--mode", "train", "--compare", "timm",
                   "--batch-size", "4", "--steps", "3", "--rounds", "3", "--warmup", "1", "--profile-top", "4",
                   "--json", str(out)])  # fmt: skip
    assert rc == 0
    res = json.loads(out.read_text())
    assert FIELDS | {"timm"} <= set(res)
    for key in ("vitscale", "timm"):  # --profile-top: one profiled step each, its 4 costliest operators
        top = res[key]["top_ops"]
        assert len(top) == 4 and all(ms > 0 for _, ms in top) and [ms for _, ms in top] == sorted((ms for _, ms in top), reverse=True)
        assert len({name for name, _ in top}) == 4 and all(isinstance(name, str) and name for name, _ in top), top
    assert res["model"] == "vit_debug" and res["mode"] == "train" and res["batch_size"] == 4
    assert res["device"].startswith("cpu")
    assert res["torch"] == torch.__version__
    assert res["commit"] is None or len(res["commit"]) >= 40
    cfg = create_model("vit_debug", device="meta").cfg
    assert res["flops_per_img"] == vit_flops(cfg)  # the FLOP counter agrees with the analytic count
    assert res["peak_tflops"] > 0
    for key in ("vitscale", "timm"):
        _check_impl(res[key], res["flops_per_img"], "train", res["peak_tflops"])
    assert res["speedup"] == pytest.approx(res["vitscale"]["img_per_s"] / res["timm"]["img_per_s"])
    assert "timm_compiled" not in res  # compile is off by default on CPU
    assert "vit_tiny" not in res["timm"]["implementation"]  # the debug size is built from its config
    # the warm-up round is timed but not counted: the overall rate is that of the 3 timed rounds of one
    # step each (their harmonic mean), the warm-up round's rate is kept apart
    for key in ("vitscale", "timm"):
        rounds = res[key]["round_img_per_s"]
        assert len(rounds) == 3 and res[key]["warmup_round_img_per_s"] > 0
        assert res[key]["img_per_s"] == pytest.approx(3 / sum(1 / r for r in rounds))
    # the headline is the median of the per-round ratios; the overall ratio stays in the JSON
    ratios = [a / b for a, b in zip(res["vitscale"]["round_img_per_s"], res["timm"]["round_img_per_s"])]
    assert res["speedup_rounds"] == pytest.approx(ratios)
    assert res["speedup_median_round"] == pytest.approx(sorted(ratios)[1])
    printed = capsys.readouterr().out
    assert "top operators of vitscale vit_debug (self ms per step" in printed
    assert "warm-up round vitscale" in printed and "not counted" in printed and "take about" in printed
    headline = next(line for line in printed.splitlines() if line.startswith("speedup vitscale / timm"))
    assert headline.startswith(f"speedup vitscale / timm: {res['speedup_median_round']:.3f}x (median of 3 per-round "
                               f"ratios; overall {res['speedup']:.3f}x)")  # fmt: skip


@pytest.mark.parametrize("device, sizes", [("cpu", (8, 10, 2, 5)), ("cuda", (32, 20, 3, 5))])
def test_default_sizes_per_device(device, sizes, capsys):
    """A CPU gets a quick run by default (about a minute for ViT-S/16 against timm on 2 cores); a GPU
    the sizes it always had. The dry run prints the settings a run would use."""
    assert cli_main(["bench", "vit_s16", "--device", device, "--compare", "timm", "--dry-run"]) == 0
    settings = json.loads(capsys.readouterr().out.removeprefix("dry run: "))
    assert (settings["batch_size"], settings["steps"], settings["warmup"], settings["rounds"]) == sizes
    assert cli_main(["bench", "vit_s16", "--device", device, "--batch-size", "4", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out.removeprefix("dry run: "))["batch_size"] == 4  # given: kept


def test_clip_debug_infer_against_open_clip():
    settings = BenchSettings("clip_debug", mode="infer", device="cpu", batch_size=2, steps=1, rounds=1, warmup=1,
                             compare="open_clip")  # fmt: skip
    res = run_bench(settings, log=lambda s: None)
    assert res["open_clip"]["implementation"].startswith("open_clip")
    for key in ("vitscale", "open_clip"):
        _check_impl(res[key], res["flops_per_img"], "infer", res["peak_tflops"])
    # FLOPs of one sample cover both towers: more than the vision tower alone
    clip = create_model("clip_debug", device="meta")
    assert res["flops_per_img"] > vit_flops(clip.cfg.vision)


def test_compare_must_fit_the_family():
    with pytest.raises(NotImplementedError, match=r"^no timm adapter for family clip \(its adapters: open_clip, transformers\)$"):
        run_bench(
            BenchSettings("clip_debug", device="cpu", steps=1, warmup=0, compare="timm"), log=lambda s: None
        )


def test_mfu_arithmetic():
    # 1,000 img/s at 17.6 GFLOP/img forward: training is 3x forward
    assert M.step_flops_per_image(17.6e9, "train") == pytest.approx(52.8e9)
    assert M.step_flops_per_image(17.6e9, "infer") == pytest.approx(17.6e9)
    assert M.achieved_tflops(1000, 17.6e9, "train") == pytest.approx(52.8)
    assert M.mfu(1000, 17.6e9, "train", 989.4) == pytest.approx(100 * 52.8 / 989.4)  # percent
    assert M.mfu(2000, 17.6e9, "infer", 312.0) == pytest.approx(100 * 35.2 / 312.0)
    with pytest.raises(ValueError):
        M.step_flops_per_image(1.0, "eval")
    with pytest.raises(ValueError):
        M.mfu(1.0, 1.0, "train", 0.0)


@pytest.mark.parametrize(
    "name, dtype, peak",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),  # SXM
        ("NVIDIA H100 PCIe", torch.bfloat16, 756.0),
        ("NVIDIA H100 NVL", "bf16", 835.5),
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA H200 NVL", "bf16", 835.5),
        ("NVIDIA GH200 480GB", "bf16", 989.4),
        ("NVIDIA A100-SXM4-80GB", "bfloat16", 312.0),
        ("NVIDIA A100 80GB PCIe", torch.float32, 19.5),
        ("NVIDIA A100-SXM4-40GB", "tf32", 156.0),
        ("NVIDIA L40S", "bf16", 362.05),
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA A10G", "bf16", 70.0),
        ("NVIDIA A10", "bf16", 125.0),
        ("NVIDIA H100 80GB HBM3", "fp32", 66.9),
    ],
)
def test_peak_table_lookup(name, dtype, peak):
    value, source = M.lookup_peak(name, dtype)
    assert value == peak
    assert source.startswith("datasheet")


def test_peak_table_misses():
    assert M.lookup_peak("Some Unknown Accelerator", "bf16") is None
    assert M.lookup_peak("Tesla V100-SXM2-32GB", "bf16") is None  # no bf16 tensor cores
    with pytest.raises(ValueError):
        M.lookup_peak("NVIDIA H100", "int8")


def test_cpu_peak_is_measured_and_cached(tmp_path):
    value, source = M.peak_tflops("cpu", "fp32")
    assert value > 0 and source.startswith("measured")
    path = tmp_path / "cache" / "cpu_peak.json"
    if "(the cores were shared: not cached)" in source:  # the other test worker (or anything else) had the core
        assert not path.exists()
        return
    cache = json.loads(path.read_text())
    assert list(cache.values()) == [value]
    # a cached figure is reused as is; a refresh keeps the best of old and new
    key = next(iter(cache))
    path.write_text(json.dumps({key: 1e6}))
    assert M.peak_tflops("cpu", "fp32") == (1e6, source.replace("(best of runs)", "(cached)"))
    assert M.peak_tflops("cpu", "fp32", refresh=True)[0] == 1e6


def test_cpu_peak_measured_on_shared_cores_is_not_cached(tmp_path):
    """A peak measured while another process shares the core is low: cached, it would put later runs on an
    idle machine over 100% MFU. Here a busy process is pinned to the measuring thread's one core."""
    import subprocess
    import sys

    assert M.had_the_cpu(0.95, 1.0, 1) and not M.had_the_cpu(0.5, 1.0, 1) and not M.had_the_cpu(1.0, 1.0, 2)
    core = sorted(os.sched_getaffinity(0))[0]
    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(busy.pid, {core})
        os.sched_setaffinity(0, {core})
        torch.set_num_threads(1)
        value, source = M.peak_tflops("cpu", "fp32")
    finally:
        busy.kill()
        busy.wait()
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)
    assert value > 0 and source.endswith("(the cores were shared: not cached)"), source
    assert not (tmp_path / "cache" / "cpu_peak.json").exists()


def test_fastpath_blocks_and_sdpa_backend():
    vit = create_model("vit_debug")
    assert len(transformer_blocks(vit)) == vit.cfg.num_layers
    clip = create_model("clip_debug", device="meta")
    assert len(transformer_blocks(clip)) == clip.cfg.vision.num_layers + clip.cfg.text.num_layers
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = vit(x)
        for choice in ("auto", "flash", "math", "default"):
            with sdpa_backend(choice):
                torch.testing.assert_close(vit(x), ref, atol=1e-5, rtol=1e-4)
    assert compile_blocks(vit) == vit.cfg.num_layers  # lazy: compiles on first call
    assert all(blk._compiled_call_impl is not None for blk in vit.blocks)


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_patch_embed_matmul_equals_conv():
    mod = _load_script("patch_embed")
    conv = torch.nn.Conv2d(3, 16, 8, stride=8)
    x = torch.randn(2, 3, 32, 48)
    ref = conv(x).flatten(2).transpose(1, 2)  # (B, N, D)
    torch.testing.assert_close(mod.patch_matmul(x, conv.weight, conv.bias, 8), ref, atol=1e-5, rtol=1e-4)


def test_batch_second_block_equals_ours():
    mod = _load_script("layout")
    vit = create_model("vit_debug")
    blk = vit.blocks[0]
    x = torch.randn(2, 17, 64)  # (B, N, D)
    with torch.no_grad():
        y = mod.BatchSecondBlock(blk)(x.transpose(0, 1)).transpose(0, 1)
        torch.testing.assert_close(y, blk(x), atol=1e-5, rtol=1e-4)


def test_volo_debug_runs_without_a_reference():
    res = run_bench(BenchSettings("volo_debug", mode="train", device="cpu", batch_size=2, steps=1, rounds=1,
                                  warmup=1), log=lambda s: None)  # fmt: skip
    assert res["speedup"] is None and set(res) >= FIELDS
    _check_impl(res["vitscale"], res["flops_per_img"], "train", res["peak_tflops"])
    assert res["vitscale"]["img_per_cpu_s"] > 0


def test_profile_ops_script_profiles_ours_and_timm(tmp_path):
    mod = _load_script("profile_ops")
    out = tmp_path / "ops.json"
    assert mod.main(["--model", "vit_debug", "--device", "cpu", "--batch-size", "2", "--steps", "1", "--repeats", "2",
                     "--warmup", "1", "--json", str(out)]) == 0  # fmt: skip
    res = json.loads(out.read_text())
    ours, timm = res["ms_per_step"]["vitscale"], res["ms_per_step"]["timm"]
    # both run a training step: matmuls forward (addmm) and backward (mm), attention, the optimizer
    for ops in (ours, timm):
        assert {"aten::addmm", "aten::mm", "aten::_scaled_dot_product_flash_attention_for_cpu"} <= set(ops)
        assert all(v > 0 for v in ops.values())
    assert "aten::convolution_backward" in timm and "aten::convolution_backward" not in ours  # matmul patch embed
    assert res["total_ms_per_step"]["vitscale"] == pytest.approx(sum(ours.values()))
