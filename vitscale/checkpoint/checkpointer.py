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
work; :mod:`vitscale.checkpoint.discovery`); a damaged one is skipped with a warning naming the file,
and the next older one is used. Checkpoints of the previous format (DCP's pickled ``.metadata``) are
refused (:func:`vitscale.checkpoint.discovery.legacy_error`).

The other jobs live beside this one: finding and verifying checkpoints (``discovery.py``), what a
checkpoint holds (``state.py``), model weights in and out (``weights.py``), the file format
(``storage.py``) and its checksums (``integrity.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ..param_names import with_former_names
from .async_save import Pending, StagingBuffers, StagingWriter, nonfinite_failure
from .collective import all_lines, all_ok, barrier, cause, interruption, quiet, rank_world
from .discovery import damaged, is_legacy, legacy_error, list_checkpoints, newest_intact
from .integrity import CheckpointError, CorruptFile
from .leftovers import remove_leftovers, removed_on_failure
from .state import (
    TRAINER_STATE,
    NonFiniteWeights,
    RNGState,
    nonfinite_names,
    resolve,
    some_names,
    tensors_only,
)
from .storage import SafetensorsReader, SafetensorsWriter, read_manifests, read_member, verify
from .weights import SaveError


class Checkpointer:
    """Saves / finds / loads training checkpoints under ``root`` keeping the newest ``keep``;
    ``async_mode`` (``checkpoint.async_mode``): ``disabled``, or ``async`` / ``async_pinned``
    (:mod:`vitscale.checkpoint.async_save`: :meth:`save` returns once the state is staged, and
    :meth:`wait` once it is written)."""

    def __init__(self, root: str | os.PathLike, keep: int = 2, async_mode: str = "disabled", remote=None):
        self.root = Path(root)
        self.remote = remote  # a RemoteMirror (checkpoint.remote): each complete checkpoint is uploaded
        self.keep = max(int(keep), 1)
        self._verified: tuple[Path, dict] | None = None
        self.async_mode = async_mode
        self.pending: Pending | None = None
        self._buffers = StagingBuffers(keep=async_mode == "async_pinned") if async_mode != "disabled" else None
        self._group = None
        if self._buffers is not None:  # the background thread's save of one process says it is one: intended
            warnings.filterwarnings("ignore", message="torch.distributed is (disabled|unavailable)")
        if self._buffers is not None and rank_world()[1] > 1:  # every rank, in the same order: a group of its own
            import torch.distributed as dist

            self._group = dist.new_group(backend="gloo")

    def latest(self) -> Path | None:
        """The newest intact checkpoint (collective: every rank calls it, each checksums its share of
        the files); damaged newer ones are skipped with a warning. None when there is none at all."""
        remove_leftovers(self.root)  # a save killed outright (SIGKILL) left its .tmp-step_ folder
        found = list_checkpoints(self.root)
        if not found:
            return None
        self._verified = newest_intact(found, self.root, need=(TRAINER_STATE,), collective=True)
        return self._verified[0]

    def save(self, step: int, state: Mapping[str, Any], trainer_state: Any, rng: Any = None) -> Path | None:
        """``state``: ``{key: Stateful or nested dict of tensors}`` (non-tensor leaves are dropped);
        ``trainer_state``: a Stateful or dict of JSON (``trainer_state.json``); ``rng``: this rank's
        RNG states (``rng_rank<r>.json``; default :class:`RNGState`). Raises :class:`SaveError` (the
        partial folder removed, older checkpoints untouched). Waits for a save still being written
        first. Returns the step folder; asynchronous: None (the write goes on: :meth:`wait`)."""
        self.wait()
        rank, world = rank_world()
        state = {k: resolve(v) for k, v in state.items()}
        final = self.root / f"step_{step:08d}"
        tmp = self.root / f".tmp-step_{step:08d}"
        if self._buffers is None:  # asynchronous: checked on the staged copy, in the background
            bad = all_lines(nonfinite_names(state, limit=4))  # every rank checks its shards; all decide together
            if bad:
                raise NonFiniteWeights(
                    f"not saving checkpoint {final}: non-finite values in {some_names(bad)}; the older checkpoints in "
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
        with removed_on_failure(tmp if rank == 0 else None):  # SIGTERM / Ctrl-C mid-save: no partial folder left
            if all_ok(err is None):
                try:
                    extra = {f"rng_rank{rank}.json": json.dumps(resolve(rng or RNGState())).encode()}
                    if rank == 0:
                        ts = {**resolve(trainer_state), "world_size": world}
                        extra[TRAINER_STATE] = json.dumps(ts, indent=1, allow_nan=False).encode()
                    publish = lambda: _publish(tmp, final, self.root, self.remote)  # noqa: E731 - by the coordinator, index sealed
                    with quiet():
                        if self._buffers is None:
                            dcp.save(tensors_only(state), storage_writer=SafetensorsWriter(tmp, rank, extra, publish=publish))
                        else:
                            writer = StagingWriter(tmp, rank, extra, self._buffers, final, publish)
                            future = dcp.async_save(tensors_only(state), storage_writer=writer, process_group=self._group)
                            self.pending = Pending(step, tmp, final, future)
                            return None
                except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
                    err = e
                    if interruption(e) is not None:  # DCP wrapped a Ctrl-C / SIGTERM: go on up as that
                        raise interruption(e) from None
            self._failed(err, tmp, final)
        return self._done(final)

    def wait(self) -> Path | None:
        """Wait for the checkpoint being written in the background (if any): its step folder, or
        :class:`SaveError` / :class:`NonFiniteWeights` (its partial folder removed)."""
        p, self.pending = self.pending, None
        if p is None:
            return None
        err: BaseException | None = None
        try:
            p.future.result()
        except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            if interruption(e) is not None and not isinstance(e, CheckpointException):
                raise
            err = e
        bad = nonfinite_failure(err) if err is not None else None
        if not all_ok(err is None):
            if rank_world()[0] == 0:
                shutil.rmtree(p.tmp, ignore_errors=True)
            if bad is not None:
                raise NonFiniteWeights(f"{bad}; the older checkpoints in {self.root} are intact") from None
            self._failed(err, p.tmp, p.final)
        return self._done(p.final)

    def _failed(self, err: BaseException | None, tmp: Path, final: Path) -> None:
        """Raise :class:`SaveError` for every rank when any rank failed (their partial folder removed)."""
        if not all_ok(err is None):
            if rank_world()[0] == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise SaveError(f"could not save checkpoint {final}: {cause(err)}; its partial files were removed, the older checkpoints in {self.root} are intact")

    def _done(self, final: Path) -> Path:
        if rank_world()[0] == 0:
            self.prune()
        barrier()
        return final

    def prune(self) -> None:
        """Remove all but the newest ``keep`` checkpoints — but the one being uploaded
        (``checkpoint.remote``), whose files its upload still reads: a later prune removes it."""
        with self.remote.uploading() if self.remote is not None else contextlib.nullcontext() as busy:
            for _, old in [f for f in list_checkpoints(self.root) if not f[1].is_symlink()][: -self.keep]:
                if old != busy:
                    shutil.rmtree(old, ignore_errors=True)

    def load(self, path: str | os.PathLike, state: Mapping[str, Any], trainer_state: Any = None, rng: Any = None) -> dict:
        """Load the tensors of ``state`` (as for :meth:`save`) in place, resharded to this run's
        layout, then hand each ``Stateful`` its state; restore this rank's RNG (``rng``, default
        :class:`RNGState`) when the checkpoint has as many ranks; give ``trainer_state`` (a Stateful)
        its state. Returns trainer_state's JSON. Verifies the files first unless :meth:`latest` just did.
        A checkpoint written before the per-head projections were renamed (``attn.qkv`` for
        ``attn.qkv_per_head``, ...) loads too: its tensors are read under their former names
        (:func:`vitscale.param_names.with_former_names`)."""
        path = Path(path)
        parts = {k: resolve(v) for k, v in state.items()}
        rank, world = rank_world()
        if self._verified is not None and self._verified[0] == path:
            idx = self._verified[1]
        else:
            if is_legacy(path):
                raise legacy_error(path)
            idx, problems = verify(path, share=(rank, world), need=(TRAINER_STATE,))
            problems = all_lines(problems)
            if problems:
                raise damaged(problems)
        files = read_manifests(path, idx)
        # a checkpoint written before the per-head projections were renamed: read under their former names
        wanted = with_former_names(tensors_only(parts), idx["tensors"])
        try:
            with quiet():
                dcp.load(wanted, storage_reader=SafetensorsReader(path, idx))
        except (Exception, CheckpointException) as e:
            if interruption(e) is not None:  # DCP wrapped a Ctrl-C / SIGTERM: go on up as that
                raise interruption(e) from None
            raise CheckpointError(f"cannot load checkpoint {path}: {cause(e)}") from None
        try:
            ts = json.loads(read_member(path, TRAINER_STATE, files[TRAINER_STATE]))
            if not isinstance(ts, dict) or not isinstance(ts.get("step"), int):
                raise CorruptFile(path / TRAINER_STATE, "no step number")
            for key, part in state.items():
                if not isinstance(part, dict):
                    part.load_state_dict(parts[key])
            if trainer_state is not None:
                trainer_state.load_state_dict(ts)
            rng_file = f"rng_rank{rank}.json"
            if rng_file in files and ts.get("world_size", 1) == world:
                (rng or RNGState()).load_state_dict(json.loads(read_member(path, rng_file, files[rng_file])))
        except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
            raise CheckpointError(f"cannot load checkpoint {path}: {cause(e)}") from None
        return ts


def _publish(tmp: Path, final: Path, root: Path, remote=None) -> None:
    """The atomic step: the folder, complete and sealed, takes its step name (a link of that name,
    not the run's own, goes; its target stays: docs/trust.md); then its upload (``checkpoint.remote``)."""
    if final.is_symlink():
        final.unlink()
    elif final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)  # a checkpoint exists only once complete
    _fsync_dir(root)
    if remote is not None:
        remote.upload(final)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


__all__ = ["Checkpointer", "SaveError"]
