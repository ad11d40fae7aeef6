"""The ViT-22B parallel block's hot path, as torch.compile captures it (AOT forward and backward
graphs): one GEMM in (QKV + fc1 fused), one GEMM out, one LayerNorm, and no copy beyond the two the
fusion needs — the concatenation feeding out_proj_per_head, and in backward the one gathering dq, dk, dv and
the MLP gradient into in_proj_per_head's output gradient (no stack of dq, dk, dv first, no clone). Outputs
are guarded by the timm parity tests (tests/unit/test_interop_timm.py)."""

from __future__ import annotations

import collections

import torch
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

from vitscale.models.vit.configs import ViTConfig
from vitscale.models.vit.model import ParallelBlock

COPIES = ("aten.cat", "aten.stack", "aten.clone", "aten.copy", "aten.contiguous")


def _graphs(block: torch.nn.Module, x: torch.Tensor) -> dict[str, collections.Counter]:
    graphs: dict[str, collections.Counter] = {}

    def keep(name):
        def compiler(gm, example):
            ops = (str(n.target).rsplit(".", 1)[0] for n in gm.graph.nodes if n.op == "call_function")
            graphs[name] = collections.Counter(ops)
            return make_boxed_func(gm)

        return compiler

    def backend(gm, example):
        return aot_module_simplified(gm, example, fw_compiler=keep("fw"), bw_compiler=keep("bw"))

    torch._dynamo.reset()
    torch.compile(block, backend=backend, fullgraph=True)(x).sum().backward()
    return graphs


def test_parallel_block_graph_has_two_gemms_and_only_the_fusion_copies():
    cfg = ViTConfig(hidden_size=64, ffn_hidden_size=256, num_attention_heads=4, num_layers=1, patch_dim=8,
                    img_h=32, img_w=32, parallel_block=True, qkv_bias=False, mlp_bias=True)  # fmt: skip
    g = _graphs(ParallelBlock(cfg), torch.randn(2, 17, 64, requires_grad=True))
    fw, bw = g["fw"], g["bw"]
    assert fw["aten.mm"] + fw["aten.addmm"] == 2, fw  # in_proj_per_head, out_proj_per_head
    assert fw["aten.native_layer_norm"] == 1
    # [attention, MLP] -> out_proj; torch 2.11 also traces the blocks' nn.Dropout(p=0) as clones (that
    # inductor fuses away), torch 2.14 does not: forward clones are not counted
    assert {k: fw[k] for k in COPIES if fw[k] and k != "aten.clone"} == {"aten.cat": 1}, fw
    assert {k: bw[k] for k in COPIES if bw[k]} == {"aten.cat": 1}, bw  # [dq, dk, dv, dMLP] -> d in_proj_per_head
    assert bw["aten.mm"] == 4, bw  # input and weight gradients of the two GEMMs
