"""vitscale.tools.memory.estimate against what PyTorch actually holds for small models on the CPU:
parameter / gradient / AdamW bytes exactly, activations against the tensors autograd saves for
backward (parameters excluded) within 10%."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vitscale.distributed.activation_checkpoint import apply_activation_checkpointing
from vitscale.models.registry import create_model
from vitscale.tools.memory import estimate, memory_table

B = 4


def saved_activation_bytes(model, x) -> int:
    """Bytes of the distinct storages autograd saves during forward, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum().backward()
    return sum(seen.values())


@pytest.mark.parametrize(
    "name, overrides, ac",
    [
        ("vit_ti16", dict(img_h=64, img_w=64, num_layers=4), "none"),
        ("vit_ti16", dict(img_h=64, img_w=64, num_layers=4), "full"),
        ("vit_debug", dict(qk_norm=True, layer_scale_init=None), "none"),
        # ViT-22B block structure (parallel block, QK-norm, MAP head) at a small width
        ("vit_22b", dict(hidden_size=96, ffn_hidden_size=384, num_attention_heads=3, num_layers=2, img_h=56, img_w=56), "none"),
    ],
)
def test_activation_estimate_matches_saved_tensors(name, overrides, ac):
    torch.manual_seed(0)
    model = create_model(name, **overrides)
    apply_activation_checkpointing(model.blocks, ac)
    c = model.cfg
    measured = saved_activation_bytes(model, torch.randn(B, c.num_channels, c.img_h, c.img_w))
    est = estimate(name, overrides=overrides, micro_batch=B, param_dtype="fp32", ac=ac)
    assert abs(est.activation_bytes - measured) / measured < 0.10, (est.activation_bytes, measured)


def test_states_match_adamw_step_exactly():
    torch.manual_seed(0)
    model = create_model("vit_debug")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    F.cross_entropy(model(torch.randn(2, 3, 32, 32)), torch.tensor([1, 2])).backward()
    opt.step()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    moments = sum(
        v.numel() * v.element_size() for st in opt.state.values() for k, v in st.items() if k in ("exp_avg", "exp_avg_sq")
    )
    est = estimate("vit_debug", micro_batch=2, param_dtype="fp32")
    assert est.params == sum(p.numel() for p in model.parameters())
    assert (est.param_bytes, est.grad_bytes, est.optim_bytes) == (params, grads, moments)
    assert est.unsharded_bytes == 0 and est.overhead_bytes == 0


def test_layouts_shard_states_and_activations():
    one = estimate("vit_l16", micro_batch=16)
    fsdp = estimate("vit_l16", dp_shard=8, micro_batch=16)
    tp = estimate("vit_l16", dp_shard=8, tp=4, micro_batch=16)
    assert fsdp.param_bytes == pytest.approx(one.param_bytes / 8, rel=1e-6)
    assert fsdp.activation_bytes == one.activation_bytes  # FSDP does not split activations
    assert tp.param_bytes < fsdp.param_bytes / 3.5 and tp.activation_bytes < one.activation_bytes / 2
    assert estimate("vit_l16", micro_batch=16, ac="full").total_bytes < one.total_bytes
    with pytest.raises(ValueError, match=r"vit_b16: tp=8 does not split the model: num_attention_heads=12 is not divisible by 8 \(tp that divide it: 1, 2, 3, 4, 6, 12\)$"):
        estimate("vit_b16", tp=8)
    table = memory_table(["vit_b16", "vit_22b"], micro_batch=8)
    assert "| vit_22b |" in table and "n/a" in table  # B/16's 12 heads do not split over TP 8


def test_memory_command(capsys):
    from vitscale.cli import main

    assert main(["memory", "vit_l16", "--dp-shard", "8", "--tp", "4", "--micro-batch", "16", "--ac", "full"]) == 0
    out = capsys.readouterr().out
    assert "vit_l16" in out and "total per rank" in out and "dp_shard=8 tp=4" in out
    assert main(["memory", "vit_b16", "--tp", "8"]) == 2  # 12 heads: an error, not a traceback
    assert "num_attention_heads=12 is not divisible by 8" in capsys.readouterr().err


@pytest.mark.parametrize("recipe, task, extra", [
    ("digits_dino", "dino", ["dino.local_crops_number=1", "dino.head_n_prototypes=32", "dino.head_hidden_dim=32",
                             "dino.head_bottleneck_dim=16", "dino.ibot_separate_head=true"]),
    ("digits_mae", "mae", ["mae.decoder_width=16", "mae.decoder_depth=1", "mae.decoder_heads=2"]),
])  # fmt: skip
def test_task_parts_are_counted_as_the_trainer_builds_them(tmp_path, capsys, recipe, task, extra):
    """``estimate(..., task=)`` counts the parameters the task's trainer attaches (heads, mask token and
    teacher of dino; MAE's decoder), and charges their states: trained parts 16 bytes (fp32 weight,
    gradient, two AdamW moments), the teacher 4 (fp32 weights)."""
    from vitscale.cli import main
    from vitscale.config import load_config
    from vitscale.train.trainer import Trainer

    cfg = load_config(recipe, ["data.num_workers=0", "log.flops=false", "checkpoint.every=0", "eval.every=0",
                               "log.progress=none", "log.report=false", "model.hidden_size=32", "model.ffn_hidden_size=64",
                               "model.num_layers=1", "model.num_attention_heads=2", "train.batch_size=16", *extra,
                               f"train.output_dir={tmp_path / 'run'}"])  # fmt: skip
    t = Trainer(cfg)
    parts = t.module.parts
    trained = sum(p.numel() for n, p in parts.named_parameters() if not n.startswith("teacher."))
    held = sum(p.numel() for n, p in parts.named_parameters() if n.startswith("teacher."))
    assert trained > 0 and (held > 0) == (task == "dino")
    e = estimate(t.model.cfg, task=task, task_cfg=getattr(cfg, task), param_dtype="fp32")
    assert e.task_params == trained + held
    assert e.task_bytes == 16 * trained + 4 * held
    assert e.total_bytes == estimate(t.model.cfg, param_dtype="fp32").total_bytes + e.task_bytes
    assert main(["memory", "vit_b16", "--task", task]) == 0
    assert f"{task} parts (" in capsys.readouterr().out
