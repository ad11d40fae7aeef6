"""A new family's parallelize.py holds only its TP plan and its blocks (tests/toy_family): with them the
one parallelize tail runs it under FSDP2 and under tensor parallelism on 2 gloo processes, following
the one-process loss curve step by step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _launch import needs_cpu_fsdp, run_distributed
from _workers import curves_for_layouts
from helpers import assert_follow_one_process, two_rank_curves

pytestmark = pytest.mark.multiprocess

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the toy_family package

STEPS = 4
CASES = [
    ("fsdp", dict(dp_shard=2), "toy_debug", {"num_classes": 10}, STEPS),
    ("tp", dict(dp_shard=1, tp=2), "toy_debug", {"num_classes": 10}, STEPS),
    ("fsdp_full_ac", dict(dp_shard=2), "toy_debug", {"num_classes": 10}, STEPS, "full"),
]


def _toy_curves(cases):
    import toy_family  # noqa: F401 - registers the family in this process

    return curves_for_layouts(cases)


@needs_cpu_fsdp
def test_toy_family_layouts_follow_single_process_curve():
    (ref,) = run_distributed(_toy_curves, 1, [("one", {}, "toy_debug", {"num_classes": 10}, STEPS)])
    got = two_rank_curves(_toy_curves, CASES)
    assert sorted(got) == sorted(label for label, *_ in CASES)
    assert_follow_one_process(got, ref["one"])
