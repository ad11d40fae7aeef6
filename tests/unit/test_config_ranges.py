"""Every number has a range (docs/trust.md, round four): each int / float field of every config group —
the groups of ``Config``, every data format's, task's and evaluator's class, found through the
registry — declares its bounds beside it (``RANGES``, ``vitscale/config/ranges.py``), and the
declared bounds are enforced when a config loads."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest

from vitscale.config import ConfigError, load_config
from vitscale.config.ranges import declared_ranges, number_fields, undeclared

PENDING: dict[str, str] = {}
"""Groups whose table is written on another branch (the lead removes each entry at the merge)."""


def schema_groups() -> dict[type, str]:
    """Every config group class reachable from the registry: each task's root config and its groups,
    each data format's class, each evaluator's (class -> the key it is found under)."""
    import vitscale.eval  # noqa: F401 - registers the built-in evaluators
    from vitscale.registry import EVALUATORS, FORMATS, TASKS

    found: dict[type, str] = {}

    def walk(cls: type, key: str) -> None:
        if cls in found:
            return
        found[cls] = key
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], f"{key}.{f.name}" if key else f.name)

    for name in TASKS.names():
        walk(TASKS.get(name).config, f"(train.task={name})")
    for name in FORMATS.names():
        fmt = FORMATS.get(name)
        if fmt.config is not None:
            walk(fmt.config, f"data (format={name})")
    for name in EVALUATORS.names():
        walk(EVALUATORS.get(name).config, f"evals (kind={name})")
    return found


def test_every_number_field_of_the_schema_declares_its_range():
    """Walks the whole schema; fails naming each group's file and the entries its ``RANGES`` lacks."""
    groups = schema_groups()
    assert len(groups) > 25 and any(c.__name__ == "KnnConfig" for c in groups)  # the walk reaches evaluators
    missing = []
    for cls, key in groups.items():
        if cls.__name__ in PENDING:  # still without a table (else its PENDING entry is stale: remove it)
            assert undeclared(cls), f"{cls.__name__} declares its ranges now: remove it from PENDING"
            continue
        names = undeclared(cls)
        if names:
            where = inspect.getsourcefile(cls).split("vitscale/", 1)[-1]
            entries = ", ".join(f'"{n}": (low, high)' for n in names)
            missing.append(f"{cls.__name__} ({key}, vitscale/{where}): add to its RANGES: {{{entries}}}")
    assert not missing, ("number fields without a declared range (vitscale/config/ranges.py says how; "
                         "a bound is inclusive, math.inf where a value is unbounded on purpose):\n  "
                         + "\n  ".join(missing))  # fmt: skip


def test_every_declared_range_names_a_number_field():
    """A bound for a field that is not there (renamed, removed) would guard nothing."""
    for cls in schema_groups():
        stale = set(declared_ranges(cls)) - set(number_fields(cls))
        assert not stale, f"{cls.__name__}.RANGES bounds {sorted(stale)}, which are no number fields of it"


@pytest.mark.parametrize("override, key", [
    ("train.batch_size=100000000", "train.batch_size"),
    ("data.repeated_aug=100000", "data.repeated_aug"),
    ("data.shuffle_buffer=100000000", "data.shuffle_buffer"),
    ("eval.probe_max_iter=1000000000", "eval.probe_max_iter"),
    ("parallel.tp=100000", "parallel.tp"),
    ("data.mean=[0.5,0.5,300]", "data.mean[2]"),
    ("data.crop_pct=1e6", "data.crop_pct"),
])  # fmt: skip
def test_a_number_past_its_declared_range_is_one_line(override, key):
    fmt = ["data.format=webdataset", "data.train_path=x"] if "shuffle" in override else []
    with pytest.raises(ConfigError) as e:
        load_config("digits_vit", [*fmt, override])
    assert str(e.value).startswith(key) and len(str(e.value).splitlines()) == 1, str(e.value)


def test_an_evaluators_and_a_tasks_numbers_are_bounded_too():
    with pytest.raises(ConfigError, match=r"k=100000000 is out of range"):
        load_config("digits_vit", ["evals=[{kind: knn, k: 100000000}]"])
    with pytest.raises(ConfigError, match=r"mae.decoder_depth=100000 is out of range"):
        load_config("digits_mae", ["mae.decoder_depth=100000"])
