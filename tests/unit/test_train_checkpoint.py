"""DCP checkpoints: round trip, keep-last-K, atomic temp folders, weight loading."""

import torch

from vitscale.checkpoint import (
    Checkpointer,
    export_safetensors,
    list_checkpoints,
    load_model_weights,
    read_weights,
)
from vitscale.models import create_model


def _opt_state(model, opt):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}


def test_round_trip_keep_last_and_rng(tmp_path):
    torch.manual_seed(0)
    model = create_model("vit_debug")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    ck = Checkpointer(tmp_path / "checkpoints", keep=2)
    for step in (1, 2, 3):
        ck.save(step, _opt_state(model, opt), {"step": step, "data": {"epoch": 0, "batch_index": step}})
    assert [s for s, _ in list_checkpoints(tmp_path / "checkpoints")] == [2, 3]
    (tmp_path / "checkpoints" / ".tmp-step_00000009").mkdir()  # a save killed half way: never picked
    assert ck.latest().name == "step_00000003"
    expected_rand = torch.rand(3)  # the RNG state saved with step 3 produces this next

    fresh = create_model("vit_debug")
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    state = _opt_state(fresh, fresh_opt)
    ts = ck.load(ck.latest(), state)
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(fresh, state["model"])
    set_optimizer_state_dict(fresh, fresh_opt, state["optim"])
    assert ts["step"] == 3 and ts["data"] == {"epoch": 0, "batch_index": 3}
    torch.testing.assert_close(torch.rand(3), expected_rand)
    for (n, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), n
    for p, q in zip(model.parameters(), fresh.parameters()):
        torch.testing.assert_close(opt.state[p]["exp_avg_sq"], fresh_opt.state[q]["exp_avg_sq"], rtol=0, atol=0)


def test_init_from_resamples_pos_embed_and_skips_other_head(tmp_path):
    small = create_model("vit_debug", num_classes=10)
    ck = Checkpointer(tmp_path / "checkpoints", keep=1)
    ck.save(5, {"model": small.state_dict()}, {"step": 5, "data": {}})
    big = create_model("vit_debug", img_h=64, img_w=64, num_classes=7)
    head_before = big.head.weight.clone()
    report = load_model_weights(big, read_weights(tmp_path))  # a run folder: its newest checkpoint
    assert report["skipped"] == ["head.weight", "head.bias"] and not report["missing"] and not report["unexpected"]
    assert big.pos_embed.shape[1] == 1 + 64 and torch.equal(big.head.weight, head_before)
    torch.testing.assert_close(big.blocks[1].mlp.fc1.weight, small.blocks[1].mlp.fc1.weight)
    torch.testing.assert_close(big.pos_embed[:, :1], small.pos_embed[:, :1])  # class token's embedding kept
    # and the same through an exported .safetensors file
    export_safetensors(small, tmp_path / "model.safetensors")
    sd = read_weights(tmp_path / "model.safetensors")
    assert all(torch.equal(sd[k], v) for k, v in small.state_dict().items())
