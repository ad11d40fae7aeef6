"""Model weights in and out of vitscale: full (unsharded) weights read from a ``.safetensors`` file or
a checkpoint, loaded into a (possibly sharded) model, and exported as a checksummed ``.safetensors``."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

from ..param_names import with_current_names
from .collective import all_ok, cause, rank_world
from .discovery import find_checkpoint, is_step_folder, list_checkpoints
from .integrity import CheckpointError, naming_errors
from .safetensors_io import read_safetensors, write_safetensors
from .state import NonFiniteWeights, nonfinite_names, some_names
from .storage import read_full


class SaveError(CheckpointError):
    """A checkpoint or export could not be written; its partial files are gone."""


# ------------------------------------------------------------------------------------- reading
def subtree(key: str, prefix: str | None = None) -> str:
    """The checkpoint prefix of the weights ``key`` names: ``model.`` (the family's model), ``ema.``, or
    ``prefix`` (a weight set of a task's training module, e.g. ``task.teacher.backbone.``: the caller
    asks the run's task where it keeps it, :attr:`vitscale.tasks.module.TrainModule.weight_sets`)."""
    return prefix if prefix is not None else f"{key}."


def read_weights(path: str | os.PathLike, key: str = "model", prefix: str | None = None) -> dict[str, torch.Tensor]:
    """Full (unsharded) CPU weights from a ``.safetensors`` file or a checkpoint / run folder,
    verified (checksums; the newest intact checkpoint of a run folder).

    ``key`` selects the checkpoint subtree: ``model`` (the family's model), ``ema``, or a task's weight
    set named ``key`` kept under ``prefix`` (:func:`subtree`); for a run folder holding only exported
    weights, ``model.safetensors`` / ``model_ema.safetensors``.
    """
    p = Path(path)
    if p.is_dir() and not is_step_folder(p) and not list_checkpoints(p) and not list_checkpoints(p / "checkpoints"):
        if prefix is not None:
            raise CheckpointError(f"{p}: no checkpoint to read the {key!r} weights from (a task keeps its own weight sets "
                                  "in its checkpoints only: train with checkpoint.every > 0)")  # fmt: skip
        p = p / ("model_ema.safetensors" if key == "ema" else "model.safetensors")
        if p.is_symlink():  # inside a run folder nothing is followed (docs/trust.md, "Symbolic links")
            raise CheckpointError(f"{p} is a symbolic link (to {os.readlink(p)}); a run folder's weights are its own file")
    if p.suffix == ".safetensors":
        if not p.is_file():
            raise FileNotFoundError(f"no weights file at {str(p)!r}")
        return _finite(read_safetensors(p)[0], p)
    where = subtree(key, prefix)
    ckpt, idx = find_checkpoint(p, keys={where.split(".")[0]})
    fqns = [k for k in idx["tensors"] if k.startswith(where)]
    if not fqns:
        raise KeyError(f"checkpoint {ckpt} holds no {key!r} weights")
    return _finite({k[len(where) :]: v for k, v in read_full(ckpt, idx, fqns).items()}, ckpt)


def _finite(sd: dict[str, torch.Tensor], source: Path) -> dict[str, torch.Tensor]:
    bad = nonfinite_names(sd, limit=4)
    if bad:
        raise NonFiniteWeights(f"{source}: non-finite values in {some_names(bad)}: these weights are not used")
    return sd


# ------------------------------------------------------------------------------------- loading
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


def load_model_weights(model: torch.nn.Module, sd: dict[str, torch.Tensor] | None, strict: bool = False, *,
                       source: str | os.PathLike = "the weights", from_rank0: bool = False) -> dict:  # fmt: skip
    """Load a full state dict into a (possibly sharded) model: position embeddings are resampled by
    the model's own hook. Without ``strict`` (fine-tuning, ``checkpoint.init_from``) the classifier may
    differ — another class count, or none — and is left as it is; any other tensor that is missing,
    unexpected or of another shape is an error, as is any difference with ``strict``: a
    :class:`CheckpointError` of one line naming ``source``, the counts and the first tensors with
    both shapes. Returns ``{"missing": [...], "unexpected": [...], "skipped": [...], "resized":
    [(name, shape in the file, shape loaded)]}``.

    ``from_rank0`` (under torch.distributed): only rank 0 holds ``sd`` (the others pass None); rank 0
    checks it, every rank hears the outcome, and the tensors are broadcast from rank 0, each rank
    keeping its shard (``set_model_state_dict(broadcast_from_rank0=True)``). Every rank returns rank
    0's report."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    rank0 = from_rank0 and dist.is_available() and dist.is_initialized()
    report, err = {"missing": [], "unexpected": [], "skipped": [], "resized": []}, None
    if not rank0 or dist.get_rank() == 0:
        try:
            sd, report = _fit(model, dict(sd or {}), strict, source)
        except Exception as e:  # every rank must hear of it (no rank left waiting in the broadcast)
            err = e
    if rank0:
        box = [None if err is None else (type(err).__name__, str(err)), report]
        dist.broadcast_object_list(box, src=0)  # strings and names between this job's own processes
        if box[0] is not None:
            if err is not None:
                raise err
            raise CheckpointError(box[0][1])
        report = box[1]
    elif err is not None:
        raise err
    options = StateDictOptions(full_state_dict=True, strict=False, broadcast_from_rank0=rank0)
    set_model_state_dict(model, sd if not rank0 or dist.get_rank() == 0 else {}, options=options)
    return report


def _fit(model: torch.nn.Module, sd: dict[str, torch.Tensor], strict: bool, source) -> tuple[dict, dict]:
    """``sd`` ready for ``model`` (hooks applied, the classifier's misfits dropped) and the report;
    :class:`CheckpointError` when anything else does not fit."""
    current = model.state_dict()
    sd = with_current_names(sd, current)[0]  # weights written before the per-head projections were renamed
    before = {k: tuple(v.shape) for k, v in sd.items()}
    _run_load_pre_hooks(model, sd)
    resized = [(k, before[k], tuple(v.shape)) for k, v in sd.items() if k in before and before[k] != tuple(v.shape)]
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
    shapes = {k: (_shape(sd[k]), _shape(current[k])) for k in skipped}
    for k in skipped:
        del sd[k]
    for k in unexpected:
        del sd[k]
    return sd, {"missing": missing, "unexpected": unexpected, "skipped": skipped, "resized": resized, "skipped_shapes": shapes}


# ------------------------------------------------------------------------------------- writing
def export_safetensors(model: torch.nn.Module, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Gather the full weights (rank 0 writes) into a ``.safetensors`` file, atomically, with a
    content checksum in its metadata (``vitscale.checksum``, verified by :func:`read_weights`).
    ``model``: the family's model (a task's own parts are not in it: :mod:`vitscale.tasks.module`)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    distributed = dist.is_available() and dist.is_initialized()
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=distributed))
    err = None
    if rank_world()[0] == 0:
        try:
            write_weights(sd, path, metadata)
        except Exception as e:  # every rank must hear of it (no rank left waiting)
            err = e
    if not all_ok(err is None):
        if isinstance(err, NonFiniteWeights):
            raise NonFiniteWeights(str(err))
        raise SaveError(f"could not write {path}: {cause(err)}")


def write_weights(tensors: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """``tensors`` as a checksummed ``.safetensors`` file, written to ``<path>.tmp`` then renamed;
    a failed write leaves nothing behind."""
    bad = nonfinite_names(tensors, limit=4)
    if bad:
        raise NonFiniteWeights(f"not writing {path}: non-finite values in {some_names(bad)}")
    tmp = Path(str(path) + ".tmp")
    entries = [(k, v.dtype, tuple(v.shape), (lambda v=v: v)) for k, v in tensors.items()]
    try:
        write_safetensors(tmp, entries, metadata, embed_checksum=True)
        with naming_errors(path):
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


__all__ = ["subtree", "SaveError", "export_safetensors", "load_model_weights", "read_weights", "write_weights"]
