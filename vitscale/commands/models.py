"""``vitscale models``: the model zoo as a table (name, family, params, GFLOPs, image size, patch).

The built-in variants' rows are declared facts, read from ``vitscale/models/zoo.json``: building 47
models on the meta device and importing torch and every family took 15 s on a loaded 2-core machine
(torch's import alone takes 2 to 3 s there), so the table is printed without importing either.
``scripts/make_zoo.py`` writes the file from the models themselves (:func:`measured_row`: parameters
counted on a model built on the meta device, FLOPs from the family's own count), and
``tests/unit/test_models_command.py`` fails when a row differs from what the code builds. A family or
variant the file does not list (a plug-in's, ``vitscale --import MODULE``; one added since the file
was written) is measured here, as the file's rows were.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from pathlib import Path

from ..registry import COMMANDS, FAMILIES

HELP = "list the model zoo"

ZOO = Path(__file__).resolve().parent.parent / "models" / "zoo.json"
"""The built-in variants' rows (written by ``scripts/make_zoo.py``)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models",
        help=HELP,
        description="Print every registered model: parameters (counted on a model built on the meta device), "
        "forward GFLOPs per sample as inference runs it (2 FLOPs per multiply-add, attention included; CLIP: "
        "image + text tower; the count behind MFU, see docs/benchmarks.md), image size, patch. The built-in "
        "variants' rows come from vitscale/models/zoo.json (checked against the models by the tests); a "
        "plug-in's are measured.",
    )
    p.add_argument("pattern", nargs="?", default=None, help="glob filter, e.g. 'vit_*'")
    p.add_argument("--family", default=None, help=f"only this family ({', '.join(FAMILIES.names())})")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    p.set_defaults(func=run)


def measured_row(family: object, name: str) -> dict:
    """Variant ``name`` of ``family`` (a :class:`~vitscale.models.spec.FamilySpec`) measured: its
    parameters counted on the model built on the meta device (nothing allocated), its forward FLOPs
    per sample from the family's count (None where the family cannot count them)."""
    cfg = family.variants[name]
    model = family.model_cls(cfg, device="meta")  # as create_model(name, device="meta"): no initialisation
    params = sum(p.numel() for p in model.parameters())
    try:
        flops = int(family.forward_flops(cfg))
    except (TypeError, NotImplementedError):
        flops = None
    return dict(name=name, family=family.name, params=params, flops=flops, img_size=cfg.img_h, patch=cfg.patch_dim,
                config=config_digest(cfg))


def config_digest(cfg: object) -> str:
    """A variant config's fingerprint (the first 16 hex digits of the SHA-256 of its ``repr``, every
    field's value): a row of ``zoo.json`` belongs to the config it was measured on only while they agree."""
    import hashlib

    return hashlib.sha256(repr(cfg).encode()).hexdigest()[:16]


def declared_rows() -> dict[str, list[dict]]:
    """``{family: [row, ...]}`` of ``zoo.json`` (empty when the file is missing: every row measured)."""
    try:
        return json.loads(ZOO.read_text())["families"]
    except FileNotFoundError:
        return {}


def zoo_rows(pattern: str | None = None, family: str | None = None) -> list[dict]:
    """Every registered variant's row (in ``vitscale models``' order: the built-in families, then the
    others) whose name matches the glob ``pattern``, of ``family`` (None: all): ``name``, ``family``,
    ``params``, ``flops`` (None: not counted), ``img_size``, ``patch``, ``config``
    (:func:`config_digest`). A built-in family not imported yet is read from ``zoo.json`` and stays
    unimported; one already imported (a plug-in may add or change a variant) is compared with the file
    variant by variant, and a row the file lacks or holds for another config is measured."""
    declared = declared_rows()
    rows: list[dict] = []
    for fam_name in FAMILIES.names():
        if family not in (None, fam_name):
            continue
        listed = declared.get(fam_name)
        spec = FAMILIES.entries.get(fam_name)
        if listed is not None and spec is None and fam_name in FAMILIES.builtin:
            rows += [r for r in listed if pattern is None or fnmatch.fnmatch(r["name"], pattern)]
            continue
        spec = spec or FAMILIES.get(fam_name)  # a built-in family the file does not list: import it
        by_name = {r["name"]: r for r in listed or ()}
        for n, cfg in spec.variants.items():
            if pattern is None or fnmatch.fnmatch(n, pattern):
                row = by_name.get(n)
                rows.append(row if row is not None and row["config"] == config_digest(cfg) else measured_row(spec, n))
    return rows


def model_rows(pattern: str | None = None, family: str | None = None) -> list[dict]:
    """The rows as ``vitscale models --json`` prints them (parameters in millions, GFLOPs)."""
    return [dict(name=r["name"], family=r["family"], params_m=r["params"] / 1e6,
                 gflops=None if r["flops"] is None else r["flops"] / 1e9, img_size=r["img_size"], patch=r["patch"])
            for r in zoo_rows(pattern, family)]  # fmt: skip


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
