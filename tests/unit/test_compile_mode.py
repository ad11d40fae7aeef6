"""``train.compile_mode``: the guards that keep CUDA graphs (reduce-overhead / max-autotune) safe,
checked on CPU — which settings are refused and why, the per-step batch-shape check, the device
check of every tensor — and the refusal through ``vitscale train`` as one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vitscale.config import ConfigError
from vitscale.distributed.compile import (
    COMPILE_MODES,
    StaticShapes,
    apply_compile,
    check_compile_mode,
    check_graph_inputs,
    mark_step,
    same_device,
    uses_cudagraphs,
)


def test_modes_and_refusals():
    assert [m for m in COMPILE_MODES if uses_cudagraphs(m)] == ["reduce-overhead", "max-autotune"]
    for mode in COMPILE_MODES:  # every mode is fine where CUDA graphs can run
        check_compile_mode(mode, compile=True, device_type="cuda", world_size=1)
    check_compile_mode("default", compile=False, device_type="cpu", world_size=8)
    check_compile_mode("max-autotune-no-cudagraphs", compile=True, device_type="cpu", world_size=2)
    with pytest.raises(ConfigError, match="needs train.compile=true"):
        check_compile_mode("reduce-overhead", compile=False, device_type="cuda", world_size=1)
    with pytest.raises(ConfigError, match="need a CUDA device"):
        check_compile_mode("reduce-overhead", compile=True, device_type="cpu", world_size=1)
    with pytest.raises(ConfigError, match="not supported with FSDP2 / tensor parallelism"):
        check_compile_mode("max-autotune", compile=True, device_type="cuda", world_size=2)
    with pytest.raises(ConfigError, match="must be one of"):
        check_compile_mode("fast", compile=True, device_type="cuda", world_size=1)
    with pytest.raises(ConfigError, match="must be one of"):
        apply_compile([nn.Linear(2, 2)], mode="fast")
    # train.compile_backend: the modes are inductor's
    check_compile_mode("default", compile=True, device_type="cpu", world_size=1, backend="aot_eager")
    with pytest.raises(ConfigError, match="train.compile_mode=max-autotune-no-cudagraphs is inductor's"):
        check_compile_mode("max-autotune-no-cudagraphs", compile=True, device_type="cpu", world_size=1, backend="eager")
    with pytest.raises(ConfigError, match="train.compile_backend must be one of inductor, aot_eager, eager"):
        check_compile_mode("default", compile=True, device_type="cpu", world_size=1, backend="tvm")


def test_aot_eager_backend_compiles_without_code_generation():
    """``train.compile_backend=aot_eager``: each block through Dynamo and AOTAutograd, run by eager
    kernels — the same numbers as eager, and one graph per block."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(2)]
    ref = [nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(2)]
    for r, b in zip(ref, blocks):
        r.load_state_dict(b.state_dict())
    torch._dynamo.reset()
    counters.clear()
    apply_compile(blocks, backend="aot_eager")
    x = torch.randn(4, 8)
    got, want = blocks[1](blocks[0](x)), ref[1](ref[0](x))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["inductor"]


def test_static_shapes_guard():
    guard = StaticShapes()
    batch = {"image": torch.zeros(8, 3, 32, 32), "label": torch.zeros(8, dtype=torch.long), "skipped": 0}
    for _ in range(3):
        guard.check(batch)  # the same shape every step
    with pytest.raises(RuntimeError, match=r"batch\['image'\] was \(8, 3, 32, 32\), now \(5, 3, 32, 32\)"):
        guard.check({"image": torch.zeros(5, 3, 32, 32), "label": torch.zeros(5, dtype=torch.long)})


def test_every_tensor_on_the_graph_device():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    check_graph_inputs(model, torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"0\.weight, 0\.bias, 1\.weight and 4 more are not"):
        check_graph_inputs(model, torch.device("cuda"))  # the model stayed on the CPU
    mark_step()  # a plain marker outside any graph: harmless on every device
    cuda0 = torch.device("cuda:0")  # the parameters' device when the run names just "cuda"
    assert same_device(cuda0, "cuda") and same_device(cuda0, torch.device("cuda", 0))
    assert not same_device(cuda0, "cuda:1") and not same_device(torch.device("cpu"), "cuda")


def test_train_refuses_cudagraphs_on_cpu_in_one_line(tmp_path, capsys):
    from vitscale.cli import main

    rc = main(["train", "digits_vit", "train.device=cpu", "train.compile=true", "train.compile_mode=reduce-overhead",
               f"train.output_dir={tmp_path}", "train.max_steps=1"])  # fmt: skip
    stderr = capsys.readouterr().err
    assert rc == 2
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines == [
        "vitscale train: train.compile_mode=reduce-overhead records CUDA graphs, which need a CUDA device "
        "(this run is on cpu): use max-autotune-no-cudagraphs or default"
    ], stderr
