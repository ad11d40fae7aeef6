"""``vitscale bench --fp8 / --compile-mode / --baseline``: ours against a second copy of ours with one
setting changed, alternating rounds in one process (fp8 vs bf16, ViT-22B block vs plain block,
CUDA graphs vs not). On CPU here: the JSON it writes and the refusals; the timings are the GPU's."""

from __future__ import annotations

import json

import pytest

from vitscale.cli import main
from vitscale.config import ConfigError

try:
    from vitscale.distributed.float8 import require_torchao

    require_torchao()
    NO_TORCHAO = None
except ConfigError as err:
    NO_TORCHAO = str(err)


@pytest.mark.skipif(NO_TORCHAO is not None, reason=f"{NO_TORCHAO}")
def test_fp8_against_bf16_baseline_writes_both(tmp_path):
    out = tmp_path / "fp8.json"
    args = ["bench", "vit_debug", "--device", "cpu", "--batch-size", "4", "--steps", "2", "--rounds", "2",
            "--warmup", "1", "--fp8", "tensorwise", "--fp8-filter", "all", "--baseline", "fp8=none", "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    res = json.loads(out.read_text())
    assert res["vitscale"]["implementation"] == "vitscale vit_debug"
    assert res["baseline"]["implementation"] == "vitscale vit_debug (fp8=none)"
    assert len(res["vitscale"]["round_img_per_s"]) == len(res["baseline"]["round_img_per_s"]) == 2
    assert res["speedup_vs_baseline"] == pytest.approx(res["vitscale"]["img_per_s"] / res["baseline"]["img_per_s"])
    assert res["settings"]["fp8"] == ["fp8 tensorwise: 8 linear layers in float8, 0 in bf16, emulated on CPU "
                                      "(numerics only, no speed-up)"]  # fmt: skip
    assert res["settings"]["baseline"] == {"fp8": "none"} and res["speedup"] is None


def test_model_field_baseline_and_refusals(tmp_path, capsys):
    out = tmp_path / "pb.json"
    args = ["bench", "vit_debug", "--device", "cpu", "--batch-size", "2", "--steps", "1", "--rounds", "1",
            "--warmup", "0", "--set", "parallel_block=True", "--baseline", "parallel_block=False", "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    res = json.loads(out.read_text())
    assert res["baseline"]["implementation"] == "vitscale vit_debug (parallel_block=False)"
    assert res["speedup_vs_baseline"] > 0
    # refusals: one line each, no traceback (vitscale.cli); exit code 2 for a setting to change
    for argv, code, text in (
        (["--baseline", "parallel_blok=False", "--dry-run"], 2, "did you mean 'parallel_block'"),  # the dry run checks baselines too
        (["--device", "cpu", "--mode", "infer", "--fp8", "tensorwise", "--steps", "1"], 1, "--fp8 is a training recipe"),
        (["--device", "cpu", "--compile-mode", "reduce-overhead", "--steps", "1"], 2,
         "train.compile_mode=reduce-overhead needs train.compile=true"),
        (["--device", "cpu", "--compile", "--compile-mode", "reduce-overhead", "--steps", "1"], 2, "need a CUDA device"),
    ):
        capsys.readouterr()
        assert main(["bench", "vit_debug", *argv]) == code, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("vitscale bench: ") and text in err[0], err


def test_residual_and_epilogue_switches_reach_the_bench(capsys):
    """``--residual bf16 --baseline residual=fp32`` (bf16 autocast) builds ours with the bf16 stream
    and the baseline copy without; the switches' refusals come through as one line."""
    import torch

    from vitscale.bench.harness import BenchSettings, build_impls

    settings = BenchSettings(model="vit_debug", device="cpu", precision="bf16", batch_size=2, steps=1, warmup=0,
                             rounds=1, residual="bf16", baseline={"residual": "fp32"})  # fmt: skip
    impls, _ = build_impls(settings)
    assert [i.label for i in impls] == ["vitscale vit_debug", "vitscale vit_debug (residual=fp32)"]
    assert {b.residual_dtype for b in impls[0].model.blocks} == {torch.bfloat16}
    assert {b.residual_dtype for b in impls[1].model.blocks} == {None}
    for argv, text in (
        (["--precision", "fp32", "--residual", "bf16"], "precision.residual=bf16 needs bf16 autocast"),
        (["--precision", "bf16", "--mlp-epilogue", "cublaslt_tanh"], "runs cuBLASLt epilogues on CUDA; this run is on cpu"),
    ):
        capsys.readouterr()
        assert main(["bench", "vit_debug", "--device", "cpu", "--steps", "1", *argv]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and text in err[0], err
