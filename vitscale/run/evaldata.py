"""The data of a run's evaluators: the run's own splits, or an evaluator's own data (its ``data:``
changes to the run's ``data.*``: another format, path or split), each rank reading its shard of the
split in order, unaugmented, in whole batches of the one-process evaluation (as ``vitscale eval``).
Loaders are built once per (data, batch size) and shared by the evaluators that ask for the same."""

from __future__ import annotations

import json
from typing import Any

from ..config import replace_fields
from ..data import Loaders, build_loaders
from ..eval.evaluator import MissingSplit
from ..models.registry import get_model_config
from .assemble import Run


class RunEvalData:
    """:class:`vitscale.eval.evaluator.EvalData` of ``run``."""

    def __init__(self, run: Run):
        self.run = run
        self._built: dict[tuple[str, int], Loaders] = {}

    def _batch(self, batch_size: int | None) -> int:
        return int(batch_size or self.run.cfg.eval.batch_size)

    def _loaders(self, data: dict[str, Any], batch: int) -> Loaders:
        run, cfg = self.run, self.run.cfg
        if not data and batch == cfg.eval.batch_size and run.purpose == "eval":
            return run.loaders  # "eval" built both splits this way already
        key = (json.dumps(data, sort_keys=True, default=str), batch)
        if key not in self._built:
            data_cfg = replace_fields(cfg.data, data, "evals.data.") if data else cfg.data
            channels = get_model_config(cfg.model.name, **run.model_overrides).num_channels
            self._built[key] = build_loaders(
                data_cfg, img_size=run.img_size, num_channels=channels, seed=cfg.train.seed, device=run.device,
                rank=run.dims.dp_rank, world_size=run.dims.dp_size, micro_batch_size=batch, eval_batch_size=batch,
                train_augment=False,
            )  # fmt: skip
        return self._built[key]

    def loader(self, data: dict[str, Any], split: str, batch_size: int | None):
        run, batch = self.run, self._batch(batch_size)
        if not data and split == "val" and batch == run.cfg.eval.batch_size and run.loaders is not None:
            found = run.loaders.val  # the run's own val split, as it was built
        else:
            loaders = self._loaders(data, batch)
            found = loaders.val if split == "val" else loaders.train
        if found is None:
            whose = f"the evaluation data {json.dumps(data, default=str)}" if data else "the run's data"
            raise MissingSplit(f"evals: {whose} has no {split} split (set data.val_path, or data.val_split to hold out part of the training data)")
        return found

    def classes(self, data: dict[str, Any]) -> tuple[int, list[str]]:
        run = self.run
        if not data and run.loaders is not None:
            return int(run.num_classes or 0), list(run.class_names)
        loaders = self._loaders(data, self._batch(None))
        return int(loaders.num_classes), list(loaders.class_names)


__all__ = ["RunEvalData"]
