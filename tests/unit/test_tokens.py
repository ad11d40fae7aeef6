"""A backbone's token interface (vitscale/models/contract.py ``Tokens``): ``model(x, tokens=True,
keep=..., mask=...)`` of the ViT gives what DINO and MAE compute today from ``model(x, keep=...)``,
bit for bit; its mask token replaces the masked patches' embeddings as DINO's forward hook on
``patch_embed`` did; the mask token exists only when the config asks for it, and timm weights go
in and out without it."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.utils._pytree import tree_flatten, tree_unflatten

from vitscale.checkpoint import export_safetensors
from vitscale.interop import create_timm_model, to_timm
from vitscale.interop.pretrained import load_pretrained
from vitscale.models.contract import Tokens
from vitscale.models.registry import create_model
from vitscale.models.vit.finetune import layer_decay

# (overrides of vit_debug: 2 blocks of width 64, 8-px patches of 32-px images, a 4 x 4 grid)
BACKBONES = {
    "token": {},
    "avg_registers": {"pool": "avg", "class_token_length": 5},  # fc_norm after pooling, 1 + 4 prefix tokens
    "map_no_prefix": {"pool": "map", "class_token_length": 0},
    "deit": {"distill_token": True},  # the distillation token is a prefix token; pooled = the heads' mean
    # RoPE: each image's kept patches rotated by their own positions
    "rope_registers": {"pos_embed": "rope", "class_token_length": 5, "pos_embed_prefix": False, "key_bias": False},
}


def _images(n=3, side=32):
    return torch.randn(n, 3, side, side, generator=torch.Generator().manual_seed(1))


def _keep(n, total=16, k=7, seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(total, generator=g)[:k] for _ in range(n)])


@pytest.mark.parametrize("name", list(BACKBONES))
def test_tokens_are_the_computations_of_today(name):
    torch.manual_seed(0)
    model = create_model("vit_debug", **BACKBONES[name]).eval()
    x, P = _images(), model.num_prefix_tokens
    with torch.no_grad():
        every = model(x, tokens=True)
        assert isinstance(every, Tokens) and every.grid == (4, 4) and every.num_prefix == P
        assert torch.equal(every.pooled, model(x, pre_logits=True))  # the probes' features
        assert torch.equal(every.sequence, model.forward_features(x))
        assert every.pooled.shape == (3, 64) and every.patches.shape == (3, 16, 64) and every.prefix.shape == (3, P, 64)
        keep = _keep(3)
        kept = model(x, tokens=True, keep=keep)
        seq = model(x, keep=keep)  # what DINO and MAE call today
        assert torch.equal(kept.sequence, seq) and kept.sequence.shape == (3, P + 7, 64)
        assert torch.equal(kept.pooled, model.forward_head(seq, pre_logits=True))  # DINO's _cls
        assert torch.equal(kept.patches, model.fc_norm(seq[:, P:]))  # DINO's _patches
        assert torch.equal(kept.prefix, model.fc_norm(seq[:, :P]))
        if name == "avg_registers":  # normalised after pooling: the tokens through fc_norm, not the sequence's
            assert not torch.equal(kept.patches, seq[:, P:])
        # every index kept, in order: every patch's tokens (DINO's keep=every); shuffled: the same tokens
        # shuffled (each patch keeps its own position, learned or rotary)
        full = model(x, tokens=True, keep=torch.arange(16)[None].expand(3, -1))
        torch.testing.assert_close(full.sequence, every.sequence)
        order = _keep(3, k=16)
        shuffled = model(x, tokens=True, keep=order)
        torch.testing.assert_close(shuffled.patches, every.patches.gather(1, order[..., None].expand(-1, -1, 64)))


def _old_mask_hook(token: torch.Tensor, mask: torch.Tensor):
    """A copy of today's iBOT hook (vitscale/tasks/dino.py ``_mask_hook`` and ``DinoStudent.forward``
    at 4ad6452): a forward hook on ``patch_embed`` putting a ``(D,)`` token in place of the masked
    patches' embeddings of batches of the mask's size."""

    def hook(module, args, out):
        if out.shape[0] != mask.shape[0]:
            return out
        return torch.where(mask[..., None], token.to(out.dtype), out)

    return hook


@pytest.mark.parametrize("name", ["token", "avg_registers", "rope_registers"])
def test_the_mask_replaces_embeddings_as_the_hook_did(name):
    torch.manual_seed(0)
    old = create_model("vit_debug", **BACKBONES[name]).eval()
    model = create_model("vit_debug", mask_token=True, **BACKBONES[name]).eval()
    model.load_state_dict(old.state_dict(), strict=True)  # weights without a mask token: it stays at its init
    assert torch.equal(model.mask_token, torch.zeros(1, 64))
    with torch.no_grad():
        model.mask_token.normal_()  # a trained token, not zeros: the replacement shows
    x = _images(4)
    mask = torch.rand(4, 16, generator=torch.Generator().manual_seed(3)) < 0.4
    mask[0] = False  # an image with no masked patch
    every = torch.arange(16)[None].expand(4, -1)
    handle = old.patch_embed.register_forward_hook(_old_mask_hook(model.mask_token.detach().flatten(), mask))
    try:
        with torch.no_grad():
            ref = old(x, keep=every)
    finally:
        handle.remove()
    with torch.no_grad():
        got = model(x, tokens=True, keep=every, mask=mask)
        assert torch.equal(got.sequence, ref)
        assert torch.equal(got.patches, old.fc_norm(ref[:, old.num_prefix_tokens :]))
        assert torch.equal(got.pooled, old.forward_head(ref, pre_logits=True))
        # no patch masked: the plain tokens; a masked patch changes its image's tokens only
        plain = model(x, tokens=True, keep=every)
        assert torch.equal(model(x, tokens=True, keep=every, mask=torch.zeros_like(mask)).sequence, plain.sequence)
        assert torch.equal(got.sequence[0], plain.sequence[0]) and not torch.equal(got.sequence[1:], plain.sequence[1:])
        # masked before the position embeddings: two masked patches differ by their positions' embeddings
        emb = model._mask(model.patch_embed(x), mask)
        assert torch.equal(emb[mask], model.mask_token.expand(int(mask.sum()), -1))


def test_the_mask_token_trains_through_the_call():
    torch.manual_seed(0)
    model = create_model("vit_debug", mask_token=True).train()
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[:, 5] = True
    out = model(_images(2), tokens=True, mask=mask)
    (out.pooled.sum() + out.patches.sum()).backward()
    assert model.mask_token.grad is not None and model.mask_token.grad.abs().sum() > 0
    model.zero_grad()
    model(_images(2), tokens=True).patches.sum().backward()  # no mask: no gradient reaches it
    assert model.mask_token.grad is None or not model.mask_token.grad.any()


def test_a_mask_without_a_mask_token_or_of_another_shape_is_refused():
    model = create_model("vit_debug").eval()
    x, mask = _images(2), torch.zeros(2, 16, dtype=torch.bool)
    with pytest.raises(ValueError, match="mask_token=True"):
        model(x, tokens=True, mask=mask)
    masked = create_model("vit_debug", mask_token=True).eval()
    with pytest.raises(ValueError, match=r"bool \(batch, patches\) = \(2, 16\)"):
        masked(x, tokens=True, mask=torch.zeros(2, 15, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"bool"):
        masked(x, tokens=True, mask=torch.zeros(2, 16))
    with pytest.raises(ValueError, match="tokens=True"):
        masked(x, mask=mask)


def test_the_mask_token_is_a_parameter_only_when_asked():
    plain, masked = create_model("vit_debug"), create_model("vit_debug", mask_token=True)
    names = set(plain.state_dict())
    assert "mask_token" not in names and set(masked.state_dict()) == names | {"mask_token"}
    assert sum(p.numel() for p in masked.parameters()) - sum(p.numel() for p in plain.parameters()) == 64
    assert masked.mask_token.shape == (1, 64) and not masked.mask_token.any()  # DINOv2's zeros
    assert "mask_token" in masked.no_weight_decay() and "mask_token" not in plain.no_weight_decay()
    assert layer_decay(masked)["mask_token"] == layer_decay(masked)["cls_token"]  # an embedding
    # a DINO run's weights (with the token) load into a model without one, which ignores it
    plain.load_state_dict(masked.state_dict(), strict=True)
    assert "mask_token" not in plain.state_dict()
    with pytest.raises(ValueError, match="NaFlex"):
        create_model("naflex_debug", mask_token=True)
    # only weights of the model itself fill its token: a ViT inside a module (a task's teacher copy)
    # whose weights are not in the file stays missing, nothing is added under its name
    outer = torch.nn.ModuleDict({"student": create_model("vit_debug", mask_token=True),
                                 "teacher": create_model("vit_debug", mask_token=True)})  # fmt: skip
    missing, unexpected = outer.load_state_dict({f"student.{k}": v for k, v in plain.state_dict().items()}, strict=False)
    assert not unexpected and "student.mask_token" not in missing and "teacher.mask_token" in missing


def test_tokens_are_a_pytree_node():
    """FSDP2 finds a call's output tensors by flattening it (the hooks that gather the parameters
    again for backward): the four tensors are leaves, the grid and prefix count context."""
    t = create_model("vit_debug").eval()(_images(2), tokens=True)
    leaves, spec = tree_flatten(t)
    assert [x.shape for x in leaves] == [(2, 64), (2, 1, 64), (2, 16, 64), (2, 17, 64)]
    back = tree_unflatten(leaves, spec)
    assert isinstance(back, Tokens) and back.grid == (4, 4) and back.num_prefix == 1 and back.pooled is t.pooled


@pytest.mark.parametrize("rope", [False, True])
def test_timm_weights_in_and_out_with_a_mask_token(rope, tmp_path):
    """Written for timm without the mask token (timm's ViT / Eva have none), strictly; timm's file
    into a model with one through ``checkpoint.init_from`` (the token at its init); the run's exported
    ``model.safetensors`` converted to timm's file, which timm loads strictly."""
    pytest.importorskip("timm")
    over = {"mask_token": True, **(BACKBONES["rope_registers"] if rope else {})}
    torch.manual_seed(0)
    model = create_model("vit_debug", **over).eval()
    with torch.no_grad():
        model.mask_token.normal_()
    sd = to_timm(model)
    assert "mask_token" not in sd
    tm = create_timm_model(model, load_weights=False).eval()
    tm.load_state_dict(sd, strict=True)
    x = _images(2)
    with torch.no_grad():
        torch.testing.assert_close(tm(x), model(x), rtol=1e-5, atol=1e-5)
    # timm's file -> checkpoint.init_from of a model with a mask token: every other tensor loaded
    path = tmp_path / "timm.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, path)
    fresh = create_model("vit_debug", **over).eval()
    with torch.no_grad():
        fresh.mask_token.fill_(0.5)
    _, lines, report = load_pretrained(fresh, str(path))
    assert not report["missing"] and not report["unexpected"] and "timm" in lines[0]
    assert not fresh.mask_token.any()  # at its init, zeros: timm's weights have none
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))
    # the exported model.safetensors (with the token) -> timm's file, loaded strictly by timm
    from vitscale.interop.library_file import write_library_weights

    exported = tmp_path / "model.safetensors"
    export_safetensors(model, exported, {"model": "vit_debug", "overrides": json.dumps(over)})
    assert "mask_token" in load_file(exported)
    out = write_library_weights(exported, tmp_path / "timm_out.safetensors", "timm")
    tm2 = create_timm_model(model, load_weights=False).eval()
    tm2.load_state_dict(load_file(out), strict=True)
    with torch.no_grad():
        assert torch.equal(tm2(x), tm(x))
