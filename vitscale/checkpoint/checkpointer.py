"""Training checkpoints through torch.distributed.checkpoint (DCP): safetensors + JSON, checksummed,
written atomically, the newest K kept, the newest *intact* one resumed.

Layout of ``<output_dir>/checkpoints/``::

    step_00000100/                 one checkpoint (format: vitscale/checkpoint/storage.py)
        checkpoint.json            index: tensors, their chunks and files (sealed JSON)
        files-rank00000.json ...   each rank's manifest: size and XXH3-64 of each file it wrote
        model-rank00000.safetensors, optim-…, ema-…   each rank's tensor chunks
        trainer_state.json         step, data position (rank 0)
        rng_rank0.json ...         each rank's RNG states (torch, cuda, python, numpy)

Nothing is unpickled on any path: tensors are raw bytes in safetensors files, everything else JSON.
A checkpoint is written to ``.tmp-step_…`` and renamed once every rank has written and checksummed
its files, so a run killed mid-save never leaves a half checkpoint where a resume would look; a save
that fails (disk full, permission) removes its partial folder and raises one readable error. Before
a resume uses a checkpoint, its files are verified against their checksums (the ranks share the
work); a damaged one is skipped with a warning naming the file, and the next older one is used.
Checkpoints of the previous format (DCP's pickled ``.metadata``) are refused (:func:`legacy_error`).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from .integrity import CheckpointError, CorruptFile, naming_errors
from .safetensors_io import read_safetensors, write_safetensors
from .storage import (
    INDEX,
    SafetensorsReader,
    SafetensorsWriter,
    read_full,
    read_manifests,
    read_member,
    verify,
)

STEP_RE = re.compile(r"^step_(\d+)$")
TRAINER_STATE = "trainer_state.json"
log = logging.getLogger("vitscale.checkpoint")


class SaveError(CheckpointError):
    """A checkpoint or export could not be written; its partial files are gone."""


class NonFiniteWeights(CheckpointError):
    """Tensors holding NaN or infinity: never written into a checkpoint or export, never loaded."""


def _flat_tensors(tree: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    if isinstance(tree, dict):
        return [kv for k, v in tree.items() for kv in _flat_tensors(v, f"{prefix}{k}.")]
    if isinstance(tree, torch.Tensor):
        return [(prefix[:-1], tree)]
    return []


def nonfinite_names(tree: Any, limit: int = 3) -> list[str]:
    """Names (dotted paths) of the floating tensors in ``tree`` holding a NaN or an infinity, at most
    ``limit``; a DTensor is checked on this rank's shard. One host read per device."""
    from torch.distributed.tensor import DTensor

    named = [(n, t.to_local() if isinstance(t, DTensor) else t) for n, t in _flat_tensors(tree)]
    named = [(n, t.detach()) for n, t in named if t.is_floating_point() and t.numel()]
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for n, t in named:
        by_device.setdefault(t.device, []).append((n, t))
    bad: list[str] = []
    for items in by_device.values():
        flags = torch.stack([torch.isfinite(t).all() for _, t in items]).tolist()
        bad += [n for (n, _), ok in zip(items, flags) if not ok]
    return sorted(bad)[:limit]


def _names(bad: list[str]) -> str:
    return ", ".join(bad[:3]) + (" and more" if len(bad) > 3 else "")


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
    warnings.filterwarnings("ignore", message="torch.distributed is (disabled|unavailable)")
    return ctx


def _cause(e: BaseException | None) -> str:
    """The root cause of a (possibly DCP-wrapped, possibly other-rank) failure, in one line."""
    failures = getattr(e, "failures", None)  # DCP's CheckpointException: {rank: (exception, traceback)}
    if isinstance(failures, dict) and failures:
        rank, exc = sorted(failures.items(), key=lambda kv: kv[0])[0]
        e = exc[0] if isinstance(exc, tuple) else exc
        prefix = f"rank {rank}: " if len(failures) < _rank_world()[1] else ""
        return prefix + _cause(e)
    if e is None:
        return "another rank failed (see its error)"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror} ({e.filename})" if e.filename else e.strerror
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]


def legacy_error(path: Path) -> CheckpointError:
    """An old-format checkpoint is never read (its index is a pickle): one line saying what to do."""
    return CheckpointError(
        f"{path} is in vitscale's old checkpoint format (a pickled DCP .metadata, which can run code when read) and is "
        f"not read: start a new train.output_dir, or for a checkpoint you made yourself, export its weights with the "
        f"vitscale that wrote it (vitscale convert {path} model.safetensors) and start from checkpoint.init_from=model.safetensors"
    )


def is_legacy(path: Path) -> bool:
    return (path / ".metadata").is_file() and not (path / INDEX).exists()


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


# ------------------------------------------------------------------------------------- collectives
def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _all_ok(ok: bool) -> bool:
    """True when every rank says ok (one all-reduce; the ranks then take the same branch)."""
    if not (dist.is_available() and dist.is_initialized()):
        return ok
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    flag = torch.tensor([0 if ok else 1], device=device)
    dist.all_reduce(flag)
    return int(flag.item()) == 0


def _all_lines(lines: list[str]) -> list[str]:
    """Every rank's lines, the same list on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return lines
    gathered: list[list[str]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, list(lines))  # strings between this run's own processes
    return sorted({line for part in gathered for line in part})


# ------------------------------------------------------------------------------------- finding
def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """Step folders under ``root`` as (step, path), oldest first (intact or not: see :func:`verify`)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_RE.match(p.name)) and p.is_dir()]
    return sorted(found)


def _is_step_folder(p: Path) -> bool:
    return (p / INDEX).is_file() or (p / ".metadata").is_file()


def _newest_intact(found: list[tuple[int, Path]], root: Path, *, keys=None, need=(), collective: bool) -> tuple[Path, dict]:
    """The newest checkpoint of ``found`` whose files all verify; damaged ones are skipped with a
    warning; raises a one-line :class:`CheckpointError` when none is intact."""
    rank, world = _rank_world() if collective else (0, 1)
    bad: list[str] = []
    for _, path in reversed(found):
        if is_legacy(path):
            raise legacy_error(path)
        idx, problems = verify(path, keys=keys, share=(rank, world), need=need)
        if collective:
            problems = _all_lines(problems)
        if not problems:
            return path, idx
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        if rank == 0:
            log.warning("skipping damaged checkpoint %s: %s%s", path.name, problems[0], more)
        bad.append(problems[0] + more)
    raise CheckpointError(f"no intact checkpoint in {root}: " + "; ".join(bad))


def find_checkpoint(path: str | os.PathLike, keys: set[str] | None = None) -> tuple[Path, dict]:
    """(step folder, verified index) from a step folder, a ``checkpoints/`` folder or a run folder
    (its newest intact checkpoint). One process; only the files holding ``keys`` are checksummed."""
    p = Path(path)
    if _is_step_folder(p):
        if is_legacy(p):
            raise legacy_error(p)
        idx, problems = verify(p, keys=keys)
        if problems:
            raise CheckpointError(f"damaged checkpoint: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
        return p, idx
    for root in (p, p / "checkpoints"):
        found = list_checkpoints(root)
        if found:
            return _newest_intact(found, root, keys=keys, collective=False)
    raise FileNotFoundError(f"no checkpoint at {str(path)!r} (expected a step_N folder, checkpoints/ or a run folder)")


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A step folder from a step folder, a ``checkpoints/`` folder or a run folder (newest intact)."""
    return find_checkpoint(path)[0]


def read_tensor_metadata(path: str | os.PathLike) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """``{flat key: (size, dtype)}`` of every tensor in a checkpoint (e.g. ``model.pos_embed``)."""
    from .safetensors_io import dtype_from_code

    _, idx = find_checkpoint(path, keys=set())
    return {k: (torch.Size(t["shape"]), dtype_from_code(t["dtype"])) for k, t in idx["tensors"].items()}


# ------------------------------------------------------------------------------------- checkpointer
class Checkpointer:
    """Saves / finds / loads training checkpoints under ``root`` keeping the newest ``keep``."""

    def __init__(self, root: str | os.PathLike, keep: int = 2):
        self.root = Path(root)
        self.keep = max(int(keep), 1)
        self._verified: tuple[Path, dict] | None = None

    def latest(self) -> Path | None:
        """The newest intact checkpoint (collective: every rank calls it, each checksums its share of
        the files); damaged newer ones are skipped with a warning. None when there is none at all."""
        found = list_checkpoints(self.root)
        if not found:
            return None
        self._verified = _newest_intact(found, self.root, need=(TRAINER_STATE,), collective=True)
        return self._verified[0]

    def save(self, step: int, state: dict, trainer_state: dict) -> Path:
        """``state``: nested dict of tensors (non-tensor leaves are dropped); ``trainer_state``: JSON.
        Raises :class:`SaveError` (the partial folder removed, older checkpoints untouched)."""
        rank, world = _rank_world()
        final = self.root / f"step_{step:08d}"
        tmp = self.root / f".tmp-step_{step:08d}"
        bad = _all_lines(nonfinite_names(state, limit=4))  # every rank checks its shards; all decide together
        if bad:
            raise NonFiniteWeights(
                f"not saving checkpoint {final}: non-finite values in {_names(bad)}; the older checkpoints in "
                f"{self.root} are intact"
            )
        err: BaseException | None = None
        if rank == 0:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                if tmp.exists():
                    shutil.rmtree(tmp)
                tmp.mkdir()
            except OSError as e:
                err = e
        if _all_ok(err is None):
            try:
                extra = {f"rng_rank{rank}.json": json.dumps(rng_state()).encode()}
                if rank == 0:
                    extra[TRAINER_STATE] = json.dumps({**trainer_state, "world_size": world}, indent=1, allow_nan=False).encode()
                ctx = _quiet()
                try:
                    dcp.save(tensors_only(state), storage_writer=SafetensorsWriter(tmp, rank, extra))
                finally:
                    ctx.__exit__(None, None, None)
            except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
                err = e
            if _all_ok(err is None) and rank == 0:
                try:
                    if final.exists():
                        shutil.rmtree(final)
                    os.replace(tmp, final)  # the atomic step: a checkpoint exists only once complete
                    _fsync_dir(self.root)
                except OSError as e:
                    err = e
        if not _all_ok(err is None):
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise SaveError(f"could not save checkpoint {final}: {_cause(err)}; its partial files were removed, the older checkpoints in {self.root} are intact")
        if rank == 0:
            for _, old in list_checkpoints(self.root)[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        _barrier()
        return final

    def load(self, path: str | os.PathLike, state: dict) -> dict:
        """Load tensors into ``state`` in place (resharded to this run's layout) and restore this
        rank's RNG; returns trainer_state. Verifies the files first unless :meth:`latest` just did."""
        path = Path(path)
        rank, world = _rank_world()
        if self._verified is not None and self._verified[0] == path:
            idx = self._verified[1]
        else:
            if is_legacy(path):
                raise legacy_error(path)
            idx, problems = verify(path, share=(rank, world), need=(TRAINER_STATE,))
            problems = _all_lines(problems)
            if problems:
                raise CheckpointError(f"damaged checkpoint: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
        files = read_manifests(path, idx)
        ctx = _quiet()
        try:
            dcp.load(tensors_only(state), storage_reader=SafetensorsReader(path, idx))
        except (Exception, CheckpointException) as e:
            raise CheckpointError(f"cannot load checkpoint {path}: {_cause(e)}") from None
        finally:
            ctx.__exit__(None, None, None)
        try:
            trainer_state = json.loads(read_member(path, TRAINER_STATE, files[TRAINER_STATE]))
            if not isinstance(trainer_state, dict) or not isinstance(trainer_state.get("step"), int):
                raise CorruptFile(path / TRAINER_STATE, "no step number")
            rng_file = f"rng_rank{rank}.json"
            if rng_file in files and trainer_state.get("world_size", 1) == world:
                set_rng_state(json.loads(read_member(path, rng_file, files[rng_file])))
        except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
            raise CheckpointError(f"cannot load checkpoint {path}: {_cause(e)}") from None
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
    """Full (unsharded) CPU weights from a ``.safetensors`` file or a checkpoint / run folder,
    verified (checksums; the newest intact checkpoint of a run folder).

    ``key`` selects the checkpoint subtree: ``model`` or ``ema``; for a run folder holding only
    exported weights, ``model.safetensors`` / ``model_ema.safetensors``.
    """
    p = Path(path)
    if p.is_dir() and not _is_step_folder(p) and not list_checkpoints(p) and not list_checkpoints(p / "checkpoints"):
        p = p / ("model_ema.safetensors" if key == "ema" else "model.safetensors")
    if p.suffix == ".safetensors":
        if not p.is_file():
            raise FileNotFoundError(f"no weights file at {str(p)!r}")
        return _finite(read_safetensors(p)[0], p)
    ckpt, idx = find_checkpoint(p, keys={key})
    prefix = key + "."
    fqns = [k for k in idx["tensors"] if k.startswith(prefix)]
    if not fqns:
        raise KeyError(f"checkpoint {ckpt} holds no {key!r} weights")
    return _finite({k[len(prefix) :]: v for k, v in read_full(ckpt, idx, fqns).items()}, ckpt)


def _finite(sd: dict[str, torch.Tensor], source: Path) -> dict[str, torch.Tensor]:
    bad = nonfinite_names(sd, limit=4)
    if bad:
        raise NonFiniteWeights(f"{source}: non-finite values in {_names(bad)}: these weights are not used")
    return sd


def _run_load_pre_hooks(model: torch.nn.Module, sd: dict) -> None:
    """Apply the modules' load_state_dict pre-hooks to a full state dict (e.g. the ViT resamples
    ``pos_embed`` to its grid), so a sharded model can then load it as a plain full state dict."""
    for prefix, module in model.named_modules():
        hooks = getattr(module, "_load_state_dict_pre_hooks", {})
        for hook in list(hooks.values()):
            hook(sd, prefix + "." if prefix else "", {}, False, [], [], [])


def _head_names(model: torch.nn.Module) -> set[str]:
    """The classifier's parameter names (the model contract), the part fine-tuning may replace."""
    try:
        return set(model.head_parameter_names())
    except (AttributeError, NotImplementedError):
        return set()


def _shape(t) -> str:
    return "x".join(map(str, tuple(t.shape))) or "scalar"


def load_model_weights(model: torch.nn.Module, sd: dict[str, torch.Tensor], strict: bool = False, *,
                       source: str | os.PathLike = "the weights") -> dict:  # fmt: skip
    """Load a full state dict into a (possibly sharded) model: position embeddings are resampled by
    the model's own hook. Without ``strict`` (fine-tuning, ``checkpoint.init_from``) the classifier may
    differ — another class count, or none — and is left as it is; any other tensor that is missing,
    unexpected or of another shape is an error, as is any difference with ``strict``: a
    :class:`CheckpointError` of one line naming ``source``, the counts and the first tensors with
    both shapes. Returns ``{"missing": [...], "unexpected": [...], "skipped": [...]}``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    sd = dict(sd)
    _run_load_pre_hooks(model, sd)
    current = model.state_dict()
    skipped = [k for k, v in sd.items() if k in current and tuple(current[k].shape) != tuple(v.shape)]
    unexpected = [k for k in sd if k not in current]
    missing = [k for k in current if k not in sd]
    head = set() if strict else _head_names(model)
    head_modules = {n.rsplit(".", 1)[0] + "." for n in head}
    fits = lambda k: k in head or any(k.startswith(m) for m in head_modules)  # noqa: E731
    wrong = [k for k in skipped if not fits(k)]
    lost = [k for k in missing if not fits(k)]
    extra = [k for k in unexpected if not fits(k)]
    if wrong or lost or extra:
        parts = []
        if wrong:
            shown = "; ".join(f"{k}: {_shape(sd[k])} in the file, {_shape(current[k])} in the model" for k in wrong[:2])
            parts.append(f"{len(wrong)} tensors of another shape ({shown}{'; ...' if len(wrong) > 2 else ''})")
        if lost:
            parts.append(f"{len(lost)} tensors missing ({', '.join(lost[:2])}{', ...' if len(lost) > 2 else ''})")
        if extra:
            parts.append(f"{len(extra)} tensors the model does not have ({', '.join(extra[:2])}{', ...' if len(extra) > 2 else ''})")
        model_name = getattr(getattr(model, "cfg", None), "name", None) or type(model).__name__
        raise CheckpointError(
            f"{source} does not fit the model ({model_name}): {', '.join(parts)}; set model.* as for "
            f"the run that wrote these weights"
        )
    for k in skipped:
        del sd[k]
    for k in unexpected:
        del sd[k]
    set_model_state_dict(model, sd, options=StateDictOptions(full_state_dict=True, strict=False))
    return {"missing": missing, "unexpected": unexpected, "skipped": skipped}


def export_safetensors(model: torch.nn.Module, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Gather the full weights (rank 0 writes) into a ``.safetensors`` file, atomically, with a
    content checksum in its metadata (``vitscale.checksum``, verified by :func:`read_weights`)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    distributed = dist.is_available() and dist.is_initialized()
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=distributed))
    err = None
    if _rank_world()[0] == 0:
        try:
            write_weights(sd, path, metadata)
        except Exception as e:  # every rank must hear of it (no rank left waiting)
            err = e
    if not _all_ok(err is None):
        if isinstance(err, NonFiniteWeights):
            raise NonFiniteWeights(str(err))
        raise SaveError(f"could not write {path}: {_cause(err)}")


def write_weights(tensors: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """``tensors`` as a checksummed ``.safetensors`` file, written to ``<path>.tmp`` then renamed;
    a failed write leaves nothing behind."""
    bad = nonfinite_names(tensors, limit=4)
    if bad:
        raise NonFiniteWeights(f"not writing {path}: non-finite values in {_names(bad)}")
    tmp = Path(str(path) + ".tmp")
    entries = [(k, v.dtype, tuple(v.shape), (lambda v=v: v)) for k, v in tensors.items()]
    try:
        write_safetensors(tmp, entries, metadata, embed_checksum=True)
        with naming_errors(path):
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
