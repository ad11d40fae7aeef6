"""A trained model and its run config from a run folder or a bare ``.safetensors`` export.

A run folder (``vitscale train``'s ``train.output_dir``) holds ``config.yaml`` and the weights
(``model.safetensors`` / ``model_ema.safetensors``, else the newest DCP checkpoint). The header of
a ``.safetensors`` export names the model and its resolved overrides (``vitscale.train.trainer``
writes ``{"model", "overrides", "step"}``), so a bare file needs no config for the model itself;
the preprocessing constants then come from a ``config.yaml`` beside it, ``--config``, or vitscale's
defaults (said so in the export's JSON).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


@dataclass
class Source:
    """What an export is made from."""

    model: nn.Module
    """The model in eval mode, fp32, on the CPU, with the trained weights loaded."""
    cfg: object
    """The run's :class:`vitscale.config.Config` (or the defaults when there is no config)."""
    name: str
    """Registered variant name, e.g. ``vit_debug``."""
    overrides: dict
    """The variant overrides the weights were trained with."""
    family: object
    """The variant's family (:class:`vitscale.models.spec.FamilySpec`), resolved once with the model."""
    task: str
    """``classification`` / ``token_labeling`` (one image graph) or ``contrastive`` (CLIP: two graphs)."""
    weights: str
    """The file or checkpoint the weights were read from."""
    config_from: str
    """Where the run config (preprocessing, tokenizer, class names) came from, or ``defaults``."""
    step: int | None = None
    """Training step of the weights, when the source says."""


def _safetensors_metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def load_source(src: str | Path, *, ema: bool = False, config: str | None = None, allow_shell: bool = False,
                teacher: bool = False) -> Source:  # fmt: skip
    """Build the model of ``src`` (run folder or ``.safetensors``) with its weights.

    ``teacher``: the ``teacher`` weight set of a run folder whose task's training module declares one
    (a self-distillation run's EMA teacher backbone: :mod:`vitscale.run.weight_sets`), read from its
    newest checkpoint, built as the run's model.

    ``config`` (a YAML path or built-in name) replaces the run's own ``config.yaml`` for the
    preprocessing constants, tokenizer settings and class names. ``allow_shell``: a config whose
    ``pipe:`` data paths would run is accepted (refused otherwise: ``vitscale.config.load_config``).
    """
    from vitscale.checkpoint import load_model_weights, read_weights
    from vitscale.config import config_class, load_config
    from vitscale.distributed.parallel_dims import ParallelDims
    from vitscale.models.registry import resolve_model
    from vitscale.run import build_model, head_classes, model_overrides
    from vitscale.run.assemble import resolve_run_model

    p = Path(src)
    if not p.exists():
        raise FileNotFoundError(f"{src}: no such run folder or .safetensors file")
    if p.is_file() and p.suffix != ".safetensors":
        raise ValueError(f"{src}: expected a run folder or a .safetensors file")
    if p.is_file() and ema:
        raise ValueError("--ema selects model_ema.safetensors of a run folder; pass that file instead")
    if p.is_file() and teacher:
        raise ValueError("--teacher reads the teacher from a run folder's checkpoint; pass the run folder "
                         "(or a file from `vitscale convert RUN teacher.safetensors --key teacher`, without --teacher)")  # fmt: skip
    if ema and teacher:
        raise ValueError("--ema and --teacher each select weights: pass one")
    folder = p if p.is_dir() else p.parent
    if p.is_dir():  # the run folder's own files: nothing inside it is followed (docs/trust.md, "Symbolic links")
        from vitscale.run.folder import check_links

        check_links(folder)
    cfg_path = config or (str(folder / "config.yaml") if (folder / "config.yaml").is_file() else None)
    weights_file = p if p.is_file() else folder / ("model_ema.safetensors" if ema else "model.safetensors")
    meta = _safetensors_metadata(weights_file) if weights_file.is_file() else {}
    # no config: the defaults of a run of the weights' model (its family's task's groups: CLIP's ``clip``)
    cfg = load_config(cfg_path, allow_shell=allow_shell) if cfg_path else config_class(model=meta.get("model"))()
    config_from = str(cfg_path) if cfg_path else "defaults"
    if teacher:  # the run's model (model.safetensors' header, else config.yaml), the teacher's weights
        from vitscale.run.weight_sets import weight_set_prefix

        sd = read_weights(p, "teacher", weight_set_prefix(p, "teacher"))
        weights_file = p
    else:
        sd = read_weights(weights_file if weights_file.is_file() else p, "ema" if ema else "model")
    if "model" in meta:  # the header names the model and its resolved overrides
        over = json.loads(meta.get("overrides") or "{}")
        if "num_classes" not in over and head_classes(sd) is not None:  # a run's count taken from its data
            over["num_classes"] = head_classes(sd)
        resolved = resolve_model(meta["model"], **over)
    elif cfg_path:  # a DCP checkpoint: the run config says, the class count is the head's
        run_model = resolve_run_model(cfg)  # with what its task implies (SigLIP's bias)
        resolved = run_model.with_overrides(model_overrides(cfg, head_classes(sd), run_model))
    else:
        raise ValueError(f"{src}: the weights do not name their model and there is no config.yaml (pass --config)")
    name, over = resolved.name, resolved.overrides
    model = build_model(resolved, ParallelDims(device=torch.device("cpu")))  # as train, eval, label-tokens
    load_model_weights(model, {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}, strict=True, source=src)
    model = model.float().eval()
    task = cfg.train.task if cfg_path and cfg.train.task else resolved.family.task
    step = int(meta["step"]) if meta.get("step", "").isdigit() else None
    return Source(model, cfg, name, over, resolved.family, task, str(weights_file if weights_file.is_file() else p),
                  config_from, step)  # fmt: skip
