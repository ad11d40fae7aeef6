"""The peak memory the trainer logs and the bench reports (``vitscale.tools.device_memory``): the
allocated peak, or under CUDA graphs the reserved peak, which holds the graphs' private pools that
replays use without allocating (on an H100 the allocated figure fell from 3.13 to 1.11 GiB under graphs)."""

from __future__ import annotations

from vitscale.tools.device_memory import ALLOCATED, RESERVED, peak_bytes, peak_key

# torch.cuda.memory_stats() of a CUDA-graph step after its recording: the pool stays reserved
STATS = {ALLOCATED: 1_190_000_000, RESERVED: 3_900_000_000, "allocated_bytes.all.current": 1_100_000_000}


def test_peak_is_allocated_without_graphs_and_reserved_with_them():
    assert peak_key(False) == "allocated_bytes.all.peak" and peak_key(True) == "reserved_bytes.all.peak"
    assert peak_bytes(STATS, cudagraphs=False) == 1_190_000_000
    assert peak_bytes(STATS, cudagraphs=True) == 3_900_000_000
    assert peak_bytes({}, cudagraphs=True) == 0  # an allocator that has not run yet


def test_the_trainer_counts_graph_pools_only_under_cudagraph_modes():
    from vitscale.config import load_config
    from vitscale.train.logstep import LogStep

    class Guard:
        checked_total = 0

    def logstep(**train):
        cfg = load_config("digits_vit", [f"train.{k}={v}" for k, v in train.items()])
        return LogStep(cfg.train, world=1, steps_per_epoch=10, schedule=None, guard=Guard(), flops_per_image=None,
                       peak=None, info=print)  # fmt: skip

    assert logstep(compile="true", compile_mode="reduce-overhead").cudagraphs
    assert logstep(compile="true", compile_mode="max-autotune").cudagraphs
    assert not logstep(compile="true", compile_mode="max-autotune-no-cudagraphs").cudagraphs
    assert not logstep(compile="false").cudagraphs and not logstep(compile="true").cudagraphs
