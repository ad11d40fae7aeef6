"""Weights people already have, read into a vitscale model: ``checkpoint.init_from``,
``distill.teacher`` and ``vitscale.create_model(name, pretrained=...)`` all come here.

A source is one of (docs/finetuning.md, "Where the weights come from"):

- a vitscale run folder, checkpoint (step folder, ``checkpoints/``) or ``.safetensors`` file;
- a timm or open_clip file: ``.safetensors``, or a pickle (``.pth``, ``.pt``, ``.bin``, ``.pth.tar``)
  read with ``torch.load(weights_only=True)`` — tensors and plain containers only, never code;
- a Hugging Face Hub snapshot folder: timm's (``config.json`` + ``model.safetensors`` or
  ``pytorch_model.bin``) or open_clip's (``open_clip_config.json`` + ``open_clip_model.safetensors``
  or ``open_clip_pytorch_model.bin``);
- ``hf-hub:org/name[@revision]``: that snapshot folder in the local Hugging Face cache
  (:mod:`vitscale.interop.hub`; never downloaded).

**The format is told, never guessed.** vitscale keeps the fused projections' rows per head (for tensor
parallelism) where timm and open_clip stack ``[q; k; v]``, and names them for it (``attn.qkv_per_head``
for timm's ``attn.qkv``, ...: :mod:`vitscale.param_names`), so a state dict's names say whose layout it
holds: a plain ``save_file(model.state_dict())`` of a timm model or of a vitscale one loads as what it
is. What tells: a folder's kind (a run folder, a Hub snapshot's ``config.json``), vitscale's own
metadata (every ``.safetensors`` vitscale writes carries ``vitscale.checksum``), and the names (the
families' ``recognizes``: vitscale's ``*_per_head``, open_clip's ``visual.conv1``, timm's VOLO
``network.*``); a pickle whose names fit vitscale's and a library's is the library's (vitscale writes
none). Weights in vitscale's format written before the rename carry the former names (timm's); read
as vitscale's, they are mapped to the current ones — a run folder, a checkpoint, a file with vitscale's
metadata, or, told by names timm never writes, a NaFlex, CLIP or VOLO state dict, a ViT-22B one or a
ViT whose ``cls_token`` holds registers.

``checkpoint.init_format`` (``pretrained_format``, ``distill.teacher_format``) names the format where
the names cannot tell: a plain ViT state dict written by ``save_file`` from a vitscale model before the
rename has timm's names and is read as timm's unless ``init_format=vitscale`` says otherwise; and a
family whose namings overlap (a plug-in's) is refused until told.

A library's state dict is converted by the model family's adapter (``FamilySpec.adapters``:
``from_state_dict``); the architecture the weights show (``FamilySpec.architecture``) is compared
with the run's model config, naming the first field that differs. Loading itself is
:func:`vitscale.checkpoint.load_model_weights` (position embeddings resampled by the model's hook,
the classifier free to differ); :func:`describe` turns its report into the lines a run prints.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint import CheckpointError, read_weights
from ..checkpoint.safetensors_io import CHECKSUM_KEY, read_metadata
from ..errors import UserError
from ..models.registry import FamilySpec, family_of
from ..param_names import with_current_names
from . import hub

FORMATS = ("vitscale", "timm", "open_clip", "transformers")
PICKLES = (".pth", ".pt", ".bin", ".tar", ".ckpt")
# Hub snapshot folders: (library, config file, weights files in order of preference); a config.json
# naming a model_type is transformers' (interop/transformers.py), one without timm's
HUB_LAYOUTS = (
    ("open_clip", "open_clip_config.json", ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")),
    ("timm", "config.json", ("model.safetensors", "pytorch_model.bin")),
)
_JSON_LIMIT = 10_000_000
_MISSING = object()


@dataclass
class Source:
    """Weights read from a source, in the source's own naming, and what the source says about them."""

    given: str
    """The source as the user gave it (a path, ``hf-hub:org/name``)."""
    path: Path
    """The file (or checkpoint folder) the tensors were read from."""
    format: str
    """``vitscale``, ``timm`` or ``open_clip``."""
    why: str
    """How the format was told (for the log line)."""
    tensors: dict[str, torch.Tensor]
    """The state dict, in the format's naming and layouts."""
    model: str | None = None
    """The vitscale variant the source names (vitscale metadata, a run folder's config), if any."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """That variant's overrides."""
    preprocess: dict[str, Any] = field(default_factory=dict)
    """What the source says its images were: ``mean``, ``std`` (of pixels in [0, 1]), ``img_size``
    ``(H, W)``, ``interpolation``, ``crop_pct`` — where it says (a run's config, a Hub config)."""
    label_names: list[str] | None = None
    """The class names the source gives, in the order of its classifier (a timm Hub config's
    ``label_names``, a vitscale run's ``classnames.txt``)."""
    library_config: dict[str, Any] | None = None
    """A transformers snapshot's ``config.json``: compared with the model the weights go into
    (:func:`vitscale.interop.transformers.check_config`)."""


# ----------------------------------------------------------------------------------- reading
def read_source(given: str | os.PathLike, family: FamilySpec, fmt: str | None = None, *, weights: str = "model",
                setting: str = "checkpoint.init_from", format_key: str = "checkpoint.init_format") -> Source:  # fmt: skip
    """The weights of ``given`` for a model of ``family``, their format told (or ``fmt``, named by the
    user). One-line :class:`UserError` for a source that is missing, damaged, unreadable, of an
    unknown kind, of a format the family has no adapter for, or whose format cannot be told."""
    given = str(given)
    where = f"{setting}={given}"
    if fmt is not None and fmt not in FORMATS:
        raise UserError(f"{format_key}={fmt}: one of {', '.join(FORMATS)}")
    p = hub.resolve(given, setting) if hub.is_hub_id(given) else Path(given)
    if not p.exists():
        raise UserError(f"{where}: no such file or folder (a run folder, checkpoint, .safetensors / .pth / .bin file, "
                        "Hub snapshot folder, or hf-hub:org/name)")  # fmt: skip
    if p.is_dir():
        return _read_folder(given, p, family, fmt, weights, where, format_key)
    return _read_file(given, p, family, fmt, where, format_key)


def _read_folder(given, p: Path, family: FamilySpec, fmt, weights, where, format_key) -> Source:
    layouts = []
    for lib, cfg_name, files in HUB_LAYOUTS:
        found = next((p / f for f in files if (p / f).is_file()), None)
        if (p / cfg_name).is_file() and found is not None:
            if lib == "timm" and _is_transformers_folder(p / cfg_name, where):
                lib = "transformers"
            layouts.append((lib, p / cfg_name, found))
    if fmt == "vitscale" or not layouts:  # a run folder, checkpoints/ or a step folder
        if fmt not in (None, "vitscale"):
            raise UserError(f"{where}: a folder without a {fmt} Hub snapshot's files ({format_key}={fmt})")
        tensors = _checked(lambda: read_weights(p, weights), where)
        src = Source(given, p, "vitscale", "a vitscale run / checkpoint folder", tensors)
        run = next((d for d in (p, p.parent, p.parent.parent) if (d / "config.yaml").is_file()), None)  # run, checkpoints/, step_N
        if run is not None:
            _from_run_config(src, run)
        return src
    mine = [entry for entry in layouts if entry[0] == fmt or (fmt is None and entry[0] in family.adapters)]
    if not mine:
        libs = ", ".join(lib for lib, _, _ in layouts)
        own = ", ".join(sorted(family.adapters)) or "none"
        raise UserError(f"{where}: a {libs} Hub snapshot folder; the {family.name} family reads {own} files "
                        f"(set model.name to a variant of the weights' family)")  # fmt: skip
    lib, cfg_file, wfile = mine[0]
    src = _read_file(given, wfile, family, lib, where, format_key)
    src.why = f"a {lib} Hub snapshot folder ({cfg_file.name})"
    _from_hub_config(src, lib, cfg_file, where)
    return src


def _read_file(given, p: Path, family: FamilySpec, fmt, where, format_key) -> Source:
    name = p.name.lower()
    if name.endswith(".safetensors"):
        meta = _checked(lambda: read_metadata(p), where)
        tensors = _checked(lambda: read_weights(p), where)
        if CHECKSUM_KEY in meta and meta.get("library") in FORMATS[1:]:  # vitscale convert --to LIBRARY
            if fmt not in (None, meta["library"]):
                raise UserError(f"{where}: its metadata says it holds {meta['library']}'s layout (vitscale convert --to "
                                f"{meta['library']}), not {fmt}'s; leave {format_key} unset")  # fmt: skip
            return Source(given, p, meta["library"], f"vitscale's metadata (library={meta['library']})", tensors)
        if CHECKSUM_KEY in meta:  # written by vitscale (export, convert): its own layout
            if fmt not in (None, "vitscale"):
                raise UserError(f"{where} carries vitscale's metadata ({CHECKSUM_KEY}): it is in vitscale's layout, "
                                f"not {fmt}'s; leave {format_key} unset")  # fmt: skip
            src = Source(given, p, "vitscale", f"vitscale's metadata ({CHECKSUM_KEY})", tensors)
            if "model" in meta:
                src.model = meta["model"]
                src.overrides = _json_dict(meta.get("overrides"))
            _from_run_config(src, p.parent)
            return src
        if fmt is not None:
            return Source(given, p, fmt, f"{format_key}={fmt}", tensors)
        return Source(given, p, *_tell(tensors, family, pickle=False, where=where, format_key=format_key), tensors)
    if name.endswith(PICKLES):
        tensors = _load_pickle(p, where)
        if fmt is not None:
            return Source(given, p, fmt, f"{format_key}={fmt}", tensors)
        return Source(given, p, *_tell(tensors, family, pickle=True, where=where, format_key=format_key), tensors)
    raise UserError(f"{where}: not a weights file vitscale reads (.safetensors, .pth, .pt, .bin; a run folder, "
                    "a Hub snapshot folder or hf-hub:org/name)")  # fmt: skip


def _checked(read, where: str):
    """``read()``, its errors one line naming the setting."""
    try:
        return read()
    except CheckpointError as e:
        raise CheckpointError(f"{where}: {e}") from None
    except UserError:
        raise
    except (OSError, KeyError, ValueError) as e:
        raise UserError(f"{where}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def read_pickle(p: str | Path, where: str) -> Any:
    """The one bounded reader of a PyTorch pickle (``.pth``, ``.pt``, ``.bin``): ``torch.load(
    weights_only=True)`` (PyTorch's allow-listed unpickler: tensors and plain containers, no code),
    then every tensor in it checked by :func:`pickled_tensor_problem` before anything reads its
    values (a stride-0 view of a few bytes as 2^32 elements asked for 16 GB when converted). Every
    pickle vitscale reads — teachers, fine-tuning sources, TokenLabeling's label files — comes
    through here; a problem is a :class:`UserError` naming ``where`` and the tensor."""
    import pickle

    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f" (it calls {found.group(1)})" if found else ""
        raise UserError(f"{where}: refused by torch.load(weights_only=True): the pickle holds more than tensors{what}; "
                        "vitscale runs no code from a file") from None  # fmt: skip
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{where}: not a readable PyTorch file (truncated or damaged?): {first[:200]}") from None
    for name, t in _tensors_in(obj):
        problem = pickled_tensor_problem(t)
        if problem:
            raise UserError(f"{where}: tensor {name!r} {problem}: not plain weights, nothing of it is read")
    return obj


def _tensors_in(obj, prefix: str = "", depth: int = 0):
    """(name, tensor) of every tensor in a loaded pickle's containers (dicts, lists, tuples)."""
    if isinstance(obj, torch.Tensor):
        yield prefix or "(the file's tensor)", obj
    elif depth < 16 and isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors_in(v, f"{prefix}.{k}" if prefix else str(k), depth + 1)
    elif depth < 16 and isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors_in(v, f"{prefix}[{i}]", depth + 1)


def _load_pickle(p: Path, where: str) -> dict[str, torch.Tensor]:
    """The tensors of a third-party pickle through :func:`read_pickle`; a training checkpoint's model
    is taken from its ``state_dict`` / ``model`` / ``module`` entry."""
    obj = read_pickle(p, where)
    for key in ("state_dict", "model", "module", "state_dict_ema"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict):
        raise UserError(f"{where}: holds a {type(obj).__name__}, not a state dict of tensors")
    tensors = {k.removeprefix("module."): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise UserError(f"{where}: holds no tensors")
    from ..checkpoint.state import NonFiniteWeights, nonfinite_names, some_names

    bad = nonfinite_names(tensors, limit=4)
    if bad:
        raise NonFiniteWeights(f"{where}: non-finite values in {some_names(bad)}: these weights are not used")
    return tensors


def pickled_tensor_problem(t: torch.Tensor) -> str | None:
    """Why a tensor from a pickle is not plain weights, else None: a layout other than dense (sparse,
    quantized), a shape past the bounds of :func:`vitscale.checkpoint.geometry.shape_problem`, or a view
    over fewer bytes than it claims (a pickle may rebuild any strides: a stride-0 view of 8 bytes as
    2^40 elements made the finiteness check read 2^40 numbers). Only the bytes in the file are worked on."""
    from ..checkpoint.geometry import shape_problem

    if t.layout != torch.strided or t.is_quantized:
        return f"is a {str(t.layout).removeprefix('torch.')}{' quantized' if t.is_quantized else ''} tensor (only dense ones are read)"
    problem = shape_problem(list(t.shape), t.element_size())
    if problem:
        return f"has {problem}"
    if t.numel() == 0:
        return None
    have = t.untyped_storage().nbytes()
    reach = (t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()
    if t.numel() * t.element_size() > have or reach > have:
        return (f"is a view of {t.numel()} elements (strides {list(t.stride())[:8]}) over {have} bytes of storage "
                "(a stride-0 or overlapping view)")  # fmt: skip
    return None


def _tell(tensors, family: FamilySpec, *, pickle: bool, where: str, format_key: str) -> tuple[str, str]:
    """(format, why) of a file without vitscale metadata, from its names; refused when they cannot tell."""
    own = family.recognizes_own(tensors)  # the names (a predicate may read the shapes too)
    libs = [lib for lib in sorted(family.adapters) if (a := family.adapter(lib)).recognizes and a.recognizes(tensors)]
    if len(libs) > 1:
        raise UserError(f"{where}: its names fit {' and '.join(libs)}: set {format_key}=" + "|".join(libs))
    if libs and own:
        if pickle:  # vitscale writes no pickles (docs/trust.md): the library's
            return libs[0], f"a pickle (vitscale writes none) in {libs[0]}'s naming"
        raise UserError(f"{where}: its names fit both {libs[0]}'s naming and vitscale's, and the file carries no "
                        f"vitscale metadata: set {format_key}={libs[0]} or {format_key}=vitscale")  # fmt: skip
    if libs:
        return libs[0], f"{libs[0]}'s naming"
    if own:
        return "vitscale", "vitscale's naming"
    keys = set(tensors)
    hint = _whose(keys, family)
    some = ", ".join(list(tensors)[:2])
    raise UserError(f"{where}: its names ({some}, ...) are none the {family.name} family reads"
                    f"{hint}")  # fmt: skip


def _whose(keys: set[str], mine: FamilySpec) -> str:
    """``; they look like ...`` when another family's namings fit the names."""
    from ..models.registry import families

    for f in families().values():
        if f.name == mine.name:
            continue
        namings = [lib for lib in sorted(f.adapters) if (a := f.adapter(lib)).recognizes and a.recognizes(keys)]
        namings += ["vitscale"] if f.recognizes_own(keys) else []
        if namings:
            return f"; they look like a {' or '.join(namings)} {f.name} (set model.name to a {f.name} variant)"
    return ""


def _json_dict(text: str | None) -> dict:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _read_json(path: Path, where: str) -> dict:
    from ..checkpoint.integrity import read_json

    with open(path, "rb") as f:  # a Hub snapshot's files are links into its blobs/: followed
        data = f.read(_JSON_LIMIT + 1)
    if len(data) > _JSON_LIMIT:
        raise UserError(f"{where}: {path.name} is over {_JSON_LIMIT} bytes")
    obj = _checked(lambda: read_json(path, _JSON_LIMIT, data=data), where)
    if not isinstance(obj, dict):
        raise UserError(f"{where}: {path.name} is not a JSON object")
    return obj


def _floats(v) -> tuple[float, ...] | None:
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return tuple(float(x) for x in v)
    return None


def _is_transformers_folder(cfg_file: Path, where: str) -> bool:
    from .transformers import is_transformers_config

    return is_transformers_config(_read_json(cfg_file, where))


def _from_hub_config(src: Source, lib: str, cfg_file: Path, where: str) -> None:
    """The preprocessing and class names a Hub config gives (timm ``pretrained_cfg``, open_clip
    ``preprocess_cfg``, transformers' ``preprocessor_config.json`` and ``id2label``)."""
    cfg = _read_json(cfg_file, where)
    if lib == "transformers":
        src.library_config = cfg
        pre = cfg_file.parent / "preprocessor_config.json"
        pc = _read_json(pre, where) if pre.is_file() else {}
        pc = {"mean": pc.get("image_mean"), "std": pc.get("image_std")}
        labels = cfg.get("id2label")
        names = None
        if isinstance(labels, dict) and labels and all(isinstance(v, str) for v in labels.values()):
            try:
                order = sorted(labels, key=int)
            except ValueError:
                order = []
            if order and not all(labels[k] == f"LABEL_{k}" for k in order):  # transformers' placeholder names
                names = [labels[k] for k in order]
    elif lib == "timm":
        pc = cfg.get("pretrained_cfg") if isinstance(cfg.get("pretrained_cfg"), dict) else {}
        size = pc.get("input_size")
        if isinstance(size, list) and len(size) == 3 and all(isinstance(x, int) for x in size):
            src.preprocess["img_size"] = (size[1], size[2])
        for k in ("interpolation", "crop_pct"):
            if isinstance(pc.get(k), (str, float, int)):
                src.preprocess[k] = pc[k]
        names = cfg.get("label_names")
    else:
        pc = cfg.get("preprocess_cfg") if isinstance(cfg.get("preprocess_cfg"), dict) else {}
        vision = (cfg.get("model_cfg") or {}).get("vision_cfg") if isinstance(cfg.get("model_cfg"), dict) else None
        side = vision.get("image_size") if isinstance(vision, dict) else None
        if isinstance(side, int):
            src.preprocess["img_size"] = (side, side)
        names = None
    for k in ("mean", "std"):
        if _floats(pc.get(k)):
            src.preprocess[k] = _floats(pc[k])
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        src.label_names = list(names)


def _from_run_config(src: Source, folder: Path) -> None:
    """The model and preprocessing of a vitscale run folder's ``config.yaml`` (when there is one)."""
    path = folder / "config.yaml"
    if not path.is_file() or path.is_symlink():  # a run folder's files are its own (docs/trust.md)
        return
    from ..safe_yaml import read_yaml

    try:
        cfg = read_yaml(path)
    except UserError:
        return
    if not isinstance(cfg, dict):
        return
    model, data = cfg.get("model") or {}, cfg.get("data") or {}
    if src.model is None and isinstance(model, dict) and isinstance(model.get("name"), str):
        src.model, src.overrides = model["name"], dict(model.get("overrides") or {})
    if isinstance(data, dict):
        for k in ("mean", "std"):
            if _floats(data.get(k)):
                src.preprocess[k] = _floats(data[k])
        for k in ("interpolation", "crop_pct"):
            if isinstance(data.get(k), (str, float, int)) and not isinstance(data.get(k), bool):
                src.preprocess[k] = data[k]
        if isinstance(data.get("img_size"), int):
            src.preprocess["img_size"] = (data["img_size"], data["img_size"])
    if src.label_names is None:  # the run's classes, by name (written at its start)
        from ..data.classes import run_class_names

        src.label_names = run_class_names(folder)


# ----------------------------------------------------------------------------------- converting
def to_vitscale(src: Source, family: FamilySpec, cfg: Any, where: str) -> dict[str, torch.Tensor]:
    """The source's state dict in vitscale's naming for a model of ``family`` with config ``cfg``,
    through the family's adapter to the source's library. vitscale weights written before the
    per-head projections were renamed get the current names (:mod:`vitscale.param_names`; the source's
    ``why`` says how many)."""
    if src.format == "vitscale":
        wanted = family.model_cls(cfg, device="meta").state_dict()
        sd, former = with_current_names(src.tensors, wanted)
        if former and "former names" not in src.why:  # (said once: a source may be converted twice)
            src.why += f"; {len(former)} tensors under their former names (before the *_per_head rename: {former[0]}, ...) renamed"
        return sd
    try:
        adapter = family.adapter(src.format)
    except NotImplementedError as e:
        raise UserError(f"{where}: {src.format} weights, but {e}") from None
    if adapter.from_state_dict is None:
        raise UserError(f"{where}: the {family.name} family's {src.format} adapter reads no state dicts")
    try:
        return adapter.from_state_dict(dict(src.tensors), cfg)
    except (KeyError, RuntimeError, ValueError, IndexError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{where}: {src.format} weights that do not convert to {family.name} (from {src.why}): {first[:200]}") from None


def _field(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part, _MISSING)
        if cfg is _MISSING:
            return _MISSING
    return cfg


NOT_COMPARED = ("num_classes", "img_h", "img_w")


def _derived_doc(cfg: Any, dotted: str) -> str | None:
    """The docstring of the property ``dotted`` of ``cfg`` when it is one (a value derived from several
    fields, which cannot be set itself), else None."""
    head, _, attr = dotted.rpartition(".")
    owner = _field(cfg, head) if head else cfg
    prop = getattr(type(owner), attr, None)
    return (prop.__doc__ or attr).strip() if isinstance(prop, property) else None


def check_library_config(src: Source, cfg: Any, where: str, key_prefix: str = "model.") -> None:
    """One-line :class:`UserError` when a transformers folder's ``config.json`` describes another
    network than ``cfg`` (settings the weights do not show: the norms' epsilon, the activation, ...)."""
    if src.format == "transformers" and src.library_config is not None:
        from .transformers import check_config

        if type(cfg).__name__ == "ViTConfig":
            check_config(src.library_config, cfg, where, key_prefix)
        elif type(cfg).__name__ == "CLIPConfig":  # a CLIPModel's image tower (its text tower: by its shapes)
            check_config(src.library_config, cfg.vision, where, key_prefix + "vision.")


def check_architecture(family: FamilySpec, cfg: Any, sd: dict[str, torch.Tensor], where: str, label: str,
                       key_prefix: str = "model.") -> None:  # fmt: skip
    """One-line :class:`UserError` naming the first config field whose value the weights contradict
    (``FamilySpec.architecture``; the class count and image size adapt, so they are not compared)."""
    found = family.architecture_of(sd)
    diffs = []
    for name, value in found.items():
        if name.rsplit(".", 1)[-1] in NOT_COMPARED:
            continue
        have = _field(cfg, name)
        if have is not _MISSING and have != value:
            diffs.append((name, value, have))
    if diffs:
        name, value, have = diffs[0]
        more = f" (and {len(diffs) - 1} more: {', '.join(d[0] for d in diffs[1:4])})" if len(diffs) > 1 else ""
        other = f"{key_prefix}name" if key_prefix else "the model name"
        derived = _derived_doc(cfg, name)  # a property of several fields (the ViT's learned_pos_table)
        if derived is None:
            fix = f"set {key_prefix}{name}={json.dumps(value)} (or {other} to the weights' variant)"
        else:
            fix = f"set {other} to the weights' variant, or the settings that give {name}={json.dumps(value)} ({derived})"
        raise UserError(f"{where} holds a {family.name} with {name}={value!r}; the model ({label}) has "
                        f"{name}={have!r}{more}: {fix}")  # fmt: skip


def file_classes(family: FamilySpec, sd: dict[str, torch.Tensor]) -> int | None:
    """The class count the weights' classifier has (None when the family cannot say)."""
    n = family.architecture_of(sd).get("num_classes")
    return int(n) if isinstance(n, int) else None


# ----------------------------------------------------------------------------------- loading
def prepare(model_cfg: Any, family: FamilySpec, given: str, fmt: str | None = None, *, weights: str = "model",
            setting: str = "checkpoint.init_from", format_key: str = "checkpoint.init_format",
            label: str = "", source: Source | None = None) -> tuple[Source, dict[str, torch.Tensor]]:  # fmt: skip
    """Read, convert and check ``given`` for a model of ``family`` built from ``model_cfg``: the source
    and its state dict in vitscale's naming (still to be loaded, e.g. with
    :func:`vitscale.checkpoint.load_model_weights`)."""
    where = f"{setting}={given}"
    src = source or read_source(given, family, fmt, weights=weights, setting=setting, format_key=format_key)
    check_library_config(src, model_cfg, where)  # a transformers config.json's settings, before its tensors
    sd = to_vitscale(src, family, model_cfg, where)
    check_architecture(family, model_cfg, sd, where, label or "model.name with model.overrides")
    return src, sd


def describe(src: Source, report: dict, setting: str, model: nn.Module, n_tensors: int) -> list[str]:
    """What loading ``src`` did, a line each: where from and how the format was told, position
    embeddings resampled, a classifier re-initialised, missing and unexpected tensors."""
    lines = [f"{setting}: {n_tensors} tensors from {src.path} ({src.format}: {src.why})"]
    for name, old, new in report.get("resized", []):
        lines.append(f"{setting}: {name} resampled from {'x'.join(map(str, old))} to {'x'.join(map(str, new))} "
                     "(the model's image size / patch grid)")  # fmt: skip
    head = set(model.head_parameter_names())
    shapes = report.get("skipped_shapes", {})
    reinit = [k for k in report.get("skipped", []) if k in head]
    if reinit:
        k = next((k for k in reinit if k.endswith(".weight")), reinit[0])
        lines.append(f"{setting}: classifier re-initialised: {k} is {shapes.get(k, ('?',))[0]} in the weights, "
                     f"{shapes.get(k, ('', '?'))[1]} here ({model.num_classes} classes)")  # fmt: skip
    missing = [k for k in report.get("missing", []) if k not in reinit]
    if missing:
        lines.append(f"{setting}: {len(missing)} tensors not in the weights, left as initialised: {_some(missing)}")
    if report.get("unexpected"):
        lines.append(f"{setting}: {len(report['unexpected'])} tensors of the weights not used: {_some(report['unexpected'])}")
    return lines


def _some(names: list[str], n: int = 4) -> str:
    return ", ".join(names[:n]) + (f", ... ({len(names) - n} more)" if len(names) > n else "")


def load_pretrained(model: nn.Module, given: str, fmt: str | None = None, *, setting: str = "checkpoint.init_from",
                    format_key: str = "checkpoint.init_format", label: str = "", weights: str = "model",
                    from_rank0: bool = False, complete: bool = False, source: Source | None = None,
                    ) -> tuple[Source | None, list[str], dict]:  # fmt: skip
    """Load ``given`` into ``model`` (possibly sharded): read, convert and checked on rank 0 only with
    ``from_rank0`` (the others wait and receive their shards), on this process otherwise. Returns the
    source (None on ranks that did not read), the lines :func:`describe` gives and the report of
    :func:`vitscale.checkpoint.load_model_weights` (both on every rank).
    ``complete``: every tensor of the model must come from the weights (a teacher: no classifier left
    re-initialised). ``source``: ``given`` already read (by this rank)."""
    import torch.distributed as dist

    from ..checkpoint import load_model_weights

    family = family_of(model)
    reads = not (from_rank0 and dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
    src, sd, err = None, None, None
    if reads:
        try:
            src, sd = prepare(model.cfg, family, given, fmt, weights=weights, setting=setting, format_key=format_key,
                              label=label, source=source)  # fmt: skip
        except Exception as e:  # the other ranks must hear of it before they wait for the weights
            err = e
    if from_rank0 and dist.is_available() and dist.is_initialized():
        box = [None if err is None else str(err)]
        dist.broadcast_object_list(box, src=0)
        if box[0] is not None:
            raise err if err is not None else UserError(box[0])
    elif err is not None:
        raise err
    n = len(sd) if sd is not None else 0
    report = load_model_weights(model, sd, source=f"{setting}={given}", from_rank0=from_rank0)
    gaps = report["missing"] + report["skipped"]
    if complete and gaps:  # the same report on every rank: every rank stops
        raise UserError(f"{setting}={given}: {len(gaps)} tensors of the model ({label or type(model).__name__}) are not "
                        f"in the weights or have another shape ({_some(gaps, 3)}): set its model and overrides to the weights'")  # fmt: skip
    lines = describe(src, report, setting, model, n) if src is not None else []
    if from_rank0 and dist.is_available() and dist.is_initialized():
        box = [lines]
        dist.broadcast_object_list(box, src=0)
        lines = box[0]
    return src, lines, report


def create_pretrained(name: str, pretrained: str, fmt: str | None = None, **overrides: Any) -> nn.Module:
    """``vitscale.create_model(name, pretrained=...)``: the registered model ``name`` (with
    ``overrides``) carrying the weights of ``pretrained`` — a path or ``hf-hub:org/name``, any source
    of :func:`read_source`; without ``overrides``, a vitscale source of the same variant gives its own
    (a run folder's config, an export's header). Without ``num_classes`` the model takes the weights'
    class count; with another one the classifier is re-initialised (a warning says so), as are
    position embeddings resampled to the configured image size."""
    import warnings

    from ..models.registry import resolve_model

    device, dtype = overrides.pop("device", None), overrides.pop("dtype", None)
    overrides.pop("init", None)  # every weight is loaded (a re-initialised classifier is initialised anyway)
    variant = resolve_model(name)  # the registry asked once: the overrides below apply to it
    family = variant.family
    where = f"pretrained={pretrained}"
    src = read_source(pretrained, family, fmt, setting="pretrained", format_key="pretrained_format")
    if not overrides and src.model == name:  # a vitscale run or export of this variant: its own overrides
        overrides = dict(src.overrides)
    resolved = variant.with_overrides(overrides)
    check_library_config(src, resolved.cfg, where, key_prefix="")
    sd = to_vitscale(src, family, resolved.cfg, where)
    classes = file_classes(family, sd)
    if "num_classes" in resolved.fields and "num_classes" not in overrides and classes is not None:
        resolved = variant.with_overrides({**overrides, "num_classes": classes})
    check_architecture(family, resolved.cfg, sd, where, name, key_prefix="")
    from ..checkpoint import load_model_weights

    model = resolved.create()
    report = load_model_weights(model, sd, source=where)
    model = model.to(device=device, dtype=dtype) if device is not None or dtype is not None else model
    for line in describe(src, report, "pretrained", model, len(sd))[1:]:
        warnings.warn(line, stacklevel=2)
    return model.eval()


__all__ = [
    "FORMATS", "Source", "check_architecture", "create_pretrained", "describe", "file_classes", "load_pretrained",
    "prepare", "read_source", "to_vitscale",
]  # fmt: skip
