"""The shared rename table of the state-dict adapters (``vitscale/models/common/renames.py``): one
entry converts both ways, unknown keys are refused in one line, the fused-row permutation."""

from __future__ import annotations

import pytest
import torch

from vitscale.models.common.renames import (
    PASS_THROUGH,
    Rename,
    RenameTable,
    convert,
    heads_first,
    parts_first,
    per_head,
    transposed,
)

H, DH, D = 2, 3, 4  # heads, head width, model width


def _table(*extra: Rename, catch_all: bool = True) -> RenameTable:
    return RenameTable(
        library="lib",
        unsupported="only tiny models are supported",
        entries=(
            Rename(None, "**.mask"),  # a buffer the library stored: dropped on the way in
            Rename("blocks.*.attn.qkv_per_head.*", "layers.*.in_proj_*", *per_head(3, H)),
            Rename("blocks.*.norm1.**", "layers.*.ln_1.**"),
            Rename("proj.weight", "proj", transposed, transposed),
            *extra,
            *((PASS_THROUGH,) if catch_all else ()),
        ),
    )


def _theirs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "layers.0.in_proj_weight": torch.randn(3 * H * DH, D, generator=g),
        "layers.0.in_proj_bias": torch.randn(3 * H * DH, generator=g),
        "layers.1.ln_1.weight": torch.randn(D, generator=g),
        "layers.1.mask": torch.zeros(5, 5),
        "proj": torch.randn(D, 7, generator=g),
        "pos_embed": torch.randn(1, 9, D, generator=g),
    }


def test_round_trip_renames_relays_and_passes_the_rest_through():
    theirs = _theirs()
    ours = convert(theirs, _table(), to="ours")
    assert sorted(ours) == [
        "blocks.0.attn.qkv_per_head.bias", "blocks.0.attn.qkv_per_head.weight", "blocks.1.norm1.weight", "pos_embed", "proj.weight",
    ]  # fmt: skip
    assert ours["proj.weight"].shape == (7, D) and ours["proj.weight"].is_contiguous()
    assert torch.equal(ours["proj.weight"], theirs["proj"].T)
    assert torch.equal(ours["blocks.0.attn.qkv_per_head.weight"], heads_first(theirs["layers.0.in_proj_weight"], 3, H))
    assert ours["pos_embed"] is theirs["pos_embed"]  # no layout change: the same tensor
    back = convert(ours, _table(), to="theirs")
    want = {k: v for k, v in theirs.items() if k != "layers.1.mask"}
    assert back.keys() == want.keys()
    for k, v in want.items():
        assert torch.equal(back[k], v), k


def test_an_entry_written_once_converts_both_ways():
    sd = {"layers.3.ffn.up.weight": torch.arange(6.0).reshape(2, 3)}
    without = convert(sd, _table(), to="ours")
    assert list(without) == ["layers.3.ffn.up.weight"]  # passed through unchanged
    table = _table(Rename("blocks.*.mlp.fc1.*", "layers.*.ffn.up.*", lambda t: t * 2, lambda t: t / 2))
    ours = convert(sd, table, to="ours")
    assert list(ours) == ["blocks.3.mlp.fc1.weight"] and torch.equal(ours["blocks.3.mlp.fc1.weight"], sd["layers.3.ffn.up.weight"] * 2)
    back = convert(ours, table, to="theirs")
    assert list(back) == ["layers.3.ffn.up.weight"] and torch.equal(back["layers.3.ffn.up.weight"], sd["layers.3.ffn.up.weight"])


def test_the_first_matching_entry_wins_in_both_directions():
    # the specific QKV entry stands before a general "rest of the block" one, either way round
    table = _table(Rename("blocks.*.**", "layers.*.**"))
    sd = {"layers.0.in_proj_weight": _theirs()["layers.0.in_proj_weight"], "layers.0.out.bias": torch.ones(D)}
    ours = convert(sd, table, to="ours")
    assert sorted(ours) == ["blocks.0.attn.qkv_per_head.weight", "blocks.0.out.bias"]
    assert sorted(convert(ours, table, to="theirs")) == sorted(sd)


@pytest.mark.parametrize(
    "to, key, message",
    [
        ("ours", "layers.0.odd.weight", "lib key 'layers.0.odd.weight' has no vitscale equivalent (only tiny models are supported)"),
        ("theirs", "blocks.0.odd.weight", "vitscale key 'blocks.0.odd.weight' has no lib equivalent"),
    ],
)  # fmt: skip
def test_a_key_no_entry_matches_is_refused_in_one_line(to, key, message):
    with pytest.raises(KeyError) as e:
        convert({key: torch.zeros(1)}, _table(catch_all=False), to=to)
    assert e.value.args[0] == message and "\n" not in message


def test_two_keys_that_become_one_are_refused():
    table = _table(Rename("head.*", "classifier.*"))
    with pytest.raises(KeyError, match=r"lib keys 'classifier.weight' and 'head.weight' both become vitscale key 'head.weight'"):
        convert({"classifier.weight": torch.zeros(1), "head.weight": torch.zeros(1)}, table, to="ours")


def test_malformed_entries_and_directions_are_refused():
    with pytest.raises(ValueError, match="same wildcards"):
        Rename("blocks.*.**", "layers.*")
    with pytest.raises(ValueError, match="both ways or neither"):
        Rename("a", "b", to_ours=transposed)
    with pytest.raises(ValueError, match="'ours' or 'theirs'"):
        convert({}, _table(), to="timm")  # type: ignore[arg-type]


def test_per_head_rows_hold_each_heads_q_k_v_together():
    # rows numbered q0 q1 | k0 k1 | v0 v1 (H=2, Dh=1): per head they read q0 k0 v0 | q1 k1 v1
    stacked = torch.tensor([0.0, 1.0, 10.0, 11.0, 20.0, 21.0])
    to_ours, to_theirs = per_head(3, 2)
    assert to_ours(stacked).tolist() == [0.0, 10.0, 20.0, 1.0, 11.0, 21.0]
    assert torch.equal(to_theirs(to_ours(stacked)), stacked)
    w = torch.randn(2 * 4 * 3, 5)  # KV of 4 heads of width 3, as weights
    assert torch.equal(parts_first(heads_first(w, 2, 4), 2, 4), w)
