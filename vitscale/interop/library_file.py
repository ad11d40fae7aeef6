"""A vitscale weights file rewritten in another library's names and layouts (``vitscale convert ...
--to timm``): the state dict of the family's adapter (:class:`vitscale.models.spec.StateDictAdapter`
``to_library``), checked by loading it with ``strict=True`` into the library's model of the same
architecture (``create``) before it is written."""

from __future__ import annotations

import os
from pathlib import Path


def write_library_weights(weights: str | os.PathLike, out: str | os.PathLike, library: str) -> Path:
    """``weights`` (a ``.safetensors`` file whose header names its model, as ``vitscale convert`` and
    ``vitscale train`` write them) as ``out`` in ``library``'s layout; returns ``out``."""
    from vitscale.checkpoint.weights import write_weights
    from vitscale.export.source import load_source

    source = load_source(weights)  # the model the header names, the weights loaded strictly
    adapter = source.family.adapter(library)  # a family without one: one line naming the adapters it has
    sd = {k: v.contiguous() for k, v in adapter.to_library(source.model).items()}
    adapter.create(source.model, load_weights=False).load_state_dict(sd, strict=True)
    out = Path(out)
    meta = {"format": "pt", "library": library, "converted_from": source.name}
    if source.name in adapter.names:  # the library's registered model of the same architecture
        meta["library_model"] = adapter.names[source.name]
    write_weights(sd, out, meta)
    return out


__all__ = ["write_library_weights"]
