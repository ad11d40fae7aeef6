"""Functions run inside the spawned ranks of the distributed tests (and once on one process)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import torch
import torch.nn.functional as F

GLOBAL_BATCH = 8


def make_cfg(ac: str = "none", ac_method: str = "block", ac_num_layers: int = 0) -> dict:
    """The parallel / precision settings of ``vitscale.run.build_model``."""
    from vitscale.distributed.config import ParallelConfig, PrecisionConfig

    return dict(
        parallel=ParallelConfig(activation_checkpointing=ac, ac_method=ac_method, ac_num_layers=ac_num_layers),
        precision=PrecisionConfig(param_dtype="float32", reduce_dtype="float32"),
    )


def batches(model_cfg, steps: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(GLOBAL_BATCH, model_cfg.num_channels, model_cfg.img_h, model_cfg.img_w, generator=g)
        y = torch.randint(0, model_cfg.num_classes, (GLOBAL_BATCH,), generator=g)
        yield x, y


def train_curve(layout: dict, name: str, overrides: dict, steps: int, ac: str = "none", lr: float = 2e-3,
                optimizer: str = "adamw"):  # fmt: skip
    """Train ``steps`` AdamW (or ``lamb``: vitscale's LAMB, whose trust ratio needs whole-tensor norms
    of sharded parameters) steps on fixed random batches; returns the global-mean loss per step.

    Each data-parallel rank takes its slice of the global batch (TP ranks share one slice), so the
    mean of the local losses over data-parallel ranks is the one-process loss of the full batch.
    """
    import torch.distributed as dist

    from vitscale.distributed import init_distributed
    from vitscale.run import build_model

    dims = init_distributed(NS(**layout), "cpu")
    model = build_model(name, dims, **make_cfg(ac), seed=0, init="reference", overrides=overrides)
    if optimizer == "lamb":
        from vitscale.train.lamb import Lamb

        opt = Lamb(model.parameters(), lr=lr, weight_decay=0.05)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    losses = []
    n = GLOBAL_BATCH // dims.dp_size
    for x, y in batches(model.cfg, steps):
        sl = slice(dims.dp_rank * n, (dims.dp_rank + 1) * n)
        loss = F.cross_entropy(model(x[sl]), y[sl])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.detach().clone()
        if dims.distributed:
            dist.all_reduce(value)  # TP ranks hold identical losses: the mean over all ranks is the DP mean
            value /= dims.world_size
        losses.append(value.item())
    return losses


def curves_for_layouts(cases: list[tuple[str, dict, str, dict, int]]):
    """Run several (label, layout, name, overrides, steps[, ac[, optimizer]]) cases in one process group."""
    out = {}
    for case in cases:
        label, layout, name, overrides, steps, *rest = case
        out[label] = train_curve(layout, name, overrides, steps, ac=rest[0] if rest else "none",
                                 optimizer=rest[1] if len(rest) > 1 else "adamw")  # fmt: skip
    return out


def sharded_init_fingerprint(layout: dict, name: str, overrides: dict):
    """Sharded (layout-dependent) initialisation on CPU: per parameter, whether it is sharded over
    TP and the sum of this rank's local values."""
    from vitscale.distributed import init_distributed
    from vitscale.distributed.init import is_tp_sharded
    from vitscale.run import build_model

    dims = init_distributed(NS(**layout), "cpu")
    model = build_model(name, dims, **make_cfg(), seed=0, init="sharded", overrides=overrides)
    return {n: (is_tp_sharded(p), p.to_local().double().sum().item()) for n, p in model.named_parameters()}
