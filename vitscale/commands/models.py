"""``vitscale models``: the model zoo as a table (name, family, params, GFLOPs, image size, patch)."""

from __future__ import annotations

import argparse
import json
import sys

from ..registry import COMMANDS, FAMILIES

HELP = "list the model zoo"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models",
        help=HELP,
        description="Print every registered model: parameters (counted on the meta device, nothing is "
        "allocated), forward GFLOPs per sample as inference runs it (2 FLOPs per multiply-add, attention "
        "included; CLIP: image + text tower; the count behind MFU, see docs/benchmarks.md), image size, patch.",
    )
    p.add_argument("pattern", nargs="?", default=None, help="glob filter, e.g. 'vit_*'")
    p.add_argument("--family", default=None, help=f"only this family ({', '.join(FAMILIES.names())})")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    p.set_defaults(func=run)


def _no_init():
    """Parameter initialisation skipped while the meta models are built: their values do not exist, and
    drawing them (every Linear's Kaiming-uniform on the meta device) was a third of the command's time."""
    import contextlib

    import torch.nn.init as init

    names = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
             "xavier_normal_", "zeros_", "ones_", "constant_")  # fmt: skip
    stack = contextlib.ExitStack()
    from unittest import mock

    for n in names:
        if hasattr(init, n):
            stack.enter_context(mock.patch.object(init, n, lambda tensor, *a, **k: tensor))
    return stack


def model_rows(pattern: str | None = None, family: str | None = None) -> list[dict]:
    """Every variant's row; the FLOPs from each family's analytic count (``FamilySpec.flops``), the
    parameters counted on a meta model built without initialisation."""
    from ..models.registry import create_model, forward_flops, get_family, list_models

    rows = []
    for name in list_models(pattern, family):
        fam = get_family(name)
        with _no_init():
            model = create_model(name, device="meta")
        n = sum(p.numel() for p in model.parameters())
        cfg = fam.variants[name]
        img, patch = cfg.img_h, cfg.patch_dim  # CLIP: its vision tower's
        try:
            gflops = forward_flops(model) / 1e9
        except (TypeError, NotImplementedError):
            gflops = None
        rows.append(dict(name=name, family=fam.name, params_m=n / 1e6, gflops=gflops, img_size=img, patch=patch))
    return rows


def run(args: argparse.Namespace) -> int:
    rows = model_rows(args.pattern, args.family)
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    w = max([16, *(len(r["name"]) + 2 for r in rows)])  # the longest name still leaves a gap
    print(f"{'model':<{w}}{'family':<8}{'params (M)':>12}{'GFLOPs':>11}{'image':>8}{'patch':>7}")
    for r in rows:
        gf = f"{r['gflops']:.2f}" if r["gflops"] is not None else "-"
        print(f"{r['name']:<{w}}{r['family']:<8}{r['params_m']:>12.2f}{gf:>11}{r['img_size']!s:>8}{r['patch']!s:>7}")
    return 0


COMMANDS.register("models", sys.modules[__name__])
