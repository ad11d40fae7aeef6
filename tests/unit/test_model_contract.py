"""Every registered family implements the model contract (vitscale/models/contract.py), gives the
parallelize tail a plan that covers its blocks, and has a spec whose every slot resolves — checked on
each family's debug variant."""

from __future__ import annotations

import pytest
import torch

from vitscale.distributed.parallelize import ParallelPlan
from vitscale.models.common.flops import count_flops
from vitscale.models.contract import Model, Tokens, VariantConfig, check_model, contract_members
from vitscale.models.registry import create_model, families, family_of, forward_flops, parallel_plan

FAMILIES = sorted(families())


def _debug(family: str) -> str:
    name = f"{family}_debug"
    assert name in families()[family].variants, f"family {family!r} has no {name} variant (tests build it)"
    return name


@pytest.mark.parametrize("family", FAMILIES)
def test_family_model_implements_the_contract(family):
    torch.manual_seed(0)
    model = create_model(_debug(family)).eval()
    check_model(model)
    assert isinstance(model, Model) and isinstance(model.cfg, VariantConfig)
    assert family_of(model).name == family and family_of(model.cfg).name == family
    inputs = model.example_inputs(2, "cpu")
    images = inputs[0]
    assert images.shape == (2, model.cfg.num_channels, model.cfg.img_h, model.cfg.img_w)
    with torch.no_grad():
        model(*inputs)  # one forward call of the model's own inputs
        # grad checkpointing changes no output
        feats = model.forward_features(images)
        model.set_grad_checkpointing(True)
        torch.testing.assert_close(model.forward_features(images), feats)
        model.set_grad_checkpointing(False)
    names = {n for n, _ in model.named_parameters()}
    assert all(any(n == s or n.startswith(s + ".") for n in names) for s in model.no_weight_decay())
    assert model.head_parameter_names() <= names
    # the FLOPs its family states are those PyTorch's counter finds in one forward call on meta, in
    # training mode (training=True) and in eval mode
    meta = create_model(_debug(family), device="meta")
    for training in (True, False):
        counted = count_flops(meta.train(training), *meta.example_inputs(1, "meta"))
        assert forward_flops(model, training=training) == counted > 0
    h, w = model.cfg.img_h, model.cfg.img_w
    assert forward_flops(model.cfg, (2 * h, 2 * w)) > forward_flops(_debug(family))
    # a new classifier on the pooled features
    model.reset_classifier(3)
    assert model.num_classes == 3 and model.head_parameter_names()
    with torch.no_grad():
        assert model.forward_head(model.forward_features(images)).shape == (2, 3)


@pytest.mark.parametrize("family", FAMILIES)
def test_dense_logits_or_a_named_refusal(family):
    torch.manual_seed(0)
    model = create_model(_debug(family)).eval()
    images = model.example_inputs(2, "cpu")[0]
    if model.supports_dense:
        with torch.no_grad():
            cls, tok = model(images, dense=True)
        grid = model.token_grid(tuple(images.shape[-2:]))
        assert cls.shape == (2, model.num_classes) and tok.shape == (2, *grid, model.num_classes)
    else:
        with pytest.raises(NotImplementedError, match=type(model).__name__):
            model.forward_dense(images)
        with pytest.raises(NotImplementedError, match=type(model).__name__):
            model.token_grid(tuple(images.shape[-2:]))


@pytest.mark.parametrize("family", FAMILIES)
def test_tokens_and_intermediates_or_a_named_refusal(family):
    """What a family declares (``supports_tokens``, ``supports_intermediates``) it gives through the
    call; what it does not, its methods refuse naming the model."""
    torch.manual_seed(0)
    model = create_model(_debug(family)).eval()
    assert isinstance(model.supports_tokens, bool) and isinstance(model.supports_intermediates, bool)
    images = model.example_inputs(2, "cpu")[0]
    if model.supports_tokens:
        grid = (model.cfg.img_h // model.cfg.patch_dim, model.cfg.img_w // model.cfg.patch_dim)
        n = grid[0] * grid[1]
        with torch.no_grad():
            t = model(images, tokens=True)
            kept = model(images, tokens=True, keep=torch.arange(1, n, 2)[None].expand(2, -1))
            torch.testing.assert_close(t.pooled, model(images, pre_logits=True), rtol=0, atol=0)
        assert isinstance(t, Tokens) and t.grid == grid and t.patches.shape[:2] == (2, n)
        assert t.prefix.shape[:2] == (2, t.num_prefix) and t.sequence.shape[1] == t.num_prefix + n
        assert kept.patches.shape[1] == n // 2 and kept.sequence.shape[1] == kept.num_prefix + n // 2
    else:
        with pytest.raises(NotImplementedError, match=type(model).__name__):
            model.forward_tokens(images)
    if model.supports_intermediates:
        with torch.no_grad():
            out = model(images, intermediates=model.cfg.num_layers)
        assert len(out) == model.cfg.num_layers and out[-1].shape[1] == model.cfg.num_prefix_tokens + t.patches.shape[1]
    else:
        with pytest.raises(NotImplementedError, match=type(model).__name__):
            model.forward_intermediates(images, 1)


def test_the_families_that_have_tokens_declare_them():
    declared = {name: spec.model_cls.supports_tokens for name, spec in families().items()}
    assert declared["vit"] and not declared["volo"] and not declared["naflex"] and not declared["clip"]


@pytest.mark.parametrize("family", FAMILIES)
def test_family_initialises_after_to_empty(family):
    torch.manual_seed(0)
    model = create_model(_debug(family), device="meta")
    model.to_empty(device="cpu")
    model.init_weights()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(torch.isfinite(b).all() for b in model.buffers() if b.is_floating_point())


@pytest.mark.parametrize("family", FAMILIES)
def test_parallel_plan_covers_the_blocks(family):
    plan = parallel_plan(family)
    assert isinstance(plan, ParallelPlan)
    model = create_model(_debug(family), device="meta")
    stacks = plan.blocks(model)
    blocks = [b for stack in stacks for b in stack]
    assert blocks and len({id(b) for b in blocks}) == len(blocks)  # each block once
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    extra = {id(p) for u in plan.fsdp_units(model) for p in u.parameters()}
    params = list(model.parameters())
    # blocks and extra units are disjoint parts of the model; the root FSDP unit keeps the rest
    assert not in_blocks & extra and (in_blocks | extra) < {id(p) for p in params}
    modules = {id(m) for m in model.modules()}
    assert all(id(b) in modules for b in blocks)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_slot_of_the_spec_resolves(family):
    """Every slot a FamilySpec fills works: its adapters, its tokenizer, its plan, its own counts."""
    spec = families()[family]
    for library in spec.adapters:
        assert spec.adapter(library).library == library
    if spec.tokenizer is not None:
        tokens = spec.create_tokenizer(8)(["a photo of a cat"])
        assert tokens.shape == (1, 8) and tokens.dtype == torch.int64
    model = create_model(_debug(family), device="meta")
    memory, plan = spec.memory_model(), spec.plan()
    total, sharded, unit = memory.param_counts(model, plan)
    assert total == sum(p.numel() for p in model.parameters()) and 0 < unit <= total and 0 <= sharded <= total
    held, rebuilt = memory.activation_elems(model, plan, 1, "full")
    assert held > 0 and rebuilt > 0
    assert [g.input for g in spec.serving_graphs(create_model(_debug(family)).eval()).graphs][0] == "image"


def test_the_contract_names_its_members():
    members = contract_members()
    for name in ("cfg", "init_weights", "forward_features", "forward_head", "no_weight_decay",
                 "head_parameter_names", "reset_classifier", "set_grad_checkpointing", "example_inputs",
                 "supports_dense", "forward_dense", "token_grid", "supports_tokens", "forward_tokens",
                 "supports_intermediates", "forward_intermediates"):  # fmt: skip
        assert name in members
    with pytest.raises(TypeError, match="missing"):
        check_model(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("pool", ["token", "avg"])
def test_dense_class_logits_of_a_vit_are_those_of_a_plain_call(pool):
    torch.manual_seed(0)
    model = create_model("vit_debug", pool=pool, class_token=pool == "token", num_classes=5).eval()
    images = model.example_inputs(2, "cpu")[0]
    with torch.no_grad():
        cls, tok = model(images, dense=True)
        torch.testing.assert_close(cls, model(images))
    assert tok.shape == (2, *model.token_grid(tuple(images.shape[-2:])), 5)
