"""Manual check (4 CPU processes, gloo): 2-D layouts the 2-process tests cannot cover — FSDP x TP,
HSDP, DP x TP, and FSDP x TP with full activation checkpointing on the ViT-22B architecture — follow
the one-process loss curve. Prints the worst relative difference per layout.

    .venv/bin/python scripts/check_layouts_4ranks.py
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "distributed"))
from _launch import run_distributed
from _workers import curves_for_layouts, train_curve

MINI_22B = dict(hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_layers=2, patch_dim=8, img_h=32, img_w=32, num_classes=10, layer_scale_init=0.1)
cases = [("fsdp2xtp2", dict(dp_shard=2, tp=2), "vit_debug", {}, 6), ("hsdp2x2", dict(dp_replicate=2, dp_shard=2), "vit_debug", {}, 6),
         ("dp2xtp2_22b", dict(dp_replicate=2, dp_shard=1, tp=2), "vit_22b", MINI_22B, 6), ("fsdp2xtp2_22b_ac", dict(dp_shard=2, tp=2), "vit_22b", MINI_22B, 6, "full")]
if __name__ == "__main__":
  ref = {"vit_debug": train_curve({}, "vit_debug", {}, 6), "vit_22b": train_curve({}, "vit_22b", MINI_22B, 6)}
  out = run_distributed(curves_for_layouts, 4, cases, timeout=600)
  for c in cases:
    got = out[0][c[0]]
    r = ref[c[2]]
    print(c[0], max(abs(a-b)/abs(b) for a, b in zip(got, r)), got[-1], r[-1])
