"""Loading a ``torch.export`` archive (``.pt2``) only when nothing in it needs an unrestricted unpickler.

What ``torch.export.save`` writes (read from PyTorch's ``torch/export/pt2_archive/_package.py`` and
``torch/export/__init__.py``; the format changed in 2.8):

- torch >= 2.8 (the "pt2 archive", one root folder): ``models/<name>.json`` (the graph, JSON);
  ``data/weights/<name>_weights_config.json`` and ``data/constants/<name>_constants_config.json``
  (JSON, one entry per tensor saying whether it is raw bytes or pickled: ``use_pickle``);
  ``data/weights/weight_N`` / ``data/constants/tensor_N`` (raw tensor bytes when ``use_pickle`` is
  false); ``data/sample_inputs/<name>.pt`` (the example inputs, a ``torch.save`` pickle that
  ``torch.export.load`` reads with ``weights_only=True`` and, if that fails, retries with
  ``weights_only=False``); version / byte-order text files. Pickled tensor subclasses,
  TorchBind / opaque objects (``custom_obj_N`` / ``opaque_obj_N``, unpickled without restriction)
  and AOTInductor code (``data/aotinductor/``) may also appear.
- torch 2.6 / 2.7: ``serialized_exported_program.json`` and three ``torch.save`` pickles
  (``serialized_state_dict.pt``, ``serialized_constants.pt``, ``serialized_example_inputs.pt``),
  which ``torch.export.load`` unpickles with ``weights_only=False``.

:func:`check_archive` reads the archive as a zip (no unpickling) and refuses it unless every member
is one of those kinds, every tensor entry is raw (``use_pickle`` false), no custom / opaque object
or compiled code is present, and every pickle member loads with ``torch.load(weights_only=True)``
(the allow-listed unpickler PyTorch itself calls safe for untrusted files). A pickle that loads
under that restriction references only allow-listed callables, so ``torch.export.load``'s own
unpickling of the same bytes runs nothing else. An archive ``vitscale export`` wrote passes.

This does not make a ``.pt2`` safe to load from anyone: it is a program, and PyTorch's graph
deserializer parses its symbolic shape expressions with sympy. Load ``.pt2`` files you (or
``vitscale export``, see the SHA-256 in ``export.json``) wrote.
"""

from __future__ import annotations

import io
import json
import warnings
import zipfile
from pathlib import Path

import torch

_TEXT = {"archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id", "version"}
_LEGACY_PICKLES = {"serialized_state_dict.pt", "serialized_constants.pt", "serialized_example_inputs.pt"}


class UnsafeArchiveError(ValueError):
    """The archive holds something that would be unpickled without restriction (or is not a .pt2)."""


def _check_pickle(data: bytes, name: str) -> None:
    if not data:
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "pickle protocol 4": the refusal below says enough
            torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - any refusal of the restricted unpickler
        raise UnsafeArchiveError(f"{name}: not loadable with torch.load(weights_only=True) ({type(e).__name__})") from None


def _payload_files(config: dict, where: str) -> set[str]:
    """File names of the raw tensors a ``*_config.json`` lists; refuses pickled or object entries."""
    files = set()
    for fqn, meta in (config.get("config") or {}).items():
        path = str(meta.get("path_name", ""))
        if path.startswith(("custom_obj", "opaque_obj")):
            raise UnsafeArchiveError(f"{where}: {fqn!r} is an object constant ({path}), unpickled without restriction")
        if meta.get("use_pickle"):
            raise UnsafeArchiveError(f"{where}: {fqn!r} is pickled ({path})")
        files.add(path)
    return files


def check_archive(path: str | Path) -> None:
    """Raise :class:`UnsafeArchiveError` unless ``path`` loads through ``torch.export.load`` without
    an unrestricted unpickler (see the module docstring)."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise UnsafeArchiveError(f"{path}: not a .pt2 archive ({e})") from None
    with zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        legacy = "serialized_exported_program.json" in names
        root = names[0].split("/", 1)[0] + "/" if names and not legacy and "/" in names[0] else ""
        rel = {}
        for n in names:
            if not n.startswith(root):
                raise UnsafeArchiveError(f"{path}: member {n!r} outside the archive's root folder")
            rel[n[len(root):]] = n
        raw: set[str] = set()
        for r, n in rel.items():  # the tensor lists first: they say which members are raw bytes
            for kind in ("weights", "constants"):
                if r.startswith(f"data/{kind}/") and r.endswith(f"_{kind}_config.json"):
                    raw |= {f"data/{kind}/{f}" for f in _payload_files(json.loads(zf.read(n)), r)}
        for r, n in rel.items():
            if r in _TEXT or r in raw or (r.endswith(".json") and (r.startswith(("models/", "data/")) or legacy)):
                continue
            if r.startswith("extra/"):  # torch.export.save(extra_files=...): read back as text
                continue
            if (r.startswith("data/sample_inputs/") and r.endswith(".pt")) or (legacy and r in _LEGACY_PICKLES):
                _check_pickle(zf.read(n), r)
                continue
            raise UnsafeArchiveError(f"{path}: refusing member {r!r} (not a plain tensor, graph or text file)")


def load_program(path: str | Path):
    """``torch.export.load(path)`` after :func:`check_archive`."""
    check_archive(path)
    return torch.export.load(str(path))
