"""fp8 training through ``vitscale train`` on the digits (torchao's emulation on CPU): the run logs
what it converted, follows the full-precision loss curve to within float8 rounding, and its
exported weights are ordinary ones that ``vitscale eval`` reads into the plain model."""

from __future__ import annotations

import json

import pytest
from helpers import read_losses

from vitscale.cli import main
from vitscale.config import ConfigError

try:
    from vitscale.distributed.float8 import require_torchao

    require_torchao()
    NO_TORCHAO = None
except ConfigError as err:
    NO_TORCHAO = str(err)

ARGS = ["train.max_steps=30", "train.epochs=0", "train.log_every=5", "model.num_layers=2", "eval.every=0",
        "log.progress=plain", "checkpoint.every=0", "log.flops=false", "schedule.warmup_steps=5", "log.report=false",
        "log.tensorboard=false"]  # fmt: skip


def _run(capsys, *args: str) -> str:
    """``vitscale ARGS`` (in this process); returns what it printed."""
    capsys.readouterr()
    rc = main(list(args))
    out = capsys.readouterr()
    assert rc == 0, out.out[-3000:] + out.err[-3000:]
    return out.out + out.err


@pytest.mark.skipif(NO_TORCHAO is not None, reason=f"{NO_TORCHAO}")
def test_fp8_digits_run_tracks_full_precision_and_exports_plain_weights(tmp_path, capsys):
    fp8, ref = tmp_path / "fp8", tmp_path / "ref"
    printed = _run(capsys, "train", "digits_vit", *ARGS, f"train.output_dir={fp8}", "precision.fp8=tensorwise",
                   "precision.fp8_filter=all")  # fmt: skip
    assert "fp8 tensorwise: 8 linear layers in float8, 0 in bf16, emulated on CPU" in printed
    _run(capsys, "train", "digits_vit", *ARGS, f"train.output_dir={ref}")
    got, want = read_losses(fp8), read_losses(ref)
    assert sorted(got) == sorted(want) == [1, 5, 10, 15, 20, 25, 30]
    assert want[30] < want[1] - 0.1  # the curve moves (measured: 2.300 -> 2.144) ...
    assert got != want  # ... the float8 run rounds differently ...
    for step in want:  # ... and follows it closely
        assert abs(got[step] - want[step]) <= 0.03 * want[step], (step, got[step], want[step])
    s8, s32 = json.loads((fp8 / "summary.json").read_text()), json.loads((ref / "summary.json").read_text())
    assert abs(s8["val_top1"] - s32["val_top1"]) <= 5.0, (s8, s32)

    # the exported weights load into the plain (bf16 / fp32) model: `vitscale eval` reproduces the run's accuracy
    printed = _run(capsys, "eval", "digits_vit", "model.num_layers=2", f"checkpoint.path={fp8 / 'model.safetensors'}",
                   f"train.output_dir={tmp_path / 'eval'}")  # fmt: skip
    out = json.loads(printed[printed.index("{"):printed.rindex("}") + 1])
    assert abs(out["val_top1"] - s8["val_top1"]) <= 1.0, (out, s8)
