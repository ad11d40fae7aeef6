"""Layout resolution and its error messages, activation-checkpointing selection (one process); the
data-parallel groups of the mesh (8 gloo processes)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch
from _launch import run_distributed

from vitscale.distributed import LayoutError, ParallelDims, init_distributed
from vitscale.distributed.activation_checkpoint import apply_activation_checkpointing, selected_layers
from vitscale.distributed.parallelize import check_layout
from vitscale.distributed.utils import clip_grad_norm_
from vitscale.models.registry import create_model, get_model_config, parallel_plan


def test_dp_shard_minus_one_takes_the_rest():
    d = ParallelDims.from_sizes(dp_replicate=2, dp_shard=-1, tp=4, world_size=64)
    assert (d.dp_replicate, d.dp_shard, d.tp, d.dp_size) == (2, 8, 4, 16)
    assert d.fsdp_enabled and d.tp_enabled and "HSDP" in d.describe() and "TP" in d.describe()
    d = ParallelDims.from_sizes(dp_replicate=2, dp_shard=1, tp=1, world_size=2)
    assert "(DP)" in d.describe()
    d = ParallelDims.from_sizes(dp_shard=2, tp=2, world_size=4, rank=3)
    assert (d.dp_rank, d.tp_rank) == (1, 1)  # TP ranks of one group share a data-parallel rank


def test_layout_errors_say_what_to_change():
    with pytest.raises(LayoutError, match=r"= 6, but the world size is 8: set parallel.dp_shard=-1"):
        ParallelDims.from_sizes(dp_replicate=1, dp_shard=3, tp=2, world_size=8)
    with pytest.raises(LayoutError, match=r"world size 8 is not divisible by .* parallel.tp \(3\)"):
        ParallelDims.from_sizes(dp_shard=-1, tp=3, world_size=8)
    with pytest.raises(LayoutError, match="parallel.tp must be an integer >= 1"):
        ParallelDims.from_sizes(tp=0, world_size=1)
    # the model's family says whether its TP plan splits the config (its plan's check_tp)
    vit, clip = parallel_plan("vit"), parallel_plan("clip")
    with pytest.raises(LayoutError, match=r"^parallel.tp=8 does not split vit_b16: num_attention_heads=12 is not "
                                          r"divisible by 8 \(tp that divide it: 1, 2, 3, 4, 6, 12\)$"):  # fmt: skip
        check_layout(vit, get_model_config("vit_b16"), 8, "vit_b16")
    check_layout(vit, get_model_config("vit_b16"), 4)  # 12 heads, 3072 FFN: fine
    with pytest.raises(LayoutError, match="ffn_hidden_size=3070 is not divisible by 4"):
        check_layout(vit, get_model_config("vit_b16", ffn_hidden_size=3070), 4)
    with pytest.raises(LayoutError, match=r"text.num_attention_heads=2 is not divisible by 4"):  # both CLIP towers
        check_layout(clip, get_model_config("clip_debug", text={"num_attention_heads": 2}), 4)


def test_single_process_without_torchrun(monkeypatch):
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    d = init_distributed(NS(dp_replicate=1, dp_shard=-1, tp=1), "cpu")
    assert (d.world_size, d.dp_shard, d.mesh, d.distributed) == (1, 1, None, False)
    with pytest.raises(LayoutError, match="launch 2 processes"):
        init_distributed(NS(dp_replicate=1, dp_shard=2, tp=1), "cpu")


def test_activation_checkpoint_layer_selection():
    assert selected_layers(12, "block", 0) == list(range(12))
    assert selected_layers(12, "block", 3) == [0, 1, 2]
    assert selected_layers(12, "uniform", 4) == [0, 4, 8]
    assert selected_layers(12, "uniform", 0) == list(range(12))
    with pytest.raises(ValueError, match="ac_method"):
        selected_layers(12, "every", 2)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_keeps_names_and_gradients(mode):
    torch.manual_seed(0)
    ref = create_model("vit_debug", qk_norm=True)
    model = create_model("vit_debug", qk_norm=True)
    model.load_state_dict(ref.state_dict())
    assert apply_activation_checkpointing(model.blocks, mode, "block", 1) == [0]
    assert list(model.state_dict()) == list(ref.state_dict())
    x = torch.randn(3, 3, 32, 32)
    ref(x).square().mean().backward()
    model(x).square().mean().backward()
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=n)


def test_grad_norm_matches_torch_on_one_process():
    torch.manual_seed(0)
    m = create_model("vit_debug")
    m(torch.randn(2, 3, 32, 32)).sum().backward()
    params = list(m.parameters())
    want = torch.nn.utils.clip_grad_norm_(params, float("inf"))
    got = clip_grad_norm_(params, 0.5)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(clip_grad_norm_(params), torch.tensor(0.5), atol=1e-4, rtol=1e-4)


def _dp_groups():
    """Per layout: this rank's (dp_rank, tp_rank) and the ranks of its data-parallel group."""
    import torch.distributed as dist

    from vitscale.distributed import init_distributed

    out = {}
    for layout in (dict(dp_replicate=2, dp_shard=2, tp=2), dict(dp_replicate=4, dp_shard=1, tp=2), dict(dp_shard=4, tp=2)):
        dims = init_distributed(NS(**layout), "cpu")
        group = dims.dp_group()
        members = [None] * dist.get_world_size(group)
        dist.all_gather_object(members, dist.get_rank(), group=group)
        out[tuple(layout.values())] = (dims.dp_rank, dims.tp_rank, sorted(members))
    return out


@pytest.mark.multiprocess
def test_data_parallel_groups_come_from_the_mesh_on_8_ranks():
    """The ranks a TP rank's batches, losses and evaluations combine over: every data-parallel rank
    of the same TP rank — HSDP x TP through the flattened ``dp_replicate x dp_shard`` mesh."""
    for rank, per_layout in enumerate(run_distributed(_dp_groups, 8)):
        for layout, (dp_rank, tp_rank, members) in per_layout.items():
            assert (dp_rank, tp_rank) == (rank // 2, rank % 2), layout
            assert members == [r for r in range(8) if r % 2 == tp_rank], (layout, rank, members)


def _silent_peer(timeout_s: float):
    """Rank 1 stops answering (a hung process); rank 0's collective must fail after ``timeout_s``
    (``parallel.timeout``), not PyTorch's default 30 minutes, with vitscale's one line."""
    import time

    import torch.distributed as dist

    from vitscale.errors import describe

    init_distributed(NS(dp_replicate=1, dp_shard=-1, tp=1), "cpu", timeout_s=timeout_s)
    if dist.get_rank() == 1:
        time.sleep(timeout_s * 2)  # silent well past rank 0's timeout
        dist.destroy_process_group()
        return None
    t0 = time.perf_counter()
    try:
        dist.all_reduce(torch.ones(1))
        line = None
    except Exception as e:  # noqa: BLE001 - the error is the result
        line = describe(e)
    took = time.perf_counter() - t0
    dist.destroy_process_group()
    return took, line


@pytest.mark.multiprocess
def test_parallel_timeout_bounds_a_collective_whose_peer_hangs():
    took, line = run_distributed(_silent_peer, 2, 3.0)[0]
    assert line is not None and line[0].startswith("lost contact with another rank ("), line
    assert "parallel.timeout" in line[0] and took < 12  # the configured 3 s, not the default 1800 s
