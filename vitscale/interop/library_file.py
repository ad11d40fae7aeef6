"""A vitscale weights file rewritten in another library's names and layouts (``vitscale convert ...
--to timm``): the state dict of the family's adapter (:class:`vitscale.models.spec.StateDictAdapter`
``to_library``), checked by loading it with ``strict=True`` into the library's model of the same
architecture (``create``) before it is written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def header_model(path: str | os.PathLike) -> tuple[Any, Any]:
    """``(resolved, model)``: the model the header of a vitscale ``.safetensors`` file names (its
    ``model`` and resolved ``overrides``, as ``vitscale train`` and ``vitscale convert`` write them; the
    class count the weights' classifier has), built on the CPU with the file's weights loaded strictly,
    fp32, in eval mode. Reads the models and checkpoint layers only (an export takes the same header
    with a run's config: :mod:`vitscale.export.source`)."""
    from vitscale.checkpoint import load_model_weights, read_weights
    from vitscale.checkpoint.safetensors_io import read_metadata
    from vitscale.models.registry import resolve_model

    from .pretrained import file_classes

    meta = read_metadata(path)
    if "model" not in meta:
        raise ValueError(f"{path}: the header names no model (the files vitscale train and vitscale convert write do)")
    sd = read_weights(path)
    over = json.loads(meta.get("overrides") or "{}")
    resolved = resolve_model(meta["model"], **over)
    classes = file_classes(resolved.family, sd)
    if "num_classes" not in over and "num_classes" in resolved.fields and classes is not None:
        resolved = resolve_model(meta["model"], **over, num_classes=classes)  # a run's count, taken from its data
    model = resolved.create()
    load_model_weights(model, {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}, strict=True,
                       source=str(path))  # fmt: skip
    return resolved, model.float().eval()


def write_library_weights(weights: str | os.PathLike, out: str | os.PathLike, library: str) -> Path:
    """``weights`` (a ``.safetensors`` file whose header names its model, as ``vitscale convert`` and
    ``vitscale train`` write them) as ``out`` in ``library``'s layout; returns ``out``."""
    from vitscale.checkpoint.weights import write_weights

    resolved, model = header_model(weights)  # the model the header names, the weights loaded strictly
    adapter = resolved.family.adapter(library)  # a family without one: one line naming the adapters it has
    sd = {k: v.contiguous() for k, v in adapter.to_library(model).items()}
    adapter.create(model, load_weights=False).load_state_dict(sd, strict=True)
    out = Path(out)
    meta = {"format": "pt", "library": library, "converted_from": resolved.name}
    if resolved.name in adapter.names:  # the library's registered model of the same architecture
        meta["library_model"] = adapter.names[resolved.name]
    write_weights(sd, out, meta)
    return out


__all__ = ["header_model", "write_library_weights"]
