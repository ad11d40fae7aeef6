"""Fused outlook attention (``VOLOConfig.outlook_impl``): the Triton kernels checked against eager in
Triton's interpreter on the CPU (a subprocess: the interpreter is chosen before Triton defines the
kernels), compiled for the H100's target without a GPU, and the switch's errors."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vitscale.models import create_model
from vitscale.models.volo import VOLOConfig
from vitscale.models.volo.outlook_kernel import check_geometry, outlook_reference

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_kernels_match_eager_in_the_triton_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cases = Path(__file__).with_name("interpreted_outlook_kernel.py")
    # the interpreter runs on one core: the cases in two halves (about equal times) at once, one per core
    half = "k5_pad2 or volo_odd or compiled_outlooker or released_head_settings or no_padding or stride_eq_k"
    runs = [subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(cases), "-k", k],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for k in (half, f"not ({half})")]  # fmt: skip
    passed = 0
    for r in runs:
        out = r.communicate(timeout=900)[0]
        tail = out[-4000:]
        assert r.returncode == 0, tail
        summary = out.strip().splitlines()[-1]
        assert re.fullmatch(r"(\d+) passed, (\d+) deselected in .*", summary), tail  # nothing skipped
        passed += int(summary.split()[0])
    assert passed >= 12, passed  # every case ran, in one half or the other


def test_kernels_compile_for_h100_without_a_gpu():
    """Triton's compiler, given the sm_90 target, turns each kernel (bf16, the training dtype) into a cubin:
    what the interpreter cannot check (types, layouts, code generation) is checked here."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "constexprs" not in inspect.signature(ASTSource).parameters:  # Triton < 3.3 (torch 2.6's 3.2)
        pytest.skip(f"the compile-only ASTSource API used here is Triton >= 3.3's; this is Triton {triton.__version__}")
    from vitscale.models.volo import outlook_triton as ot

    ints = dict.fromkeys(("H", "W", "h", "w", "C", "NH"), "i32")
    geometry = dict(K=3, PAD=1, S=2, DH=32, BLOCK_D=32)
    kernels = {
        ot._fwd_kernel: ({"V": "*bf16", "L": "*bf16", "OUT": "*bf16", "HC": "i32", "WC": "i32"},
                         dict(BLOCK_P=ot.BLOCK_PIXELS)),
        ot._bwd_logits_kernel: ({"V": "*bf16", "L": "*bf16", "DOUT": "*bf16", "DL": "*bf16", "LSE": "*fp32"},
                                dict(BLOCK_W=ot.BLOCK_WINDOWS, BLOCK_K=16)),
        ot._bwd_values_kernel: ({"L": "*bf16", "LSE": "*fp32", "DOUT": "*bf16", "DV": "*bf16", "HC": "i32", "WC": "i32"},
                                dict(BLOCK_P=ot.BLOCK_PIXELS)),
    }  # fmt: skip
    for fn, (args, blocks) in kernels.items():
        constexprs = {**geometry, **blocks}
        types = {**args, **ints, "scale": "fp32"}
        signature = {a: types.get(a, "constexpr") for a in fn.arg_names}
        assert set(signature) - set(types) == set(constexprs), fn.__name__
        # as the JIT specialises a launch: pointers and the channel count divisible by 16
        attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if a == "C" or types.get(a, "")[:1] == "*"}
        compiled = triton.compile(ASTSource(fn, signature, constexprs=constexprs, attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32))  # fmt: skip
        assert compiled.asm["cubin"], fn.__name__


def test_outlook_impl_choices_and_errors():
    with pytest.raises(ValueError, match="outlook_impl must be one of"):
        VOLOConfig(outlook_impl="fast")
    with pytest.raises(ValueError, match="no attention dropout"):
        create_model("volo_debug", outlook_impl="triton", attention_dropout=0.1)
    x = torch.randn(1, 3, 32, 32)
    if not torch.cuda.is_available():  # the kernel needs CUDA (or the interpreter): a readable error
        with pytest.raises(RuntimeError, match="outlook_impl='triton' needs Triton and a CUDA tensor"):
            create_model("volo_debug", outlook_impl="triton")(x)
    torch.manual_seed(0)
    auto = create_model("volo_debug", outlook_impl="auto").eval()
    eager = create_model("volo_debug", outlook_impl="eager").eval()
    eager.load_state_dict(auto.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(auto(x), eager(x))


def test_geometry_mismatch_is_one_readable_error():
    v = torch.zeros(1, 6, 6, 8)
    with pytest.raises(ValueError, match=r"expected a window grid \(3, 3\)"):
        check_geometry(v, torch.zeros(1, 6, 6, 2 * 81), 3, 1, 2)
    check_geometry(v, torch.zeros(1, 3, 3, 2 * 81), 3, 1, 2)
    out = outlook_reference(v, torch.zeros(1, 3, 3, 2 * 81), 3, 1, 2, 0.5)
    assert out.shape == v.shape
