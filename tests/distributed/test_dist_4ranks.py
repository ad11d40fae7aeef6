"""2-D layouts on 4 gloo processes follow the one-process loss curve: FSDP x TP, HSDP (replicate x
shard), DP x TP on the ViT-22B architecture, and FSDP x TP with full activation checkpointing on it.
(The 2-process tests cover each dimension alone; these are the combinations torchtitan-style 2-D
meshes use. ~20-40 s on 2 cores.)"""

from __future__ import annotations

import pytest
from _launch import needs_cpu_fsdp, run_distributed
from _workers import curves_for_layouts, train_curve

pytestmark = pytest.mark.multiprocess

STEPS = 6
TOL = 2e-4  # relative, per step (measured ~1e-7: summation order only)
MINI_22B = dict(hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_layers=2, patch_dim=8, img_h=32,
                img_w=32, num_classes=10, layer_scale_init=0.1)  # fmt: skip
CASES = [
    ("fsdp2xtp2", dict(dp_shard=2, tp=2), "vit_debug", {}, STEPS),
    ("hsdp2x2", dict(dp_replicate=2, dp_shard=2), "vit_debug", {}, STEPS),
    ("dp2xtp2_22b", dict(dp_replicate=2, dp_shard=1, tp=2), "vit_22b", MINI_22B, STEPS),
    ("fsdp2xtp2_22b_ac", dict(dp_shard=2, tp=2), "vit_22b", MINI_22B, STEPS, "full"),
]


@needs_cpu_fsdp
@pytest.mark.slow
def test_2d_layouts_on_4_ranks_follow_one_process():
    ref = {"vit_debug": train_curve({}, "vit_debug", {}, STEPS), "vit_22b": train_curve({}, "vit_22b", MINI_22B, STEPS)}
    out = run_distributed(curves_for_layouts, 4, CASES, timeout=600)
    assert all(o == out[0] for o in out), "every rank logs the same global-mean loss"
    for label, _, name, *_ in CASES:
        got, want = out[0][label], ref[name]
        assert len(got) == STEPS
        assert max(abs(a - b) / abs(b) for a, b in zip(got, want)) <= TOL, f"{label}: {got} vs one process {want}"
    assert abs(ref["vit_debug"][-1] - ref["vit_debug"][0]) > 1e-3  # the curves move: agreement is not trivial
