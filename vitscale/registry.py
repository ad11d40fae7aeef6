"""One registry for everything vitscale looks up by name: model families, tasks, data formats,
evaluators and commands.

A :class:`Registry` holds named objects of one kind. Built-in names map to the module whose import
registers them (imported on the first :meth:`Registry.get` of the name, so ``import vitscale`` loads
none of them); any other module registers its own objects by being imported first — in Python, or
with ``vitscale --import MODULE`` on the command line. An unknown name is a one-line
:class:`~vitscale.errors.ConfigError` naming the config key, the closest known name and the choices.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from .errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Named objects of one kind: ``Registry("task", "train.task", {"classification": "vitscale.tasks.classification"})``."""

    def __init__(self, what: str, key: str, builtin: Mapping[str, str] | None = None, listed_by: str | None = None):
        self.what = what
        """What it holds, for messages: ``task``, ``data format``, ``evaluator``, ..."""
        self.key = key
        """The config key (or command-line word) its names are given under: ``train.task``, ``data.format``."""
        self.builtin: dict[str, str] = dict(builtin or {})
        """Built-in name -> the module whose import registers it (listed first, in this order)."""
        self.entries: dict[str, T] = {}
        """What is registered so far."""
        self.listed_by = listed_by
        """The command that lists the names, said in the unknown-name error instead of the names (too
        many to list: ``vitscale models``); None = the names are listed there."""

    def register(self, name: str, obj: T | None = None) -> Any:
        """Register ``obj`` under ``name`` (and return it); without ``obj``, a decorator that does."""
        if obj is None:
            return lambda o: self.register(name, o)
        self.entries[name] = obj
        return obj

    def find(self, name: Any) -> T | None:
        """The object registered as ``name`` (a built-in one's module imported first), or None."""
        if name not in self.entries and isinstance(name, str) and name in self.builtin:
            importlib.import_module(self.builtin[name])
        return self.entries.get(name)

    def get(self, name: Any, key: str | None = None) -> T:
        """The object registered as ``name``; :class:`ConfigError` (:meth:`unknown`) when there is none."""
        found = self.find(name)
        if found is None:
            raise ConfigError(self.unknown(name, key=key))
        return found

    def unknown(self, name: Any, choices: list[str] | None = None, key: str | None = None) -> str:
        """The one-line error for an unknown ``name``: the key (:attr:`key` unless given), the closest
        name, the choices."""
        known = sorted(self.names() if choices is None else choices)
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        choices = f"{self.listed_by} lists them" if self.listed_by else f"choose one of {', '.join(known)}"
        return f"{key or self.key}: unknown {self.what} {name!r}{hint} ({choices}; a plug-in's: load it with vitscale --import MODULE)"

    def names(self) -> list[str]:
        """Every known name: the built-in ones in their order, then those registered by other modules."""
        return list(self.builtin) + [n for n in self.entries if n not in self.builtin]

    def load_all(self) -> None:
        """Import every built-in module (to list, or search, all entries)."""
        for module in dict.fromkeys(self.builtin.values()):
            importlib.import_module(module)

    def items(self) -> list[tuple[str, T]]:
        """``(name, object)`` of every entry, built-in ones first in their order."""
        self.load_all()
        return [(n, self.entries[n]) for n in self.names() if n in self.entries]

    def __contains__(self, name: Any) -> bool:
        return self.find(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def import_plugins(modules: list[str]) -> None:
    """Import each of ``modules`` (``vitscale --import``) so it registers its objects; a module that
    fails to import is a :class:`ConfigError` naming it and the error."""
    for module in modules:
        if not module or "/" in module or "\\" in module or module.endswith(".py") or module.startswith("."):
            # a path or a relative name (``../x``: a TypeError traceback from importlib before)
            stem = Path(module.rstrip("/\\")).stem or module
            raise ConfigError(f"--import {module}: give a module's name, not a path or a relative name (e.g. "
                              f"PYTHONPATH={Path(module).parent or '.'} vitscale --import {stem} ...)")  # fmt: skip
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"--import {module}: {type(e).__name__}: {e}") from None


# ------------------------------------------------------------------------------ vitscale's registries
# Each kind's built-in names and the modules that register them: only strings here, so any layer (the
# config loader included) looks a name up without importing the packages that hold the objects.
_MODELS = Path(__file__).parent / "models"
_FAMILY_ORDER = ("vit", "clip", "volo", "naflex")  # the order of `vitscale models`; other packages follow
_OTHER_FAMILIES = sorted({m.name for m in pkgutil.iter_modules([str(_MODELS)]) if m.ispkg} - {"common", *_FAMILY_ORDER})

FAMILIES: Registry[Any] = Registry("model", "model.name", {n: f"vitscale.models.{n}" for n in (*_FAMILY_ORDER, *_OTHER_FAMILIES)},
                                   listed_by="`vitscale models`")  # fmt: skip
"""Model families (:class:`vitscale.models.spec.FamilySpec`) by family name; a new package under
``vitscale/models/`` registers its family with no edit here. :func:`model_family` also takes a variant name."""

TASKS: Registry[Any] = Registry("task", "train.task", {
    "classification": "vitscale.tasks.classification",
    "contrastive": "vitscale.tasks.contrastive",
    "token_labeling": "vitscale.tasks.token_labeling",
    "mae": "vitscale.tasks.mae",
    "dino": "vitscale.tasks.dino",
    "feature_distill": "vitscale.tasks.feature_distill",
})  # fmt: skip
"""Tasks (:class:`vitscale.tasks.Task` subclasses), ``train.task``."""

FORMATS: Registry[Any] = Registry("data format", "data.format", {
    "digits": "vitscale.data.digits",
    "digits_aspect": "vitscale.data.digits",
    "images": "vitscale.data.images",  # before imagefolder: `data inspect` calls a folder holding images itself "images"
    "imagefolder": "vitscale.data.imagefolder",
    "synthetic": "vitscale.data.synthetic",
    "webdataset": "vitscale.data.webdataset",
    "csv": "vitscale.data.csv",
    "parquet": "vitscale.data.parquet",
})  # fmt: skip
"""Data formats (:class:`vitscale.data.formats.DataFormat`), ``data.format``."""

EVALUATORS: Registry[Any] = Registry("evaluator", "kind", {
    "classification": "vitscale.eval.classification",
    "class_subset": "vitscale.eval.subset",
    "real": "vitscale.eval.real",
    "zeroshot": "vitscale.eval.zeroshot",
    "retrieval": "vitscale.eval.retrieval",
    "linear_probe": "vitscale.eval.probe",
    "fewshot": "vitscale.eval.probe",
    "knn": "vitscale.eval.knn",
    "sizes": "vitscale.eval.sizes",
    "feature_distill": "vitscale.tasks.feature_distill_eval",
})  # fmt: skip
"""Evaluators (:class:`vitscale.eval.evaluator.Evaluator` subclasses), the ``kind`` of an ``evals:`` entry."""

TASK_COMMANDS: dict[str, str] = {
    "label-tokens": "vitscale.tasks.token_labeling_command",
}
"""The commands a built-in task brings (its teacher's job: token labeling's ``label-tokens``), command
name -> the task's module that registers it in :data:`COMMANDS` (``HELP``, ``register``; importing
nothing heavy at its top). A plug-in task's module registers its command itself."""

COMMANDS: Registry[Any] = Registry("command", "vitscale", {
    **{name.replace("_", "-"): f"vitscale.commands.{name}"
       for name in ("demo", "train", "config", "eval", "export", "report", "data", "models", "bench", "bench_data",
                    "convert", "memory")},
    **TASK_COMMANDS,
})  # fmt: skip
"""Commands, in the order ``vitscale --help`` lists them: objects with ``HELP`` (their line there) and
``register(subparsers)``; a generic one is its module under ``vitscale.commands``, a task's its module
under ``vitscale.tasks`` (:data:`TASK_COMMANDS`)."""


def model_family(name: str) -> Any:
    """The family of a variant name, or of a family name; ConfigError naming the closest variant."""
    found = FAMILIES.find(name)
    if found is not None:
        return found
    families = [f for _, f in FAMILIES.items()]
    for f in families:
        if name in f.variants:
            return f
    raise ConfigError(FAMILIES.unknown(name, [v for f in families for v in f.variants]))


__all__ = ["COMMANDS", "EVALUATORS", "FAMILIES", "FORMATS", "TASK_COMMANDS", "TASKS", "Registry", "import_plugins", "model_family"]
