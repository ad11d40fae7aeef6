"""Load a :class:`~vitscale.config.schema.Config`: defaults <- YAML <- dotted overrides.

``load_config("digits_vit", ["train.max_steps=10", "model.hidden_size=128"])``. A config is a YAML
path or a built-in name looked up in ``configs/`` (repo root, then the current directory) and in
the package's ``vitscale/configs/``. An unknown key fails before anything runs and names the closest
valid key; a value of the wrong type names the field, and a word that is not one of a field's
choices (its ``Literal[...]`` type in the schema, the one place the choices are declared) lists them.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..registry import TASKS, model_family
from ..safe_yaml import YAMLLimitError, load_yaml, read_yaml
from ..shell import SHELL_FLAG, shell_value
from .data import DataConfig
from .evals import EvaluatorConfig, check_entries, metric_prefix
from .kinds import kind_owners, unknown_kind_field
from .ranges import check_ranges
from .schema import Config, ModelConfig, config_class, config_classes


# ---------------------------------------------------------------------------------------- finding
def config_dirs() -> list[Path]:
    """Where built-in config names are looked up, in order."""
    pkg = Path(__file__).resolve().parent.parent  # vitscale/
    dirs = [pkg.parent / "configs", Path.cwd() / "configs", pkg / "configs"]
    out: list[Path] = []
    for d in dirs:
        if d not in out:
            out.append(d)
    return out


def builtin_configs() -> list[str]:
    names: set[str] = set()
    for d in config_dirs():
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def _check_shadowing(stem: str, found: list[Path]) -> None:
    """A ``configs/<name>.yaml`` in the working folder that differs from the built-in recipe of that
    name (the package's, in an installed vitscale) is refused rather than used in its place without a
    word: the path says which one is meant."""
    cwd = (Path.cwd() / "configs").resolve()
    if cwd == (Path(__file__).resolve().parent.parent.parent / "configs").resolve():  # the checkout's own recipes
        return
    mine = [f for f in found if f.parent.resolve() == cwd]
    builtin = [f for f in found if f.parent.resolve() != cwd]
    if mine and builtin and mine[0].read_bytes() != builtin[-1].read_bytes():
        raise ConfigError(f"{stem!r} names both the built-in recipe ({builtin[-1]}) and configs/{stem}.yaml in the working "
                          f"folder, which differ: give the path to use yours (configs/{stem}.yaml), or rename it")  # fmt: skip


def find_config(name_or_path: str | os.PathLike) -> Path:
    """A YAML path, or the file of a built-in config name (``digits_vit``)."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    stem = p.name[: -len(".yaml")] if p.name.endswith(".yaml") else p.name
    found = [d / f"{stem}.yaml" for d in config_dirs() if (d / f"{stem}.yaml").is_file()]
    if found:
        _check_shadowing(stem, found)
        return found[0]
    close = difflib.get_close_matches(stem, builtin_configs(), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else f" Built-in configs: {', '.join(builtin_configs())}."
    raise ConfigError(f"no config file or built-in config named {str(name_or_path)!r}.{hint}")


# ---------------------------------------------------------------------------------------- merging
def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b=1e-3"`` -> (["a", "b"], 0.001). Values are YAML scalars/lists; ``a.b=`` is ""."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key=value (e.g. train.max_steps=100)")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("-")
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = "" if raw == "" else load_yaml(raw, f"override {key}")
    except YAMLLimitError:
        raise
    except ConfigError:  # not YAML: the text as it is
        value = raw
    return key.split("."), value


def _set_dotted(tree: dict, path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[path[-1]] = value


def _merge(base: dict, update: dict) -> dict:
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v
    return base


# ---------------------------------------------------------------------------------------- typing
def _all_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        keys.append(path)
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            keys.extend(_all_keys(tp, path + "."))
    return keys


def _suggest(path: str, valid_here: list[str], prefix: str) -> str:
    leaf = path.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(leaf, valid_here, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {prefix + close[0]!r}?"
    everything = list(dict.fromkeys(k for root in config_classes() for k in _all_keys(root)))
    by_leaf = [k for k in everything if k.rsplit(".", 1)[-1] == leaf]
    if by_leaf:
        return f"; did you mean {by_leaf[0]!r}?"
    close = difflib.get_close_matches(path, everything, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else f"; valid keys here: {', '.join(valid_here)}"


def option_hint(args: list[str]) -> str | None:
    """For command-line options that name a config field — ``--lr 1e-3``, ``--optim.lr=1e-3``,
    ``--max-steps 5`` (by the field's dotted key or its last part) — the override to write instead
    (``"--lr 1e-3 is not an option: write optim.lr=1e-3"``); None when no option names a field."""
    keys = list(dict.fromkeys(k for root in config_classes() for k in _all_keys(root)))  # every task's groups
    fields = [k for k in keys if not any(o.startswith(k + ".") for o in keys)]  # not the groups
    i = 0
    while i < len(args):
        given, i = args[i], i + 1
        if not given.startswith("--"):
            continue
        name, eq, value = given[2:].partition("=")
        if not eq and i < len(args) and not args[i].startswith("--"):
            value, given, i = args[i], f"{given} {args[i]}", i + 1
        key = name.replace("-", "_")
        found = [key] if key in fields or key.startswith("model.") else [k for k in fields if k.rsplit(".", 1)[-1] == key]
        if found:
            value = value or "VALUE"
            more = f" (or {', '.join(f'{k}={value}' for k in found[1:])})" if len(found) > 1 else ""
            return f"{given} is not an option: write {found[0]}={value}{more}"
    return None


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """``value`` checked against the annotation ``tp`` (ints widen to float, lists to tuples)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin is typing.Literal:  # the field's choices, declared once in the schema
        if value in args and not isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: {value!r} is not one of {', '.join(map(str, args))}")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:  # ``X | None``: X's own error (it names the entry and field at fault)
            return _coerce(value, members[0], path)
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, path)
            except ConfigError:
                continue  # the next member of the union; none fits: the error below names the union
        raise ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping of {tp.__name__} fields, got {value!r}")
        if hasattr(tp, "kind_config"):  # a group whose class its kind chooses (``data.format``, an entry's ``kind``)
            tp, value = _kind_class(tp, value, path)
        return _build(tp, value, path + ".")
    if origin in (tuple, list):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and args and args[-1] is Ellipsis:
            value = [value]
        if isinstance(value, str) and args and args[-1] is Ellipsis and args[0] in (int, float):
            value = [yaml.safe_load(v) for v in value.split(",")]  # numbers: ``eval.shots=1,5,10``
        elif isinstance(value, str) and args and args[-1] is Ellipsis and args[0] is str:
            value = [v.strip() for v in value.split(",") if v.strip()]  # words: ``a.b=x,y``
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {value!r} ({type(value).__name__})")
        if origin is tuple and args and args[-1] is not Ellipsis and len(args) != len(value):
            raise ConfigError(f"{path}: expected {len(args)} values, got {len(value)}: {value!r}")
        elem = (lambda i: args[0]) if (not args or args[-1] is Ellipsis or origin is list) else (lambda i: args[i])
        items = [_coerce(v, elem(i), f"{path}[{i}]") if args else v for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r} ({type(value).__name__})")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: expected true/false, got {value!r} ({type(value).__name__})")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{path}: expected an integer, got {value!r} ({type(value).__name__})")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads "3e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{path}: expected a number, got {value!r} ({type(value).__name__})")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{path}: expected a string, got {value!r} ({type(value).__name__})")
    return value


def _kind_class(base: type, value: dict, path: str) -> tuple[type, dict]:
    """The class ``base.kind_config`` chooses for the mapping ``value`` by its kind field (``base.KIND``:
    ``format`` of ``data``, ``kind`` of an ``evals:`` entry), and ``value`` without the keys that class
    lacks but other kinds' classes have at their default there (a setting that changes nothing, such as
    the ``train_path: null`` of a run folder's config.yaml written before the data group was typed);
    such a key at another value is a :class:`ConfigError` naming the kinds that have it."""
    kind_key = base.KIND
    kind = value.get(kind_key, base.__dataclass_fields__[kind_key].default)
    cls = base.kind_config(kind, key=f"{path}.{kind_key}")
    own = {f.name for f in dataclasses.fields(cls)}
    kept = dict(value)
    for key in [k for k in value if k not in own and k not in getattr(base, "RETIRED", {})]:
        owners = kind_owners(base, key)
        if owners and all(_equal(value[key], default) for _, default in owners):
            del kept[key]
        elif owners:
            raise ConfigError(unknown_kind_field(base, cls, path, key, owners))
    return cls, kept


def _equal(value: Any, default: Any) -> bool:
    plain = config_to_dict(default) if isinstance(default, tuple) else default
    return value == plain or value == default


def _build(cls: type, values: dict, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        path = prefix + key
        if key not in hints or key not in names:
            retired = getattr(cls, "RETIRED", {})
            if key in retired:
                raise ConfigError(retired[key])
            raise ConfigError(f"unknown config key {path!r}{_suggest(path, names, prefix)}")
        kwargs[key] = _coerce(value, hints[key], path)
    try:
        obj = cls(**kwargs)
    except ConfigError:  # a field's range (its group's __post_init__): one line naming the key already
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {e}") from e
    check_ranges(obj, prefix.rstrip(".") or "config")  # every group's declared bounds (RANGES), past its own checks
    return obj


def _route_model_keys(tree: dict) -> Any:
    """Move ``model.<field of the variant config>`` into ``model.overrides`` (the shorthand); the model's
    family (its registry entry: ``variants``, ``task``, ``variant_config``)."""
    model = tree.get("model")
    name = model.get("name", ModelConfig.name) if isinstance(model, dict) else ModelConfig.name
    family = model_family(name)  # ConfigError naming the closest variant
    if not isinstance(model, dict):
        return family
    if name not in family.variants:
        raise ConfigError(f"model.name: {name!r} is a model family, not a variant: choose one of {', '.join(family.variants)}")
    variant_cfg = family.variants[name]
    variant_fields = [f.name for f in dataclasses.fields(variant_cfg)]
    own = [f.name for f in dataclasses.fields(ModelConfig)]
    overrides = model.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"model.overrides: expected a mapping, got {overrides!r}")
    for key in list(model):
        if key in own:
            continue
        if key in variant_fields:
            value = model.pop(key)
            if isinstance(value, dict) and isinstance(overrides.get(key), dict):
                # ``model.vision.num_layers=1`` changes one field of a nested config (CLIP's towers):
                # merged into the YAML's ``overrides.vision``, as ``model.overrides.vision.num_layers=1`` is
                _merge(overrides[key], value)
            else:
                overrides[key] = value
        else:
            close = difflib.get_close_matches(key, own + variant_fields, n=1, cutoff=0.6)
            hint = f"; did you mean 'model.{close[0]}'?" if close else ""
            raise ConfigError(f"unknown config key 'model.{key}' (not a field of {name}'s config){hint}")
    for key in overrides:
        if key not in variant_fields:
            close = difflib.get_close_matches(key, variant_fields, n=1, cutoff=0.6)
            hint = f"; did you mean 'model.{close[0]}'?" if close else ""
            raise ConfigError(f"unknown config key 'model.overrides.{key}' (not a field of {name}'s config){hint}")
    model["overrides"] = overrides
    return family


# ---------------------------------------------------------------------------------------- public
def replace_fields(obj: Any, changes: dict, prefix: str = "") -> Any:
    """The config dataclass ``obj`` with ``changes`` (a mapping of its fields, nested groups as
    mappings) applied and checked as the loader checks a YAML's: unknown keys and wrong types refused,
    naming ``prefix`` + the key. A group typed by its kind (``data``) that ``changes`` gives another
    kind (``format``) becomes that kind's class: ``obj``'s fields the new class lacks are dropped
    unless ``changes`` sets them."""
    tree = _merge(config_to_dict(obj), copy.deepcopy(changes))
    base = next((c for c in type(obj).__mro__ if "kind_config" in vars(c)), None)
    if base is None:
        return _build(type(obj), tree, prefix)
    kind_key = base.KIND
    if tree.get(kind_key) != getattr(obj, kind_key):
        new = {f.name for f in dataclasses.fields(base.kind_config(tree.get(kind_key), key=prefix + kind_key))}
        tree = {k: v for k, v in tree.items() if k in new or k in changes}
    return _coerce(tree, base, prefix.rstrip("."))


def eval_entries(items: list[dict], key: str = "evals") -> tuple:
    """``evals:`` entries (mappings, as in a YAML) as their evaluators' typed configs, checked: each
    named (``name`` left out: its evaluator's default prefix), no two under one name."""
    return _named(_coerce(list(items), tuple[EvaluatorConfig, ...], key), key)


def _named(entries: tuple, key: str) -> tuple:
    entries = tuple(dataclasses.replace(e, name=metric_prefix(e)) for e in entries)
    check_entries(entries, key)
    return entries


def _check_evals(cfg: Config) -> None:
    """``evals`` entries named and under distinct names; each entry's ``data`` changes are ``data.*``
    settings."""
    if cfg.evals is None:  # unset: the task's default evaluations ([]: none)
        return
    cfg.evals = _named(cfg.evals, "evals")
    for i, entry in enumerate(cfg.evals):
        if entry.data:
            replace_fields(cfg.data, entry.data, f"evals[{i}].data.")


def root_class(tree: dict) -> type[Config]:
    """The root class of the config ``tree`` (a YAML's mapping): its ``train.task``'s, else the default
    task of its ``model.name``'s family (:func:`~vitscale.config.schema.config_class`): a task's groups
    are fields of its class, unknown keys in a run of another task. Found through ``vitscale.registry``:
    an unknown task or model is a one-line ConfigError naming the closest."""
    train, model = tree.get("train"), tree.get("model")
    task = train.get("task") if isinstance(train, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    return config_class(task if isinstance(task, str) else None, name if isinstance(name, str) else None)


def _other_tasks_groups(root: type[Config], tree: dict) -> None:
    """ConfigError for a top-level key of ``tree`` that is no field of ``root`` but a group of other
    tasks' classes (``token_label`` in a classification run), naming those tasks."""
    own = {f.name for f in dataclasses.fields(root)}
    for key in [k for k in tree if k not in own]:
        tasks = [name for name, cls in TASKS.items() if key in {f.name for f in dataclasses.fields(cls.config)}]
        if tasks:
            task = next(name for name, cls in TASKS.items() if cls.config is root)
            raise ConfigError(f"{key} is a group of train.task={' / '.join(tasks)}, not of train.task={task} (this run's): set "
                              f"train.task to {'it' if len(tasks) == 1 else 'one of them'}, or remove {key}")  # fmt: skip


def config_from_dict(tree: dict) -> Config:
    """The typed config of ``tree``: its classes chosen by its task (:func:`root_class`), its data's
    format and its evaluations' kinds, every key and value checked."""
    tree = copy.deepcopy(tree)  # the routing below moves keys: the caller's tree stays as it was
    family = _route_model_keys(tree)
    root = root_class(tree)
    _other_tasks_groups(root, tree)
    cfg = _build(root, tree)
    _check_evals(cfg)
    # Validates the model overrides' values (types and the variant's own checks) before anything runs.
    try:
        family.variant_config(cfg.model.name, cfg.model.overrides)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model: {e}") from e
    return cfg


def load_config(name_or_path: str | os.PathLike | None = None, overrides: list[str] | None = None,
                notes: list[str] | None = None, *, allow_shell: bool = False) -> Config:  # fmt: skip
    """defaults <- YAML (``name_or_path``; None = defaults only) <- dotted ``overrides``.

    An override that changes ``model.name`` drops the YAML's own model overrides (they describe its
    model, not the new one); the overrides given on the command line stay. What was dropped is said
    in a line appended to ``notes`` (printed on stderr when ``notes`` is None).

    No command runs from a file (docs/trust.md, "No command runs from a file"): a value of the YAML
    that would run a shell command (a ``pipe:`` data path, anywhere in the config) is a
    ``ConfigError`` naming its key, unless ``overrides`` replace it or ``allow_shell`` is set
    (:data:`SHELL_FLAG` on the command line)."""
    tree: dict = {}
    parsed = [parse_override(text) for text in overrides or []]
    given: dict = {}
    for key, value in parsed:
        _set_dotted(given, key, value)
    if name_or_path:
        path = find_config(name_or_path)
        loaded = read_yaml(path) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of config groups")
        if not allow_shell:
            _refuse_shell(loaded, given, path)
        tree = loaded
    said = [n for n in (_new_model_name(tree, given, name_or_path), _new_data_format(tree, given, name_or_path),
                        _new_task(tree, given, name_or_path)) if n]  # fmt: skip
    for key, value in parsed:
        _set_dotted(tree, key, value)
    cfg = config_from_dict(tree)
    for note in said:
        if notes is None:
            print(f"note: {note}", file=sys.stderr)
        else:
            notes.append(note)
    return cfg


def _refuse_shell(tree: Any, given: Any, path: Path) -> None:
    """``ConfigError`` naming the first value of ``tree`` that runs a shell command (:func:`shell_value`)."""
    found = shell_value(tree, given)
    if found is None:
        return
    key, value = found
    shown = value if len(value) <= 60 else value[:57] + "..."
    if "[" in key:  # a list element cannot be set alone on the command line: the whole list can
        top = key.split("[", 1)[0]
        how = f"give the whole list on the command line ({top}=[...], the entry's other keys included)"
    else:
        how = f"give {key}=... on the command line"
    raise ConfigError(f"{path}: {key}={shown!r} runs a shell command (pipe:), and vitscale runs no command read from a "
                      f"file: {how}, or add {SHELL_FLAG} (Python: "
                      f"allow_shell_from_config=True) if you trust {path}")  # fmt: skip


def _new_model_name(tree: dict, given: dict, source) -> str | None:
    """Drop from ``tree`` (a YAML's) the model overrides of its own model when ``given`` (the command
    line's) names another ``model.name``; the line saying which (None when nothing was dropped)."""
    model, new = tree.get("model"), given.get("model")
    if not isinstance(model, dict) or not isinstance(new, dict) or "name" not in new:
        return None
    old_name = model.get("name", ModelConfig.name)
    if new["name"] == old_name:
        return None
    own = {f.name for f in dataclasses.fields(ModelConfig)}
    dropped = dict(model.get("overrides") or {}) if isinstance(model.get("overrides") or {}, dict) else {}
    dropped.update({k: v for k, v in model.items() if k not in own})
    for key in [k for k in model if k not in own or k == "overrides"]:
        del model[key]
    if not dropped or ("overrides" in new and not new["overrides"]):  # nothing, or dropped on purpose
        return None
    kept = sorted(set((new.get("overrides") or {}) if isinstance(new.get("overrides"), dict) else {}) | (set(new) - own))
    shown = ", ".join(f"{k}={v}" for k, v in list(dropped.items())[:6]) + (", ..." if len(dropped) > 6 else "")
    also = f"; kept those given here: {', '.join(kept)}" if kept else ""
    return (f"model.name={new['name']} replaces {source or 'the config'}'s {old_name}: its model overrides ({shown}) "
            f"are dropped{also}; set any back as model.<field>=VALUE")  # fmt: skip


def _new_data_format(tree: dict, given: dict, source) -> str | None:
    """Drop from ``tree`` (a YAML's) the ``data`` keys that the class of the ``data.format`` given on the
    command line lacks (the YAML's paths under ``data.format=synthetic``); the line saying which (None
    when nothing was dropped)."""
    data, new = tree.get("data"), given.get("data")
    if not isinstance(data, dict) or not isinstance(new, dict) or "format" not in new:
        return None
    old_format = data.get("format", DataConfig.format)
    if new["format"] == old_format:
        return None
    own = {f.name for f in dataclasses.fields(DataConfig.kind_config(new["format"]))}
    dropped = [k for k in data if k not in own and k not in new and k not in DataConfig.RETIRED]
    for key in dropped:
        del data[key]
    if not dropped:
        return None
    return (f"data.format={new['format']} replaces {source or 'the config'}'s {old_format}: its data settings that "
            f"{new['format']} does not have are dropped ({', '.join(f'data.{k}' for k in dropped)})")


def _new_task(tree: dict, given: dict, source) -> str | None:
    """Drop from ``tree`` (a YAML's) the groups that the run config of the ``train.task`` given on the
    command line lacks (a classification run's ``distill`` when ``vitscale label-tokens`` reads its
    config.yaml as token labeling's); the line saying which (None when nothing was dropped)."""
    train, new = tree.get("train"), given.get("train")
    if not isinstance(new, dict) or not new.get("task"):
        return None
    old_task = train.get("task") if isinstance(train, dict) else None
    if new["task"] == old_task:
        return None
    model = tree.get("model") if isinstance(tree.get("model"), dict) else {}
    own = {f.name for f in dataclasses.fields(config_class(new["task"], model.get("name")))}
    dropped = [k for k in tree if k not in own and k not in given and isinstance(tree[k], dict)]
    for key in dropped:
        del tree[key]
    if not dropped:
        return None
    return (f"train.task={new['task']} replaces {source or 'the config'}'s {old_task or 'default task'}: its groups that "
            f"{new['task']} does not have are dropped ({', '.join(dropped)})")


def config_to_dict(cfg: Any) -> dict:
    """The config as plain YAML-able data (tuples become lists)."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(cfg)


def dump_config(cfg: Config) -> str:
    """``config_to_dict(cfg)`` as YAML, in one style (block mappings and lists), in schema order: the
    fields of its classes (its task's groups, its data format's fields) and nothing else."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """Write the resolved config as a run's ``config.yaml`` (:func:`dump_config`; reloadable with
    ``load_config(path)``). The one writer of config.yaml."""
    from ..safe_write import write_atomic  # never through a link; no temporary file left on a failure

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, dump_config(cfg))


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and scalars are leaves)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
