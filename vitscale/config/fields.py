"""The run config as a person reads it (``vitscale config [GROUP]``): its groups and each group's fields
with their types, defaults and docstrings, read from the dataclasses of the schema.

The schema is the truth: the groups are the fields of the root config classes (``Config`` and each
task's subclass: a task's group shows up as any other), a field's docstring
is the string literal under it in its dataclass, its choices are its ``Literal[...]`` type.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .schema import config_classes


@dataclass(frozen=True)
class Field:
    """One config field, for reading."""

    key: str
    """Its dotted key (``optim.lr``)."""
    type: str
    """Its type as a person writes the value (``float``, ``adamw | adam | sgd``, ``int | None``)."""
    default: Any
    """Its default value."""
    doc: str
    """Its docstring ("" when it has none)."""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field name: docstring}`` of a dataclass: the string literal under each field (its bases'
    fields included). A class whose source cannot be read (made at run time) gives no docstrings."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):  # fmt: skip
                docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def type_text(tp: Any) -> str:
    """A field's type as a person writes its value: choices as ``a | b``, unions with ``| None``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(map(str, args))
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        return " | ".join("None" if a is type(None) else type_text(a) for a in args)
    if origin in (tuple, list):
        if args and args[-1] is Ellipsis:
            return f"list of {type_text(args[0])}"
        return f"{len(args)} values" if origin is tuple and args else "list"
    if origin is dict or tp is dict:
        return "mapping"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def groups() -> list[tuple[str, str]]:
    """``(group, first line of its docstring)`` for every group of the run config — the common ones and
    every known task's (the fields of each task's root class: :func:`~vitscale.config.schema.config_classes`)
    — in schema order, and ``evals`` (the list of evaluations)."""
    return [(name, doc) for name, (doc, _) in _groups().items()]


def _groups() -> dict[str, tuple[str, type]]:
    """``{group: (first line of its docstring, the root class that has it)}``."""
    out: dict[str, tuple[str, type]] = {}
    for root in config_classes():
        docs = field_docs(root)
        hints = typing.get_type_hints(root)
        for f in dataclasses.fields(root):
            if f.name not in out and (f.name == "evals" or dataclasses.is_dataclass(hints[f.name])):
                doc = docs.get(f.name) or inspect.getdoc(hints[f.name]) or ""
                out[f.name] = (doc.split("\n", 1)[0], root)
    return out


def group_defaults(group: str) -> Any:
    """The default value of ``group`` (``Config().optim``; a task's group: its root class's); a
    :class:`~vitscale.errors.ConfigError` naming the groups when there is no such group."""
    found = _groups()
    if group not in found:
        import difflib

        names = list(found)
        close = difflib.get_close_matches(group, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"no config group {group!r}; {hint}the groups: {', '.join(names)}")
    return getattr(found[group][1](), group)


def fields_of(obj: Any, prefix: str) -> list[Field]:
    """Every field of the dataclass instance ``obj`` under ``prefix`` (``optim.``), with ``obj``'s values
    as the defaults (``Config().optim``: the schema's; a model variant's config: the variant's); nested
    dataclasses are expanded (``model.vision.num_layers``)."""
    docs = field_docs(type(obj))
    hints = typing.get_type_hints(type(obj))
    out: list[Field] = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out.extend(fields_of(value, f"{prefix}{f.name}."))
        else:
            out.append(Field(f"{prefix}{f.name}", type_text(hints[f.name]), value, docs.get(f.name, "")))
    return out


__all__ = ["Field", "field_docs", "fields_of", "group_defaults", "groups", "type_text"]
