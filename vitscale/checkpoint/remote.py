"""Checkpoints off the node (``checkpoint.remote``): the run folder's checkpoints and logs mirrored to
an fsspec URL (``s3://bucket/runs/x``, ``gs://…``, any fsspec file system) — open_clip's
``--remote-sync`` meaning, not a checkpoint written to the object store directly.

Why a mirror: every guarantee of the format (docs/trust.md) rests on a local folder — files opened
with ``O_NOFOLLOW``, sizes checked with ``lstat``, a step folder that appears only by an atomic rename
once its index is sealed. An object store has no atomic rename of a folder and no links to refuse, so
writing there directly would need a second format. Mirrored, a save costs the step loop what a local
save costs (the upload runs in a background thread), and what comes back is checked exactly like a
local checkpoint: downloaded into ``.tmp-step_…``, renamed, then verified (checksums, geometry, finite
values) by the resume as any other.

Upload, after each checkpoint is complete (rank 0, the coordinator that renamed it): the step folder's
files, its index ``checkpoint.json`` last — a copy cut short has no index and is never restored —,
then the run's ``config.yaml``, ``metrics.jsonl``, ``summary.json``, ``train.log`` and
``trackers.json``; remote checkpoints beyond ``checkpoint.keep`` are deleted. The step loop never
waits for the location: a checkpoint saved while an upload is under way waits its turn (the newest
``checkpoint.keep`` of them: older ones are pruned locally anyway), and an upload under way for longer
than ``checkpoint.remote_wait_s`` (a location that stopped answering) is one warning line; a failed
upload is one warning line and the run goes on (the next save uploads again). The end of a run waits at
most ``checkpoint.remote_wait_s`` for the upload under way, in short slices so that a signal is handled
at once, then says what was not mirrored and ends (the local checkpoints are complete either way). Restore, when the run folder holds no checkpoint (a requeued job on a node with an empty disk):
the remote checkpoints that have an index, and the run files the folder lacks, before the resume's
same-run check reads ``config.yaml``. Up front, a small file is written and removed there: a location
that cannot be written stops the run in one line before it trains.

One run per location: the run folder's ``run-id.json`` (a random id, made when a run first mirrors) is
mirrored first. A location holding another run's id — or, mirrored before ids were kept, another run's
``config.yaml`` — is refused at start-up in one line (:class:`RemoteTaken`), and an upload that finds
another run's id there (two runs started at once) writes nothing and says so; another run's files are
never overwritten or pruned. A requeued run on an empty disk restores the id with its checkpoints and
goes on as the same run.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ..errors import UserError
from ..safe_write import write_atomic
from .discovery import list_checkpoints
from .leftovers import TMP_PREFIX
from .storage import INDEX

log = logging.getLogger("vitscale.checkpoint")

RUN_ID = "run-id.json"
"""The run's identity (``{"run_id": "<32 hex digits>"}``), in its folder and at the location."""
RUN_FILES = (RUN_ID, "config.yaml", "metrics.jsonl", "summary.json", "train.log", "trackers.json")
"""The run folder's files mirrored beside the checkpoints (and restored when the folder lacks them)."""


class RemoteError(UserError):
    """The remote location cannot be used (a missing fsspec implementation, credentials, a bucket):
    one line, exit code 1."""


class RemoteTaken(RemoteError):
    """The remote location holds another run's files."""


def _parse_id(data: bytes | None) -> str | None:
    """The id of a ``run-id.json``'s bytes; None when absent, "" when not an id (a damaged file)."""
    if data is None:
        return None
    try:
        rid = json.loads(data.decode("utf-8")).get("run_id")
    except (ValueError, UnicodeDecodeError, AttributeError):
        return ""
    return rid if isinstance(rid, str) and len(rid) == 32 and all(c in "0123456789abcdef" for c in rid) else ""


def local_run_id(run_dir: Path) -> str | None:
    p = Path(run_dir) / RUN_ID
    if not p.is_file() or p.is_symlink():
        return None
    with open(p, "rb") as f:
        return _parse_id(f.read(4096)) or None


def _plain(name: str) -> bool:
    return bool(name) and name == Path(name).name and not name.startswith(".") and name not in ("..",)


class RemoteMirror:
    """The mirror of run folder ``run_dir`` at ``url``, keeping the newest ``keep`` checkpoints there."""

    def __init__(self, url: str, run_dir: str | os.PathLike, keep: int = 2, wait_s: float = 600.0):
        import fsspec

        self.url, self.run_dir, self.keep = url.rstrip("/"), Path(run_dir), max(int(keep), 1)
        self.wait_s = float(wait_s)  # the end of the run waits at most this long for an upload under way
        self._lock = threading.Lock()
        self._queue: collections.deque[Path] = collections.deque()  # checkpoints saved while an upload was under way
        self._current: Path | None = None  # the checkpoint being uploaded (None: no upload under way)
        self._since = 0.0  # when the upload under way started (time.monotonic)
        self._warned = False  # this stall was said (one warning line per stalled upload)
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url)
        except (ImportError, ValueError) as e:
            raise RemoteError(f"checkpoint.remote={url}: {str(e).strip().splitlines()[0] if str(e).strip() else e!r}") from None
        self.root = self.root.rstrip("/")
        self._thread: threading.Thread | None = None
        self.failed: str | None = None

    # ---------------------------------------------------------------------------------- upload
    def upload(self, step_dir: Path) -> None:
        """Mirror the complete checkpoint ``step_dir`` and the run files, in the background, after the
        checkpoints already waiting; never waits for the location."""
        with self._lock:
            self._queue.append(Path(step_dir))
            while len(self._queue) > self.keep:  # older ones are pruned locally (checkpoint.keep) before their turn
                self._queue.popleft()
            if self._current is not None:  # an upload under way: its thread takes the queue in order
                took = time.monotonic() - self._since
                if took >= self.wait_s and not self._warned:  # stalled: one line per stall
                    self._warned = True
                    log.warning("checkpoint.remote: the upload of %s to %s has not finished after %.0f s "
                                "(checkpoint.remote_wait_s); training goes on and %s wait their turn",
                                self._current.name, self.url, took, ", ".join(q.name for q in self._queue))  # fmt: skip
                return
            self._next()
            self._thread = threading.Thread(target=self._run, name="vitscale-remote", daemon=True)
            self._thread.start()

    @contextlib.contextmanager
    def uploading(self) -> Iterator[Path | None]:
        """The checkpoint being uploaded (None: none), held so while the ``with`` body runs: the local
        prune (``checkpoint.keep``) leaves it for a later save, its files still being read."""
        with self._lock:
            yield self._current

    def _next(self) -> None:
        """Under the lock: the next checkpoint of the queue becomes the current upload (None: none left)."""
        self._current = self._queue.popleft() if self._queue else None
        self._since = time.monotonic()

    def _run(self) -> None:
        """The background thread: the queued checkpoints in order, until none is left (``_current``
        None again, under the lock: no save is ever lost)."""
        while True:
            self._upload(self._current)
            with self._lock:
                self._warned = False  # an upload ended: a later stall is said again
                self._next()
                if self._current is None:
                    return

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the uploads under way, at most ``timeout`` seconds (None: ``checkpoint.remote_wait_s``),
        in short slices so that a signal's handler runs at once; True when none is left."""
        deadline = time.monotonic() + (self.wait_s if timeout is None else timeout)
        while (t := self._thread) is not None and t.is_alive():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            t.join(min(left, 0.5))
        return True

    def sync_run_files(self) -> None:
        """The run files once more (the end of the run: its summary, its last log lines), after the
        uploads under way — or, when they have not ended in ``checkpoint.remote_wait_s``, not at all."""
        if not self.wait():
            with self._lock:
                current, queued = self._current, [q.name for q in self._queue]
            waiting = f" ({', '.join(queued)} not mirrored either)" if queued else ""
            log.warning("checkpoint.remote: the upload of %s to %s did not finish in %.0f s (checkpoint.remote_wait_s)%s: "
                        "the run ends without it; its local checkpoints are complete",
                        current.name if current is not None else "a checkpoint", self.url, self.wait_s, waiting)  # fmt: skip
            return
        try:
            self._put_run_files()
        except Exception as e:  # the run's own files are complete locally
            log.warning("checkpoint.remote: could not mirror the run files to %s: %s", self.url, _why(e))

    def _remote_id(self) -> str | None:
        """The id of the run whose files the location holds (None: no id there)."""
        try:
            return _parse_id(self.fs.cat_file(f"{self.root}/{RUN_ID}", start=0, end=4096))
        except FileNotFoundError:
            return None

    def _own_id(self) -> str:
        """This run's id (made and kept in its folder the first time)."""
        rid = local_run_id(self.run_dir)
        if rid is None:
            rid = secrets.token_hex(16)
            write_atomic(self.run_dir / RUN_ID, json.dumps({"run_id": rid}) + "\n")
        return rid

    def _taken(self, own: str, theirs: str | None) -> str | None:
        """Why the location is another run's (None: it is this run's, or no run's)."""
        if theirs is not None:
            return None if theirs == own else f"holds the files of another run ({RUN_ID}: {theirs or 'not an id'}; this run: {own})"
        try:  # mirrored before run ids were kept: its config.yaml says whose it is
            there = self.fs.cat_file(f"{self.root}/config.yaml")
        except FileNotFoundError:
            return None
        mine = self.run_dir / "config.yaml"
        if not mine.is_file() or mine.is_symlink():
            return None  # a folder without its config yet (a requeue): restored, then the same-run check decides
        return None if mine.read_bytes() == there else "holds the files of another run (its config.yaml is not this run's)"

    def _check(self, theirs: str | None) -> None:
        """:class:`RemoteTaken` when the location is another run's (``theirs``: the id there)."""
        why = self._taken(self._own_id(), theirs)
        if why:
            raise RemoteTaken(f"checkpoint.remote={self.url} {why}: nothing was written there; set a checkpoint.remote "
                              f"of this run's own, or remove the other run's files there")  # fmt: skip

    def _claim(self) -> None:
        """Before writing there: the location is this run's (its id written there when none is), or
        :class:`RemoteTaken`."""
        theirs = self._remote_id()
        self._check(theirs)
        if theirs is None:
            self.fs.put_file(str(self.run_dir / RUN_ID), f"{self.root}/{RUN_ID}")

    def _upload(self, step_dir: Path) -> None:
        dest = f"{self.root}/checkpoints/{step_dir.name}"
        try:
            self._claim()
            if not step_dir.is_dir():  # pruned (checkpoint.keep) while it waited its turn: a newer one is queued
                log.warning("checkpoint.remote: %s was removed (checkpoint.keep) before its turn to be mirrored",
                            step_dir.name)  # fmt: skip
                return
            names = sorted(p.name for p in step_dir.iterdir() if p.is_file() and not p.is_symlink())
            for name in [n for n in names if n != INDEX] + [INDEX]:  # the index last: a copy cut short is never restored
                self.fs.put_file(str(step_dir / name), f"{dest}/{name}")
            self._put_run_files()
            steps = sorted(self._remote_steps())
            for _, old in steps[: -self.keep]:
                self.fs.rm(f"{self.root}/checkpoints/{old}", recursive=True)
            self.failed = None
        except RemoteTaken as e:  # two runs started at once: the second to upload writes nothing
            self.failed = str(e)
            log.warning("checkpoint.remote: %s not mirrored: %s", step_dir.name, e)
        except Exception as e:  # the run goes on; the next save uploads again
            self.failed = _why(e)
            log.warning("checkpoint.remote: could not mirror %s to %s: %s (the local checkpoint is intact; the next "
                        "save tries again)", step_dir.name, self.url, self.failed)  # fmt: skip

    def _put_run_files(self) -> None:
        self._claim()
        for name in RUN_FILES:
            p = self.run_dir / name
            if p.is_file() and not p.is_symlink():
                self.fs.put_file(str(p), f"{self.root}/{name}")

    def _remote_steps(self) -> list[tuple[int, str]]:
        try:
            entries = self.fs.ls(f"{self.root}/checkpoints", detail=False)
        except FileNotFoundError:
            return []
        out = []
        for e in entries:
            name = str(e).rstrip("/").rsplit("/", 1)[-1]
            if name.startswith("step_") and name[5:].isdigit():
                out.append((int(name[5:]), name))
        return out

    # ---------------------------------------------------------------------------------- restore
    def restore(self) -> list[str]:
        """Check that the location takes writes (a missing bucket or credentials: :class:`RemoteError`,
        before anything trains); when the run folder holds no checkpoint, bring back the remote
        checkpoints that have an index (each into ``.tmp-step_…``, then renamed) and the run files it
        lacks. Returns the steps restored."""
        try:
            return self._restore()
        except RemoteError:
            raise
        except Exception as e:  # credentials, a missing bucket, the network: one line, nothing trained
            raise RemoteError(f"checkpoint.remote={self.url} cannot be read or written: {_why(e)}") from None

    def _restore(self) -> list[str]:
        probe = f"{self.root}/.vitscale-write-check"  # up front: the location exists and takes writes
        self.fs.pipe_file(probe, b"")
        self.fs.rm(probe)
        local = self.run_dir / "checkpoints"
        theirs = self._remote_id()
        if list_checkpoints(local) or local_run_id(self.run_dir) is not None or theirs is None:
            self._check(theirs)  # a run of its own here (or no id there): the location must not be another's
        if list_checkpoints(local):
            return []
        try:
            self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []  # nothing mirrored yet: a new run
        restored = []
        for _, name in sorted(self._remote_steps()):
            src = f"{self.root}/checkpoints/{name}"
            files = [str(f).rstrip("/").rsplit("/", 1)[-1] for f in self.fs.ls(src, detail=False)]
            if INDEX not in files:
                continue  # its upload was cut short
            bad = [f for f in files if not _plain(f)]
            if bad:
                raise RemoteError(f"checkpoint.remote={self.url}: {name} holds {bad[0][:80]!r}, not a plain file name")
            tmp = local / f"{TMP_PREFIX}{name[5:]}"
            if tmp.is_symlink():  # a leftover name is never followed: a new folder of this run's
                tmp.unlink()
            elif tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            for f in files:
                self.fs.get_file(f"{src}/{f}", str(tmp / f))
            os.replace(tmp, local / name)
            restored.append(name)
        for name in RUN_FILES:
            if not os.path.lexists(self.run_dir / name) and self.fs.exists(f"{self.root}/{name}"):
                write_atomic(self.run_dir / name, self.fs.cat_file(f"{self.root}/{name}"))  # never through a link
        return restored


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


__all__ = ["RUN_FILES", "RUN_ID", "RemoteError", "RemoteMirror", "RemoteTaken", "local_run_id"]
