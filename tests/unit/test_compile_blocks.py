"""The GPU fast path compiles every transformer block (``train.compile``, ``vitscale bench``). Here, on
CPU: every family's blocks trace as one graph each (``fullgraph=True``: a graph break would split
the block's kernels on the GPU) and the compiled training step computes the eager step's loss and
gradients. The ``aot_eager`` backend runs the same Dynamo capture and AOT autograd as inductor
without generating kernels, so the check is fast and needs no compiler."""

from __future__ import annotations

import copy

import pytest
import torch

from vitscale.models import create_model
from vitscale.tools.flops import example_inputs
from vitscale.train.fastpath import compile_blocks, sdpa_backend, transformer_blocks


def _loss(out) -> torch.Tensor:
    if isinstance(out, dict):
        return sum(v.float().pow(2).mean() for v in out.values() if torch.is_tensor(v) and v.ndim > 0)
    if isinstance(out, (tuple, list)):
        return sum(v.float().pow(2).mean() for v in out if torch.is_tensor(v) and v.ndim > 0)
    return out.float().pow(2).mean()


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("vit_debug", {}),
        ("vit_debug", {"parallel_block": True, "qk_norm": True, "qkv_bias": False, "pool": "map"}),
        ("vit_debug", {"layer_scale_init": 1e-5, "class_token_length": 0, "pool": "avg"}),
        ("clip_debug", {}),
        ("volo_debug", {}),
    ],
)
def test_compiled_blocks_trace_whole_and_match_eager(name, overrides):
    torch.manual_seed(0)
    eager = create_model(name, **overrides).train()
    compiled = copy.deepcopy(eager)
    torch._dynamo.reset()
    graphs = []

    def aot_eager_counting(gm, example):  # aot_eager, recording every graph Dynamo hands over
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example)

    n = compile_blocks(compiled, fullgraph=True, backend=aot_eager_counting)
    assert n == len(transformer_blocks(eager)) > 0
    inputs = example_inputs(eager, 2, "cpu")
    losses = []
    with sdpa_backend("auto"):  # as the trainer and the bench run it
        for model in (eager, compiled):
            loss = _loss(model(*inputs))
            loss.backward()
            losses.append(loss.detach())
    # one graph per distinct block (identical blocks share one) and none for anything else
    assert 1 <= len(graphs) <= n
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for (pn, p), q in zip(eager.named_parameters(), compiled.parameters()):
        if p.grad is None:
            assert q.grad is None, pn
            continue
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=pn)
