"""``vitscale config [GROUP]``: the config groups, or one group's fields with their defaults and docs."""

from __future__ import annotations

import dataclasses
import re
import shutil
import sys
import textwrap

from ..registry import COMMANDS
from . import HelpFormatter

HELP = "list the config groups, or a group's fields with their defaults and what they do"

EPILOG = """\
Examples:
  vitscale config                  (every group, one line each)
  vitscale config optim            (optim.lr, optim.weight_decay, ...: default, type, what it does)
  vitscale config data             (the common data.* fields, then each data format's own)
  vitscale config model --model vit_b16   (model.name, model.overrides and vit_b16's own fields)
Set a field on the command line as GROUP.FIELD=VALUE, e.g. vitscale train digits_vit optim.lr=1e-3, or
in a YAML config under its group. The list is read from the config schema (vitscale/config/schema.py
and the groups of tasks and data formats), so it is the one the loader checks keys against.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "config",
        help=HELP,
        description="List the groups of the run config (no GROUP), or every field of GROUP: its dotted key, "
        "default, type (choices as a | b) and docstring.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    p.add_argument("group", nargs="?", metavar="GROUP", help="a config group, e.g. optim, train, data")
    p.add_argument("--model", metavar="NAME", default=None, help="with GROUP model: list this variant's fields "
                   "(model.<field>), with its values as the defaults (default: model.name's default)")
    p.set_defaults(func=run)


def _plain(doc: str) -> str:
    """A docstring as plain text: ``x`` and :role:`x` markup dropped."""
    return re.sub(r":[a-z]+:`~?([^`]*)`", r"\1", doc).replace("``", "")


def _value(v) -> str:
    """A default as it is written in YAML or an override (floats as Python writes them: 1e-08)."""
    import yaml

    from vitscale.config import config_to_dict

    if isinstance(v, float):
        return repr(v)
    text = yaml.safe_dump(config_to_dict(v), default_flow_style=True, width=1 << 30).strip()
    text = text.removesuffix("...").strip()  # a plain scalar ends with YAML's end-of-document marker
    return text if len(text) <= 100 else text[:97] + "..."


def _print_fields(fields, width: int) -> None:
    for f in fields:
        print(f"{f.key} = {_value(f.default)}  ({f.type})")
        for para in _plain(f.doc or "(no docstring)").split("\n\n"):
            print(textwrap.fill(" ".join(para.split()), width, initial_indent="    ", subsequent_indent="    "))


def _print_evaluators(width: int) -> None:
    """``evals:`` is a list: the fields every entry has, then each registered evaluator kind with the
    fields of its own."""
    from vitscale.config.fields import fields_of
    from vitscale.eval.evaluator import EVALUATORS, EvaluatorConfig

    print("evals: a list of evaluations, each entry a mapping with `kind` and the fields of its kind, e.g.\n"
          "  evals: [{kind: classification, name: val, every: 100}, {kind: fewshot, name: probe5, shots: [5]}]\n\n"
          "Every entry:")  # fmt: skip
    common = fields_of(EvaluatorConfig(), "  ")
    _print_fields(common, width)
    shared = {f.key for f in common}
    for kind, cls in EVALUATORS.items():
        doc = (cls.config.__doc__ or "").strip().split("\n\n")[0]
        doc = " ".join(re.sub(rf"^``kind: {re.escape(kind)}``:\s*", "", doc).split())
        print(f"\nkind: {kind} — {_plain(doc)}")
        own = [f for f in fields_of(cls.config(kind=kind), "  ") if f.key not in shared]
        _print_fields(own, width) if own else print("  (no fields of its own)")


def _print_data(width: int) -> None:
    """``data``: the fields every format has, then each data format with the fields its class adds,
    which are written as ``data.<field>`` like the others."""
    from vitscale.config.data import DataConfig, data_config
    from vitscale.config.fields import fields_of
    from vitscale.data.formats import FORMATS

    print("The fields of every data format:")
    names = {f"data.{f.name}" for f in dataclasses.fields(DataConfig)}
    common = [f for f in fields_of(data_config(), "data.") if f.key in names]  # the default format's values
    _print_fields(common, width)
    shared = {f.key for f in common}
    for name, fmt in FORMATS.items():
        print(f"\ndata.format={name} — {_plain(fmt.summary)}" if fmt.summary else f"\ndata.format={name}")
        own = [f for f in fields_of((fmt.config or DataConfig)(format=name), "data.") if f.key not in shared]
        _print_fields(own, width) if own else print("  (no fields of its own)")


def run(args) -> int:
    from vitscale.config.fields import fields_of, group_defaults, groups
    from vitscale.config.schema import ModelConfig

    width = min(shutil.get_terminal_size().columns, 100)
    if args.group is None:
        rows = groups()
        pad = max(len(name) for name, _ in rows) + 2
        print("The groups of the run config (vitscale config GROUP lists a group's fields):")
        for name, doc in rows:
            print(f"  {name:<{pad}}{_plain(doc)}")
        print("Set a field as GROUP.FIELD=VALUE, e.g. vitscale train digits_vit optim.lr=1e-3.")
        return 0
    if args.group == "evals":
        _print_evaluators(width)
        return 0
    if args.group == "data":
        _print_data(width)
        return 0
    _print_fields(fields_of(group_defaults(args.group), f"{args.group}."), width)
    if args.group == "model":
        from vitscale.models.registry import resolve_model

        name = args.model or ModelConfig.name
        variant = resolve_model(name)  # an unknown name fails here, naming the closest
        family = variant.family.name
        print(f"\nThe fields of {name}'s config ({family} family), set as model.<field> (short for "
              f"model.overrides.<field>); the defaults are {name}'s:")  # fmt: skip
        _print_fields(fields_of(variant.cfg, "model."), width)
    return 0


COMMANDS.register("config", sys.modules[__name__])
