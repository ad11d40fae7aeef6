"""A run folder belongs to one run: a lock while it trains, and a resume only with the same config.

**The lock** (``<train.output_dir>/run.lock``, held by rank 0): a JSON record of the holder (host,
PID, the process's start time, the command) in a file the holder also keeps ``flock``-ed. A second
run on a live folder refuses, naming the holder. A lock left behind by a process that is gone (a
SIGKILL, a crashed node) is taken over with a message when it names this host (the PID is not
running, or now belongs to a process started at another time); another host's lock cannot be checked
from here, so the message says how to remove it. The lock is released (the file removed) when the
run ends, also on an error or Ctrl-C.

**Resume means the same run**: before resuming from a checkpoint, the config is compared with the
folder's ``config.yaml``. A change to anything that alters what is computed (model, data, optimizer,
schedule, batch, seed, steps, ...) refuses with the changed keys and the two ways out: another
``train.output_dir``, or ``checkpoint.allow_changes=KEY,...`` (``all`` accepts any change) to
continue this run with them. The keys of :data:`NEUTRAL` (logging, evaluation, checkpoint cadence,
workers, layout, kernels, output paths) and the task groups another job reads (``resume_neutral``)
may change freely.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import fcntl
import json
import logging
import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EXIT_USAGE, ConfigError, UserError
from ..safe_write import FolderLink, open_append

LOCK_NAME = "run.lock"
CONFIG_NAME = "config.yaml"
RUN_ENTRIES = (CONFIG_NAME, "metrics.jsonl", "train.log", "summary.json", "report.html", "model.safetensors",
               "model_ema.safetensors", LOCK_NAME, "checkpoints", "tb", "trackers.json",
               "run-id.json",  # the run's identity in checkpoint.remote (vitscale.checkpoint.remote)
               "export",  # vitscale export's default output folder
               "classnames.txt")  # the run's classes (vitscale.data.classes.write_run_class_names)  # fmt: skip
"""What a run reads, writes, appends to or resumes from in its folder: none may be a symbolic link
(docs/trust.md, "Symbolic links"; the step folders in ``checkpoints/`` are skipped as damaged). Every
file a run writes is also opened with ``O_NOFOLLOW`` (``vitscale.safe_write``), its temporary names
and ``hang-rank<r>.txt`` included."""
log = logging.getLogger("vitscale.run")

# Settings that do not change what a run computes (beyond floating-point rounding for the kernel
# and layout switches): a resume accepts any change to them. A key or a whole group (``eval``).
NEUTRAL = (
    "train.output_dir", "train.log_every", "train.compile", "train.compile_mode", "train.sdpa", "train.cpu_threads",
    "precision.fp8_all_gather",
    "train.max_nonfinite_steps", "train.max_consecutive_nonfinite", "train.hang_timeout",
    "data.num_workers", "data.pin_memory", "data.persistent_workers", "data.prefetch_factor",
    "data.prefetch_across_epochs", "data.max_image_pixels",
    "checkpoint.every", "checkpoint.keep", "checkpoint.path", "checkpoint.init_from", "checkpoint.init_parts", "checkpoint.resume",
    "checkpoint.allow_changes", "checkpoint.export_safetensors", "checkpoint.async_mode", "checkpoint.save_on_signal",
    "checkpoint.signal_deadline",
    "checkpoint.remote",
    "eval", "evals", "log", "parallel",
)  # fmt: skip


def check_links(folder: Path) -> None:
    """:class:`FolderLink` naming the first of :data:`RUN_ENTRIES` in ``folder`` that is a symbolic
    link. The folder itself may be one (where runs live is the user's choice); what is inside it is
    the run's own, so a link there — to another run's log, or a file outside — is never followed."""
    for name in RUN_ENTRIES:
        p = folder / name
        if p.is_symlink():
            raise FolderLink.at(p)


class FolderInUse(UserError):
    """Another run holds the run folder."""


class ConfigChanged(UserError):
    """Resuming with a config that changes the run."""

    exit_code = EXIT_USAGE


# ------------------------------------------------------------------------------------- the lock
def _process_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux ``/proc``), None elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime (after the command name)
    except (OSError, ValueError, IndexError):
        return None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _alive(holder: dict) -> bool:
    """Whether the process a lock record names (on this host) is still the one that wrote it."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if holder.get("boot_id") and _boot_id() and holder["boot_id"] != _boot_id():
        return False  # the machine restarted since
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    start = _process_start(pid)
    return not (start is not None and holder.get("pid_start") is not None and start != holder["pid_start"])


def _describe(holder: dict) -> str:
    return f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started {holder.get('started', '?')}"


def _record() -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": _process_start(os.getpid()),
        "boot_id": _boot_id(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv)[:300],
    }


def _holder_record(fd: int, wait_s: float = 2.0) -> dict:
    """The record of the process holding the lock: it writes it just after taking the lock, so a
    record not there yet is waited for (up to ``wait_s``) rather than reported as "host ?, pid ?"."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        rec = _read_record(fd)
        if rec or time.monotonic() >= deadline:
            return rec or {"host": "?", "pid": "?", "started": "just now: its record is not written yet"}
        time.sleep(0.05)


def _read_record(fd: int) -> dict | None:
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    if not data.strip():
        return None
    try:
        rec = json.loads(data)
    except ValueError:
        return {}
    return rec if isinstance(rec, dict) else {}


_HELD: dict[Path, RunLock] = {}


class RunLock:
    """The lock of a run folder. :meth:`acquire` (re-entrant within a process), :meth:`release`."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(os.path.abspath(folder))
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None
        self._depth = 0

    @classmethod
    def of(cls, folder: str | os.PathLike) -> RunLock:
        key = Path(os.path.abspath(folder))
        return _HELD.get(key) or cls(key)

    def acquire(self) -> RunLock:
        if self._fd is not None:
            self._depth += 1
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(20):  # another process removed or replaced the file between open and lock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                if not self._flock(fd):
                    raise FolderInUse(self._in_use(_holder_record(fd)))
                try:
                    same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
                except FileNotFoundError:
                    same = False
                if not same:
                    os.close(fd)
                    continue
                self._take(fd, _read_record(fd))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.close(fd)
                raise
            self._fd, self._depth = fd, 1
            _HELD[self.folder] = self
            return self
        raise FolderInUse(f"{self.path} keeps changing: is another run starting in {self.folder}?")

    @staticmethod
    def _flock(fd: int) -> bool:
        """True: locked; False: another process holds it; the file system without flock: True (the
        record alone decides)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError:  # ENOLCK / EOPNOTSUPP: no flock here
            return True
        return True

    def _in_use(self, holder: dict) -> str:
        return (
            f"{self.folder} is in use by another run ({_describe(holder)}): wait for it to end, or set another "
            f"train.output_dir"
        )

    def _take(self, fd: int, holder: dict | None) -> None:
        """Write our record, after deciding about a record a previous holder left."""
        if holder is not None and holder.get("pid") != os.getpid():
            if holder.get("host") and holder["host"] != socket.gethostname():
                raise FolderInUse(
                    f"{self.folder} is locked by a run on another machine ({_describe(holder)}); if that run is "
                    f"no longer running, delete {self.path} and start again"
                )
            if holder and _alive(holder):  # only where flock is unavailable
                raise FolderInUse(self._in_use(holder))
            what = f"pid {holder.get('pid')} (started {holder.get('started', '?')})" if holder else "an unreadable lock record"
            log.warning("%s: taking over the lock of %s, which is no longer running", self.folder, what)
        data = json.dumps(_record(), indent=1).encode()
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, data)
        with contextlib.suppress(OSError):
            os.fsync(fd)

    def release(self) -> None:
        if self._fd is None:
            return
        self._depth -= 1
        if self._depth > 0:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # still holding the flock: nobody can have taken it meanwhile
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = None
        _HELD.pop(self.folder, None)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _release_all() -> None:
    for lock in list(_HELD.values()):
        lock._depth = 1
        lock.release()


atexit.register(_release_all)  # a process that ends without releasing still removes its record


# ------------------------------------------------------------------------------------- same run?
def neutral_keys() -> tuple[str, ...]:
    """:data:`NEUTRAL`, and the tasks' config groups that declare themselves so (``resume_neutral``: a
    group only another job reads, such as label-tokens')."""
    import dataclasses

    from ..config.schema import config_classes

    groups = {f.name for cls in config_classes() for f in dataclasses.fields(cls)
              if getattr(f.default_factory, "resume_neutral", False)}  # fmt: skip
    return NEUTRAL + tuple(sorted(groups))


def _neutral(key: str, neutral: tuple[str, ...]) -> bool:
    return any(key == n or key.startswith(n + ".") for n in neutral)


def _norm(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_norm(x) for x in v]
    if isinstance(v, list):
        return [_norm(x) for x in v]
    if isinstance(v, int) and not isinstance(v, bool):
        return float(v)  # 3 and 3.0 are the same setting
    return v


def config_changes(stored: dict, new: dict, defaults: dict) -> list[tuple[str, Any, Any]]:
    """``(key, stored value, new value)`` for every key that changes the run (:func:`neutral_keys`
    left out). A key the stored config lacks (a newer vitscale) counts as its default; a key only
    the stored config has (an older one) is ignored."""
    from ..config import flatten

    old_f, new_f, def_f = flatten(stored), flatten(new), flatten(defaults)
    other_format = old_f.get("data.format", def_f.get("data.format")) != new_f.get("data.format")
    missing = object()
    changes = []
    neutral = neutral_keys()
    for key in sorted(set(old_f) | set(new_f)):
        if _neutral(key, neutral):
            continue
        a = old_f.get(key, missing)
        b = new_f.get(key, missing)
        if a is missing:
            a = def_f.get(key, missing)
        if b is missing:
            if key.startswith("model.overrides.") or (key.startswith("data.") and other_format):
                b = None  # an override the new config leaves out; a field of the stored data format, not the new one's
            else:
                continue  # a key this vitscale does not know
        if a is missing:
            a = None
        if _norm(a) != _norm(b):
            changes.append((key, a, b))
    return changes


def _short(key: str) -> str:
    """``model.overrides.X`` as users write it: ``model.X``."""
    return "model." + key[len("model.overrides."):] if key.startswith("model.overrides.") else key


def _accepted(key: str, allowed: tuple[str, ...]) -> bool:
    return "all" in allowed or any(k == a or k.startswith(a + ".") for a in allowed for k in (key, _short(key)))


def _show(v: Any) -> str:
    return "(unset)" if v is None else json.dumps(v) if isinstance(v, (str, list, dict)) else str(v)


@dataclass
class Claim:
    """What :func:`claim` found in the run folder."""

    lock: RunLock | None
    """The folder's lock (rank 0), None on the other ranks."""
    accepted: list[tuple[str, Any, Any]] = field(default_factory=list)
    """Changes ``checkpoint.allow_changes`` accepted for this resume."""
    created: list[Path] = field(default_factory=list)
    """The folders this claim made (``train.output_dir`` and the parents it lacked, deepest first): a
    run refused before it starts (:meth:`write_config` never called) removes them again."""
    started: bool = False
    """The run's ``config.yaml`` was written: from here on the folder is the run's record."""

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
        if not self.started and self.created:  # refused before it started: nothing left behind
            self._remove_created()

    def _remove_created(self) -> None:
        """Remove what a run refused before its start wrote in folders it made: the files it writes
        before ``config.yaml`` (the run's ``classnames.txt``), then each folder if empty — nothing else (a
        folder that holds anything more is left as it is)."""
        from ..data.classes import CLASSNAMES_FILE

        folder = self.created[0]
        for name in (CLASSNAMES_FILE,):
            path = folder / name
            with contextlib.suppress(OSError):
                if path.is_file() and not path.is_symlink():
                    path.unlink()
        for f in self.created:
            with contextlib.suppress(OSError):
                f.rmdir()  # only when empty
        self.created = []

    def write_config(self, cfg: Any, resumed_step: int | None) -> None:
        """The run's ``config.yaml`` in ``train.output_dir`` (written by the main rank); on a resume
        from the checkpoint of ``resumed_step`` (None: none) with accepted changes, the config the
        checkpoints so far were trained with is kept beside it (:func:`write_config`)."""
        self.started = True
        keep = resumed_step if resumed_step is not None and self.accepted else None
        write_config(cfg, Path(cfg.train.output_dir), before_step=keep)


def check_same_run(cfg: Any, folder: Path) -> list[tuple[str, Any, Any]]:
    """The accepted changes of a resume in ``folder``; :class:`ConfigChanged` for refused ones. Only
    when the folder has a checkpoint to resume and a ``config.yaml`` describing it."""
    from ..checkpoint import list_checkpoints
    from ..config import config_to_dict
    from ..safe_yaml import read_yaml

    found = list_checkpoints(folder / "checkpoints")
    stored_path = folder / CONFIG_NAME
    if found and not cfg.checkpoint.resume:  # its steps would mix with this run's (and `keep` would prune the new)
        raise ConfigChanged(
            f"{folder / 'checkpoints'} holds checkpoints of an earlier run (newest {found[-1][1].name}) and "
            f"checkpoint.resume=false starts a new one: delete that folder to start over there, or set another "
            f"train.output_dir"
        )
    if not found or not stored_path.is_file():
        return []
    try:
        stored = read_yaml(stored_path)
    except OSError as e:
        raise ConfigChanged(f"{stored_path} cannot be read ({type(e).__name__}), so this resume cannot be checked: restore it, or set another train.output_dir") from None
    except ConfigError as e:  # a YAML bomb, a tag, a nest too deep: refused within the limits of vitscale.safe_yaml
        raise ConfigChanged(f"{e}, so this resume cannot be checked: restore it, or set another train.output_dir") from None
    if not isinstance(stored, dict):
        raise ConfigChanged(f"{stored_path} is not a config, so this resume cannot be checked: restore it, or set another train.output_dir")
    defaults = type(cfg)()  # the defaults of its classes: its task's, and its data format's
    defaults.data = type(cfg.data)()
    changes = config_changes(stored, config_to_dict(cfg), config_to_dict(defaults))
    allowed = tuple(cfg.checkpoint.allow_changes)
    refused = [c for c in changes if not _accepted(c[0], allowed)]
    if refused:
        lines = "\n".join(f"  {_short(k)}: {_show(a)} -> {_show(b)}" for k, a, b in refused)
        keys = ",".join(_short(k) for k, _, _ in refused)
        raise ConfigChanged(
            f"{folder} holds a run with another config (its {CONFIG_NAME}; newest checkpoint {found[-1][1].name}), "
            f"which this run would resume; changed:\n{lines}\nStart a new run with another train.output_dir, or "
            f"continue this one with the changes: checkpoint.allow_changes={keys}"
        )
    return changes


def write_config(cfg: Any, folder: Path, before_step: int | None = None) -> None:
    """The run's ``config.yaml``; ``before_step``: a resume with accepted changes, whose previous
    config (the one the checkpoints so far were trained with) is kept as ``config.before_step_N.yaml``."""
    from ..config import save_config

    path = folder / CONFIG_NAME
    if before_step is not None and path.is_file():
        path.replace(folder / f"config.before_step_{before_step:08d}.yaml")
    save_config(cfg, path)


def claim(cfg: Any, is_main: bool, share=None, before=None, restore=None) -> Claim:
    """On the main rank: ``before(cfg)`` (the folder's own checks), lock ``train.output_dir``,
    ``restore(cfg)`` (bring back a folder's files from elsewhere: ``checkpoint.remote``) and check that
    a resume continues the same run. ``share``: sends the main rank's outcome (None, or an error's exit
    code and message) to every rank, so that all ranks stop together."""
    folder = Path(cfg.train.output_dir)
    error: UserError | None = None
    lock = None
    accepted: list = []
    created: list[Path] = []
    if is_main:
        created = _missing_folders(folder)  # before the folder's own checks, which may make it
        try:
            if before is not None:
                before(cfg)
            check_links(folder)
            lock = RunLock.of(folder).acquire()
            if restore is not None:
                restore(cfg)
            accepted = check_same_run(cfg, folder)
        except UserError as e:
            if lock is not None:
                lock.release()
            Claim(lock=None, created=created).release()  # folders it made for nothing: removed
            error = e
    if share is not None:
        outcome = share(None if error is None else (error.exit_code, str(error)))
        if error is None and outcome is not None:  # the main rank refused: the same error here
            error = UserError(outcome[1])
            error.exit_code = outcome[0]
    if error is not None:
        raise error
    return Claim(lock=lock, accepted=accepted, created=created)


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its parents that do not exist yet, deepest first."""
    out, f = [], Path(os.path.abspath(folder))
    while not f.exists() and f != f.parent:
        out.append(f)
        f = f.parent
    return out


__all__ = [
    "CONFIG_NAME", "Claim", "ConfigChanged", "FolderInUse", "FolderLink", "LOCK_NAME", "NEUTRAL", "neutral_keys", "RUN_ENTRIES", "RunLock", "check_links",
    "claim", "config_changes", "open_append", "write_config",
]  # fmt: skip
