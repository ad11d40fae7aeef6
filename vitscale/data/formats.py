"""The data formats: one :class:`DataFormat` per ``data.format``, each declared in one module.

A format module (``vitscale/data/digits.py``, ``imagefolder.py``, ``synthetic.py``, ``csv.py``,
``webdataset.py``, ``parquet.py``, or a module of yours) holds everything about its format and
registers it on import with :func:`register_format`:

- ``split``: the builder, ``split(cfg, name, *, img_size, num_channels, seed, classes) -> Split | None``
  for ``name`` in ``train`` / ``val`` (None: the dataset has no such split); a format whose samples
  may carry captions (``captions=True``) also takes ``tokenize=``: the model family's tokenizer
  (texts -> token ids ``(N, L)``), or None when the run reads no text;
- ``config``: its ``data`` group, a subclass of :class:`vitscale.config.data.DataConfig` composing the
  shared field groups it reads (``PathFields``: the paths, ``ValSplitField``, ``CaptionFields``, ...)
  and its own fields, each with a docstring (read as ``cfg.data.<field>``, written in YAML and on the
  command line as ``data.<field>`` like any other). A config setting a field its format's class lacks
  is refused in one line naming the formats that have it, never silently ignored;
- ``check``: cheap up-front checks of a config (a path that cannot be read, a package that is not
  installed), run before any data is read or any model is built: a one-line ``CheckError``;
- ``detect``: whether a path holds data of this format (``vitscale data inspect PATH``);
- ``class_names``: the classes of a config without reading the data (export, zero-shot prompts).

The built-in formats are imported on first use (``vitscale.registry.FORMATS``); any other module registers its own
format by being imported before the config is loaded (see ``tests/integration/test_new_data_format.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config.data import DataConfig
from ..registry import FORMATS

SPLITS = ("train", "val")


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
    config: type | None = None
    """Its ``data`` group: a subclass of :class:`vitscale.config.data.DataConfig` with ``format`` defaulting
    to :attr:`name` (None: the common fields only)."""
    captions: bool = False
    """Its samples may carry captions: ``split`` also takes ``tokenize=`` (texts -> token ids, the model
    family's tokenizer handed to ``build_loader``; None = no caption tokens), and its config has
    ``caption_context_length`` (compose :class:`vitscale.config.data.CaptionFields`)."""
    check: Callable[[Any], None] | None = None
    """``check(cfg)``: up-front checks before any data is read; raise ``CheckError`` (one line)."""
    detect: Callable[[str], bool] | None = None
    """``detect(path)``: True when ``path`` holds data of this format (``vitscale data inspect``)."""
    class_names: Callable[[Any], list[str] | None] | None = None
    """``class_names(cfg)``: the class names without reading the whole dataset, or None if unknown."""
    summary: str = ""
    """One line for listings (``vitscale data inspect --help``, error messages)."""
    labels: bool = True
    """Its samples may carry class labels. False (``images``: a folder of images, no classes): a run of a
    task that reads labels (:attr:`vitscale.tasks.Task.reads_labels`) is refused before anything is
    read, and the evaluations that read the run's data read :attr:`labelled` instead."""
    labelled: Callable[[Any], dict | None] | None = None
    """A format without labels: ``labelled(cfg)``, the ``data:`` changes to ``cfg`` that give the labelled
    data its evaluations read in its place (``images``: its ``val_path``, a class folder, as an
    ``imagefolder``), or None when ``cfg`` names none (:mod:`vitscale.run.evaldata`)."""


def register_format(fmt: DataFormat) -> DataFormat:
    """Make ``data.format=<fmt.name>`` known (a format module calls this when imported)."""
    if not isinstance(fmt, DataFormat):
        raise TypeError(f"register_format takes a DataFormat, got {type(fmt).__name__}")
    if fmt.config is not None:
        if not (isinstance(fmt.config, type) and issubclass(fmt.config, DataConfig)):
            raise TypeError(f"data format {fmt.name!r}: config must be a subclass of DataConfig, got {fmt.config!r}")
        if fmt.config.__dataclass_fields__["format"].default != fmt.name:
            raise TypeError(f"data format {fmt.name!r}: its config {fmt.config.__name__} must declare format: str = {fmt.name!r}")
    if fmt.captions and "caption_context_length" not in fields_of(fmt):
        raise TypeError(f"data format {fmt.name!r} has captions: its config needs caption_context_length "
                        f"(compose vitscale.config.data.CaptionFields)")  # fmt: skip
    return FORMATS.register(fmt.name, fmt)


def get_format(name: str) -> DataFormat:
    """The registered format ``name``; ``ConfigError`` naming the closest format otherwise."""
    return FORMATS.get(name)


def fields_of(fmt: DataFormat) -> list[str]:
    """Names of the ``data.*`` fields of the format's config."""
    return [f.name for f in dataclasses.fields(fmt.config or DataConfig)]


def validation_hint(name: str) -> str:
    """How a config of ``data.format=<name>`` gets validation data, as the settings that format reads."""
    ways = {"val_path": "data.val_path", "val_split": "data.val_split to hold out part of the training data"}
    named = [w for k, w in ways.items() if k in fields_of(get_format(name))]
    return f"set {' or '.join(named)}" if named else f"data.format={name} has no validation split of its own"


__all__ = ["FORMATS", "SPLITS", "DataFormat", "Split", "fields_of", "get_format", "register_format", "validation_hint"]
