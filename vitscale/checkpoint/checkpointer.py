"""Training checkpoints through torch.distributed.checkpoint (DCP), written atomically, last K kept.

Layout of ``<output_dir>/checkpoints/``::

    step_00000100/            one checkpoint (a DCP folder)
        .metadata             DCP's index
        __0_0.distcp ...      tensors: model, optim (state tensors only), ema
        trainer_state.json    step, data position, anything else JSON (written by rank 0)
        rng_rank0.json ...    each rank's RNG states (torch, cuda, python, numpy), base64 / lists

A checkpoint is first written to ``.tmp-step_…`` and renamed once complete, so a run killed mid-save
never leaves a half checkpoint where a resume would look.

Safe loading (no arbitrary unpickling): only tensors go into DCP — non-tensor leaves (optimizer
hyper-parameters) are dropped before saving and the freshly built optimizer's are kept on load, so
DCP's bytes path (``torch.load(weights_only=False)``) is never taken. DCP's ``.metadata`` file is a
pickle: :class:`SafeFileSystemReader` reads it with a restricted unpickler that allows only DCP's
metadata classes, ``torch.Size``, dtypes/layouts, paths and builtin containers. Everything else
is JSON.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

STEP_RE = re.compile(r"^step_(\d+)$")


# ------------------------------------------------------------------------------------- safe reading
class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata only: anything outside the allow-list raises UnpicklingError."""

    _MODULES_ALL_CLASSES = ("torch.distributed.checkpoint.metadata",)
    _ALLOWED = {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
        ("torch", "Size"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"),
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "slice"),
        ("builtins", "complex"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if module in self._MODULES_ALL_CLASSES or (module, name) in self._ALLOWED:
            obj = super().find_class(module, name)
            if module in self._MODULES_ALL_CLASSES and not isinstance(obj, type):
                raise pickle.UnpicklingError(f"refusing {module}.{name} in checkpoint metadata")
            return obj
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout)):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name} from checkpoint metadata")


def safe_load_metadata(path: str | os.PathLike):
    with open(path, "rb") as f:
        return _RestrictedUnpickler(io.BufferedReader(f)).load()


class SafeFileSystemReader(FileSystemReader):
    """DCP reader whose ``.metadata`` goes through :class:`_RestrictedUnpickler`."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        metadata = safe_load_metadata(os.path.join(str(self.path), name))
        from torch.distributed.checkpoint.metadata import StorageMeta

        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        if hasattr(self, "load_id"):
            metadata.storage_meta.load_id = self.load_id
        return metadata


def tensors_only(tree: Any) -> Any:
    """The nested dict with only its tensor leaves (lists and scalars dropped)."""
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            sub = tensors_only(v)
            if sub is not None and (not isinstance(sub, dict) or sub):
                out[k] = sub
        return out
    return tree if isinstance(tree, torch.Tensor) else None


def _quiet():
    """DCP warns on every single-process save/load that it assumes a single process: it is intended."""
    import warnings

    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    return ctx


def dcp_load(state: dict, path: str | os.PathLike) -> None:
    """Load the tensors of ``state`` in place from the DCP folder ``path`` (safe reader)."""
    safe_load_metadata(Path(path) / ".metadata")  # refuse a tampered index before DCP reads it
    ctx = _quiet()
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(str(path)))
    finally:
        ctx.__exit__(None, None, None)


def read_tensor_metadata(path: str | os.PathLike) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """``{flat key: (size, dtype)}`` of every tensor in a DCP checkpoint (e.g. ``model.pos_embed``)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = safe_load_metadata(Path(path) / ".metadata")
    return {
        k: (v.size, v.properties.dtype)
        for k, v in md.state_dict_metadata.items()
        if isinstance(v, TensorStorageMetadata)
    }


# ------------------------------------------------------------------------------------- RNG as JSON
def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode()


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def rng_state() -> dict:
    import numpy as np

    v, internal, gauss = random.getstate()
    np_state = np.random.get_state()
    state = {
        "torch": _b64(torch.get_rng_state()),
        "python": [v, list(internal), gauss],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = _b64(torch.cuda.get_rng_state())
    return state


def set_rng_state(state: dict) -> None:
    import numpy as np

    torch.set_rng_state(_unb64(state["torch"]))
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(_unb64(state["cuda"]))


# ------------------------------------------------------------------------------------- checkpointer
def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as (step, path), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = STEP_RE.match(p.name)
        if m and p.is_dir() and (p / ".metadata").is_file() and (p / "trainer_state.json").is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A step folder from a step folder, a ``checkpoints/`` folder or a run folder (newest)."""
    p = Path(path)
    if (p / ".metadata").is_file():
        return p
    for root in (p, p / "checkpoints"):
        found = list_checkpoints(root)
        if found:
            return found[-1][1]
    raise FileNotFoundError(f"no checkpoint at {str(path)!r} (expected a step_N folder, checkpoints/ or a run folder)")


class Checkpointer:
    """Saves / finds / loads training checkpoints under ``root`` keeping the newest ``keep``."""

    def __init__(self, root: str | os.PathLike, keep: int = 2):
        self.root = Path(root)
        self.keep = max(int(keep), 1)

    def latest(self) -> Path | None:
        found = list_checkpoints(self.root)
        return found[-1][1] if found else None

    def save(self, step: int, state: dict, trainer_state: dict) -> Path:
        """``state``: nested dict of tensors (non-tensor leaves are dropped); ``trainer_state``: JSON."""
        rank, world = _rank_world()
        final = self.root / f"step_{step:08d}"
        tmp = self.root / f".tmp-step_{step:08d}"
        if rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
        _barrier()
        ctx = _quiet()
        try:
            dcp.save(tensors_only(state), checkpoint_id=str(tmp))
        finally:
            ctx.__exit__(None, None, None)
        with open(tmp / f"rng_rank{rank}.json", "w") as f:
            json.dump(rng_state(), f)
        if rank == 0:
            with open(tmp / "trainer_state.json", "w") as f:
                json.dump({**trainer_state, "world_size": world}, f, indent=1)
        _barrier()
        if rank == 0:
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)  # the atomic step: a checkpoint exists only once complete
            _fsync_dir(self.root)
            for _, old in list_checkpoints(self.root)[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        _barrier()
        return final

    def load(self, path: str | os.PathLike, state: dict) -> dict:
        """Load tensors into ``state`` in place and restore this rank's RNG; returns trainer_state."""
        path = Path(path)
        dcp_load(tensors_only(state), path)
        with open(path / "trainer_state.json") as f:
            trainer_state = json.load(f)
        rank, world = _rank_world()
        rng_file = path / f"rng_rank{rank}.json"
        if rng_file.is_file() and trainer_state.get("world_size", 1) == world:
            with open(rng_file) as f:
                set_rng_state(json.load(f))
        return trainer_state


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


# ------------------------------------------------------------------------------------- model weights
def read_weights(path: str | os.PathLike, key: str = "model") -> dict[str, torch.Tensor]:
    """Full (unsharded) CPU weights from a ``.safetensors`` file or a DCP checkpoint / run folder.

    ``key`` selects the DCP subtree: ``model`` or ``ema``; for a run folder holding only exported
    weights, ``model.safetensors`` / ``model_ema.safetensors``.
    """
    p = Path(path)
    if p.is_dir() and not list_checkpoints(p) and not list_checkpoints(p / "checkpoints") and not (p / ".metadata").is_file():
        p = p / ("model_ema.safetensors" if key == "ema" else "model.safetensors")
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(p))
    ckpt = resolve_checkpoint(p)
    prefix = key + "."
    meta = read_tensor_metadata(ckpt)
    tensors = {k[len(prefix):]: torch.empty(size, dtype=dtype) for k, (size, dtype) in meta.items() if k.startswith(prefix)}
    if not tensors:
        raise KeyError(f"checkpoint {ckpt} holds no {key!r} weights")
    dcp_load({key: tensors}, ckpt)
    return tensors


def _run_load_pre_hooks(model: torch.nn.Module, sd: dict) -> None:
    """Apply the modules' load_state_dict pre-hooks to a full state dict (e.g. the ViT resamples
    ``pos_embed`` to its grid), so a sharded model can then load it as a plain full state dict."""
    for prefix, module in model.named_modules():
        hooks = getattr(module, "_load_state_dict_pre_hooks", {})
        for hook in list(hooks.values()):
            hook(sd, prefix + "." if prefix else "", {}, False, [], [], [])


def load_model_weights(model: torch.nn.Module, sd: dict[str, torch.Tensor], strict: bool = False) -> dict:
    """Load a full state dict into a (possibly sharded) model: position embeddings are resampled by
    the model's own hook, tensors of another shape (a head with another class count) are skipped.
    Returns ``{"missing": [...], "unexpected": [...], "skipped": [...]}``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    sd = dict(sd)
    _run_load_pre_hooks(model, sd)
    current = model.state_dict()
    skipped = [k for k, v in sd.items() if k in current and tuple(current[k].shape) != tuple(v.shape)]
    unexpected = [k for k in sd if k not in current]
    missing = [k for k in current if k not in sd]
    for k in skipped:
        del sd[k]
    if strict and (skipped or unexpected or missing):
        raise RuntimeError(f"weights do not match the model: missing {missing}, unexpected {unexpected}, shape {skipped}")
    for k in unexpected:
        del sd[k]
    set_model_state_dict(model, sd, options=StateDictOptions(full_state_dict=True, strict=False))
    return {"missing": missing, "unexpected": unexpected, "skipped": skipped}


def export_safetensors(model: torch.nn.Module, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Gather the full weights (rank 0 writes) into a ``.safetensors`` file, atomically."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    distributed = dist.is_available() and dist.is_initialized()
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=distributed))
    if _rank_world()[0] == 0:
        sd = {k: v.detach().to("cpu").contiguous().clone() for k, v in sd.items()}
        tmp = str(path) + ".tmp"
        save_file(sd, tmp, metadata=metadata or {})
        os.replace(tmp, path)
    _barrier()
