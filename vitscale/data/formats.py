"""The data formats: one :class:`DataFormat` per ``data.format``, each declared in one module.

A format module (``vitscale/data/digits.py``, ``imagefolder.py``, ``synthetic.py``, ``csv.py``,
``webdataset.py``, ``parquet.py``, or a module of yours) holds everything about its format and
registers it on import with :func:`register_format`:

- ``split``: the builder, ``split(cfg, name, *, img_size, num_channels, seed, classes) -> Split | None``
  for ``name`` in ``train`` / ``val`` (None: the dataset has no such split); a format whose samples
  may carry captions (``captions=True``) also takes ``tokenize=``: the model family's tokenizer
  (texts -> token ids ``(N, L)``), or None when the run reads no text;
- ``options``: a dataclass of the format's own ``data.*`` fields, each with a docstring (read as
  ``cfg.data.<field>``, written in YAML and on the command line as ``data.<field>`` like any other);
- ``reads``: which of the fields that only some formats read (:data:`PER_FORMAT`: the paths, the
  held-out fraction) it reads. A config setting a field its format does not read — its own options'
  or one of these — is refused in one line naming the formats that read it (:func:`not_read`), never
  silently ignored;
- ``check``: cheap up-front checks of a config (a path that cannot be read, a package that is not
  installed), run before any data is read or any model is built: a one-line ``CheckError``;
- ``detect``: whether a path holds data of this format (``vitscale data inspect PATH``);
- ``class_names``: the classes of a config without reading the data (export, zero-shot prompts).

The built-in formats are imported on first use (``BUILTIN``); any other module registers its own
format by being imported before the config is loaded (see ``tests/integration/test_new_data_format.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..registry import Registry

FORMATS: Registry[DataFormat] = Registry("data format", "data.format", {
    "digits": "vitscale.data.digits",
    "digits_aspect": "vitscale.data.digits",
    "imagefolder": "vitscale.data.imagefolder",
    "synthetic": "vitscale.data.synthetic",
    "webdataset": "vitscale.data.webdataset",
    "csv": "vitscale.data.csv",
    "parquet": "vitscale.data.parquet",
})
"""The data formats (``data.format``): the built-in ones imported on first use."""
SPLITS = ("train", "val")
PER_FORMAT = ("train_path", "val_path", "val_split")
"""The fields of ``DataConfig`` that only some formats read (each lists those it does in
``DataFormat.reads``): ``data.format=digits data.train_path=...`` is refused, not trained on the digits."""


@dataclass
class Split:
    """One split of a dataset, as a format's builder returns it."""

    source: Any
    """The samples: ``len(source)`` and ``source.sample(index, epoch, transform) ->
    vitscale.data.sources.Sample`` (keyed sampling, resume and bad-file counting are then the
    loader's), or a streaming source with ``build_loader(...)`` (see ``vitscale.data.stream``)."""
    class_names: list[str]
    """Class ``i`` is ``class_names[i]`` (empty when the data has no labels)."""
    num_classes: int | None = None
    """Number of classes; None = ``len(class_names)``."""
    info: dict = dataclasses.field(default_factory=dict)
    """What ``vitscale data inspect`` shows about the split beyond its samples and classes (shards,
    columns, ...)."""

    def __post_init__(self) -> None:
        if self.num_classes is None:
            self.num_classes = len(self.class_names)


@dataclass(frozen=True)
class DataFormat:
    name: str
    """The value of ``data.format``."""
    split: Callable[..., Split | None]
    """``split(cfg, name, *, img_size, num_channels, seed, classes)``: the ``train`` or ``val`` split of
    the dataset ``cfg`` (a :class:`vitscale.data.DataConfig`) points at, or None when it has none.
    ``classes``: the class names labels must be mapped to (the training split's, or a trained model's),
    None for the training split itself."""
    options: type | None = None
    """A dataclass of the format's own ``data.*`` fields (defaults and a docstring under each)."""
    captions: bool = False
    """Its samples may carry captions: ``split`` also takes ``tokenize=`` (texts -> token ids, the model
    family's tokenizer handed to ``build_loader``; None = no caption tokens), and its options have
    ``caption_context_length`` (compose :class:`vitscale.data.config.CaptionFields`)."""
    check: Callable[[Any], None] | None = None
    """``check(cfg)``: up-front checks before any data is read; raise ``CheckError`` (one line)."""
    detect: Callable[[str], bool] | None = None
    """``detect(path)``: True when ``path`` holds data of this format (``vitscale data inspect``)."""
    class_names: Callable[[Any], list[str] | None] | None = None
    """``class_names(cfg)``: the class names without reading the whole dataset, or None if unknown."""
    summary: str = ""
    """One line for listings (``vitscale data inspect --help``, error messages)."""
    reads: tuple[str, ...] = PER_FORMAT
    """Which of :data:`PER_FORMAT` it reads (all of them unless said): setting another one away from
    its default is a config error naming the formats that read it."""


def register_format(fmt: DataFormat) -> DataFormat:
    """Make ``data.format=<fmt.name>`` known (a format module calls this when imported)."""
    if not isinstance(fmt, DataFormat):
        raise TypeError(f"register_format takes a DataFormat, got {type(fmt).__name__}")
    if fmt.options is not None and not dataclasses.is_dataclass(fmt.options):
        raise TypeError(f"data format {fmt.name!r}: options must be a dataclass, got {fmt.options!r}")
    if not set(fmt.reads) <= set(PER_FORMAT):
        raise TypeError(f"data format {fmt.name!r}: reads names {sorted(set(fmt.reads) - set(PER_FORMAT))}, "
                        f"not fields of {PER_FORMAT}")  # fmt: skip
    if fmt.captions and "caption_context_length" not in option_fields(fmt):
        raise TypeError(f"data format {fmt.name!r} has captions: its options need caption_context_length "
                        f"(compose vitscale.data.config.CaptionFields)")  # fmt: skip
    return FORMATS.register(fmt.name, fmt)


def get_format(name: str) -> DataFormat:
    """The registered format ``name``; ``ConfigError`` naming the closest format otherwise."""
    return FORMATS.get(name)


def option_fields(fmt: DataFormat) -> list[str]:
    """Names of the format's own ``data.*`` fields."""
    return [f.name for f in dataclasses.fields(fmt.options)] if fmt.options is not None else []


def fields_read(fmt: DataFormat) -> list[str]:
    """The ``data.*`` fields that only some formats read and that ``fmt`` reads: its options' and its
    :attr:`DataFormat.reads`."""
    return option_fields(fmt) + list(fmt.reads)


def owners(field: str) -> list[str]:
    """The formats (of those loaded) that read ``data.<field>``, a field only some formats read."""
    return [n for n, fmt in FORMATS.items() if field in fields_read(fmt)]  # the built-in ones first, in their order


def validation_hint(name: str) -> str:
    """How a config of ``data.format=<name>`` gets validation data, as the settings that format reads."""
    ways = {"val_path": "data.val_path", "val_split": "data.val_split to hold out part of the training data"}
    named = [w for k, w in ways.items() if k in get_format(name).reads]
    return f"set {' or '.join(named)}" if named else f"data.format={name} has no validation split of its own"


def not_read(prefix: str, field: str, name: str) -> str | None:
    """The one-line error for ``<prefix><field>`` set in a config of ``data.format=<name>``, which does
    not read it; None when no format reads it (an unknown key)."""
    others = owners(field)
    if not others:
        return None
    return (f"{prefix}{field} is read by data.format={' / '.join(others)}, not by data.format={name}: set "
            f"data.format to {'it' if len(others) == 1 else 'one of them'}, or remove {prefix}{field}")


def resolve_options(name: str, options: Any) -> Any:
    """The options object of format ``name``: its defaults (``options`` None), built from a mapping of
    its fields, or carried over by field name from another format's options (``dataclasses.replace``
    of a ``DataConfig`` with another ``format``)."""
    fmt = get_format(name)
    if fmt.options is None:
        if isinstance(options, dict) and options:
            raise ConfigError(f"data.{sorted(options)[0]} is not a field of data.format={name} (it has no fields of its own)")
        return None
    if isinstance(options, fmt.options):
        return options
    if options is None:
        return fmt.options()
    own = set(option_fields(fmt))
    if isinstance(options, dict):
        unknown = sorted(set(options) - own)
        if unknown:
            raise ConfigError(f"data.{unknown[0]} is not a field of data.format={name} (its fields: {', '.join(sorted(own))})")
        return fmt.options(**options)
    if dataclasses.is_dataclass(options):  # another format's options: keep the fields both have
        same = {f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.name in own}
        return fmt.options(**same)
    raise ConfigError(f"data options of data.format={name}: expected a mapping, got {options!r}")


__all__ = ["FORMATS", "PER_FORMAT", "SPLITS", "DataFormat", "Split", "fields_read", "get_format",
           "not_read", "option_fields", "owners", "register_format", "resolve_options", "validation_hint"]
