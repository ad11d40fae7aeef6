"""The data of a run's evaluators: the run's own splits, or an evaluator's own data (its ``data:``
changes to the run's ``data.*``: another format, path or split), each rank reading its shard of the
split in order, unaugmented, in whole batches of the one-process evaluation (as ``vitscale eval``).

Every split is built by the one function that builds a split of any format,
:func:`vitscale.data.build_loader`, once per (data, split, batch size), and shared by the evaluators
that ask for the same. Labels are mapped to the classes of the data's training split, as a run maps
its validation labels: the run's ``class_names`` (the model's classes, by name) while the evaluator
keeps the run's ``format`` and ``train_path``; else the classes its own training data declares (the
format's ``class_names``: class folders, ``classnames.txt``); else the split's own.

Data whose format carries no labels (``DataFormat.labels``: ``data.format=images``) is read through
the labelled data its format names in its place (``DataFormat.labelled``: the images format's
``val_path``, a class folder, as an ``imagefolder`` split into a fit and a scored part): the k-NN and
probes of a run on one's own photos fit and score there. Without one, an evaluation of such data is a
:class:`MissingSplit` naming what to set (a task's default evaluations are then dropped: the run
reports its training signals only).
"""

from __future__ import annotations

import json
from typing import Any

from ..config import replace_fields
from ..data import SplitLoader, build_loader, get_format
from ..data.formats import validation_hint
from ..eval.evaluator import MissingSplit
from .assemble import Run, data_tokenizer

OWN_DATASET = ("format", "train_path")
"""``data:`` keys of an evaluator that name another training set (with classes of its own)."""


class RunEvalData:
    """:class:`vitscale.eval.evaluator.EvalData` of ``run``."""

    def __init__(self, run: Run):
        self.run = run
        self._built: dict[tuple[str, str, int], SplitLoader | None] = {}

    def _batch(self, batch_size: int | None) -> int:
        return int(batch_size or self.run.cfg.eval.batch_size)

    def _own(self, data: dict[str, Any]) -> bool:
        """Whether ``data`` names another training set than the run's."""
        return any(k in data and data[k] != getattr(self.run.cfg.data, k) for k in OWN_DATASET)

    def _classes_of(self, data: dict[str, Any], data_cfg) -> list[str] | None:
        """The classes the labels of ``data`` are mapped to (see the module docstring)."""
        if not self._own(data):
            return list(self.run.class_names) or None
        fmt = get_format(data_cfg.format)
        if not getattr(data_cfg, "train_path", None) or fmt.class_names is None:
            return None
        return fmt.class_names(data_cfg)

    def _labelled(self, data: dict[str, Any]) -> dict[str, Any]:
        """``data``, or where the data it names carries no labels, the labelled data its format names in
        its place (module docstring); :class:`MissingSplit` when there is none."""
        cfg = self.run.cfg
        data_cfg = replace_fields(cfg.data, data, "evals.data.") if data else cfg.data
        fmt = get_format(data_cfg.format)
        if fmt.labels:
            return data
        found = fmt.labelled(data_cfg) if fmt.labelled is not None else None
        if found is None:
            whose = f"the evaluation data {json.dumps(data, default=str)}" if data else "the run's data"
            raise MissingSplit(f"evals: {whose} (data.format={fmt.name}) has no labels for an evaluation to read: set "
                               "data.val_path to a labelled class folder (<root>/<class>/<image>), or give the entry "
                               "its own data: {format: imagefolder, train_path: ..., val_path: ...}")  # fmt: skip
        return {**data, **found}

    def _split(self, data: dict[str, Any], split: str, batch: int) -> SplitLoader | None:
        run, cfg = self.run, self.run.cfg
        key = (json.dumps(data, sort_keys=True, default=str), split, batch)
        if key not in self._built:
            data_cfg = replace_fields(cfg.data, data, "evals.data.") if data else cfg.data
            model_cfg = run.model_cfg
            self._built[key] = build_loader(
                data_cfg, split, img_size=run.img_size, num_channels=model_cfg.num_channels, seed=cfg.train.seed,
                batch_size=batch, patch=model_cfg.patch_dim,
                rank=run.dims.dp_rank, world_size=run.dims.dp_size, device=run.device,
                classes=self._classes_of(data, data_cfg),
                tokenize=data_tokenizer(run.family, data_cfg),
            )  # fmt: skip
        return self._built[key]

    def loader(self, data: dict[str, Any], split: str, batch_size: int | None):
        run, batch = self.run, self._batch(batch_size)
        data = self._labelled(data)
        own = run.loaders is not None and not data and batch == run.cfg.eval.batch_size
        if own and split == "val":
            found = run.loaders.val  # the run's own val split, as it was built
        elif own and split == "train" and run.purpose == "eval":
            found = run.loaders.train  # "eval" built the train split this way already
        else:
            built = self._split(data, split, batch)
            found = built.loader if built is not None else None
        if found is None:
            whose = f"the evaluation data {json.dumps(data, default=str)}" if data else "the run's data"
            fmt = (data or {}).get("format", self.run.cfg.data.format)
            raise MissingSplit(f"evals: {whose} has no {split} split ({validation_hint(fmt)})")
        return found

    def classes(self, data: dict[str, Any]) -> tuple[int, list[str]]:
        run = self.run
        data = self._labelled(data)
        if run.loaders is not None and not self._own(data):
            return int(run.num_classes or 0), list(run.class_names)
        built = next((b for (d, _, _), b in self._built.items() if b is not None
                      and d == json.dumps(data, sort_keys=True, default=str)), None)  # fmt: skip
        for split in ("val", "train"):
            if built is None:
                built = self._split(data, split, self._batch(None))
        if built is None:
            raise MissingSplit(f"evals: the evaluation data {json.dumps(data, default=str)} has no samples")
        return int(built.num_classes), list(built.class_names)


__all__ = ["OWN_DATASET", "RunEvalData"]
