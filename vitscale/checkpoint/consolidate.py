"""Consolidate a training checkpoint (one shard per rank, any layout) into safetensors.

Runs on one process without a process group: the chunks of every rank are verified (checksums) and
reassembled into full tensors. Large models are written in several files (``max_shard_bytes``), each loaded and
written on its own, so memory stays at one output file's worth; an index
``<name>.safetensors.index.json`` (Hugging Face layout) then maps each tensor to its file.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from .discovery import find_checkpoint
from .safetensors_io import dtype_from_code, read_safetensors
from .storage import read_full
from .weights import subtree, write_weights

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str | int | None) -> int | None:
    """``"5GB"`` / ``"500MiB"`` / ``123`` -> bytes; None / 0 -> None (one file)."""
    if text in (None, 0, "0", ""):
        return None
    if isinstance(text, int):
        return text
    s = str(text).strip().upper().replace(" ", "")
    num = s.rstrip("KMGTIB")
    unit = s[len(num) :]
    try:
        value = float(num) if unit in _UNITS else None
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < 0 or value * _UNITS[unit] >= 1 << 62:  # nan, inf, -1
        from ..errors import ConfigError

        raise ConfigError(f"--max-shard-size {text!r} is not a size: use e.g. 5GB, 500MB, 2GiB (0 = one file)")
    return int(value * _UNITS[unit])


def _run_metadata(ckpt: Path) -> dict[str, str]:
    """Model name / overrides from the run's config.yaml next to ``checkpoints/`` and the step, when
    present (informative: small regular files only, anything unreadable is left out)."""
    from .integrity import CorruptFile, member, read_json

    meta = {"source": str(ckpt), "format": "pt"}
    for cfg_path in (ckpt.parent.parent / "config.yaml", ckpt.parent / "config.yaml"):
        if cfg_path.is_file() and not cfg_path.is_symlink():
            from ..safe_yaml import read_yaml

            try:
                cfg = read_yaml(cfg_path) or {}  # within the limits of vitscale.safe_yaml (no alias bomb)
                model = cfg.get("model", {}) or {}
                if "name" in model:
                    meta["model"] = str(model["name"])
                    meta["overrides"] = json.dumps(model.get("overrides") or {})
            except (OSError, AttributeError, TypeError, ValueError):  # ConfigError is a ValueError
                pass
            break
    try:
        meta["step"] = str(int(read_json(member(ckpt, "trainer_state.json"), 1 << 20)["step"]))
    except (CorruptFile, KeyError, TypeError, ValueError):
        pass
    return meta


def consolidate(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    key: str = "model",
    dtype: torch.dtype | None = None,
    max_shard_bytes: int | None = None,
    prefix: str | None = None,
) -> list[Path]:
    """Write the ``key`` subtree (``model``, ``ema``, or a task's weight set named ``key`` kept under
    ``prefix``: :func:`~vitscale.checkpoint.weights.subtree`) of a DCP checkpoint to ``out`` (.safetensors).

    ``checkpoint`` may be a step folder, a ``checkpoints/`` folder or a run folder (newest step).
    Returns the files written, each with a content checksum in its metadata.
    """
    prefix = subtree(key, prefix)
    ckpt, idx = find_checkpoint(checkpoint, keys={prefix.split(".")[0]})
    meta = {
        k[len(prefix) :]: (torch.Size(t["shape"]), dtype_from_code(t["dtype"])) for k, t in idx["tensors"].items() if k.startswith(prefix)
    }
    if not meta:
        raise KeyError(f"checkpoint {ckpt} holds no {key!r} tensors")
    out = Path(out)
    if out.suffix != ".safetensors":
        out = out.with_suffix(".safetensors")
    out.parent.mkdir(parents=True, exist_ok=True)

    def nbytes(size, dt):
        n = 1
        for d in size:
            n *= d
        return n * torch.empty((), dtype=dtype or dt).element_size()

    groups: list[list[str]] = [[]]
    used = 0
    for name, (size, dt) in meta.items():
        b = nbytes(size, dt)
        if max_shard_bytes and groups[-1] and used + b > max_shard_bytes:
            groups.append([])
            used = 0
        groups[-1].append(name)
        used += b
    file_meta = _run_metadata(ckpt)
    files = []
    weight_map = {}
    for i, names in enumerate(groups):
        path = out if len(groups) == 1 else out.with_name(f"{out.stem}-{i + 1:05d}-of-{len(groups):05d}.safetensors")
        tensors = {n[len(prefix) :]: t for n, t in read_full(ckpt, idx, [prefix + n for n in names]).items()}
        if dtype is not None:
            tensors = {n: t.to(dtype) if t.is_floating_point() else t for n, t in tensors.items()}
        write_weights(tensors, path, file_meta)
        files.append(path)
        weight_map.update({n: path.name for n in names})
        del tensors
    if len(groups) > 1:
        total = sum(nbytes(*meta[n]) for n in meta)
        index = {"metadata": {**file_meta, "total_size": total}, "weight_map": weight_map}
        with open(out.with_name(out.name + ".index.json"), "w") as f:
            json.dump(index, f, indent=1)
    return files


def load_consolidated(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a consolidated file, or every file listed by its ``.index.json`` (checksums verified)."""
    from .integrity import check_name

    p = Path(path)
    index = p.with_name(p.name + ".index.json") if p.suffix == ".safetensors" else p
    if index.suffix == ".json" and index.is_file():
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        out = {}
        for name in files:
            out.update(read_safetensors(check_name(index.parent, name))[0])
        return out
    return read_safetensors(p)[0]


__all__ = ["consolidate", "load_consolidated", "parse_size"]
