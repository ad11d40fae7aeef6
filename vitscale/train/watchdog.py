"""The hang watchdog (``train.hang_timeout``): a rank that stops making progress — a collective whose
peer hangs, a dead data worker, a stuck file system — is found out and the job ends, instead of
waiting out the process group's timeout with nothing to say where it was.

A daemon thread waits for the loop's progress; when no step has completed for ``hang_timeout``
seconds, it writes the stacks of every thread of this process (``faulthandler.dump_traceback``: it
reads the frames without running Python code in them, so it works whatever the main thread is stuck
in) to ``<output_dir>/hang-rank<r>.txt``, prints one line naming the file and ends the process with
exit code 124 (as GNU ``timeout``). Every rank runs its own watchdog, so every rank that is stuck
writes its file: a hung collective stops all of them. PyTorch releases the GIL inside collectives and
loader waits, which lets the thread run; ``faulthandler.dump_traceback_later`` is armed as well, a
minute later, in case something holds the GIL (it writes the same file and exits with code 1).

Progress is noted with one clock read per step (:meth:`Watchdog.beat`); the thread wakes once a second.
It is armed from the start of ``vitscale train`` (:func:`vitscale.train.trainer.train`), so start-up —
reading the data's first files, indexing shards, building the model — is bounded by the same timeout.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from pathlib import Path

from ..safe_write import FolderLink, open_new

EXIT_HANG = 124


class Watchdog:
    """``timeout`` seconds without :meth:`beat` -> stacks to ``folder/hang-rank<rank>.txt``, exit 124.
    ``timeout`` 0: off. Use as a context manager around the training loop."""

    def __init__(self, timeout: float, folder: Path, rank: int, what: str = "train.hang_timeout"):
        self.timeout, self.path, self.rank, self.what = float(timeout), Path(folder) / f"hang-rank{rank}.txt", rank, what
        self.last = time.monotonic()
        self.step = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file = None
        self._depth = 0  # entered once for the whole run (start-up included), again around the loop

    @classmethod
    def build(cls, tc, *, rank: int) -> Watchdog:
        """The training run's watchdog from its ``train`` group ``tc``: ``hang_timeout``, its stacks in
        ``output_dir``, for ``rank``. Built from the config: it watches the start-up too, before the run is built."""
        return cls(tc.hang_timeout, Path(tc.output_dir), rank)

    def beat(self, step: int = 0) -> None:
        """The loop made progress (a step completed)."""
        self.last, self.step = time.monotonic(), step

    def __enter__(self) -> Watchdog:
        self._depth += 1
        self.last = time.monotonic()  # entering again (the loop after start-up) is progress
        if self.timeout > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="vitscale-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        self._stop.set()
        if self._file is not None:
            faulthandler.cancel_dump_traceback_later()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout / 4)):
            idle = time.monotonic() - self.last
            if idle < self.timeout:
                continue
            self._dump(idle)

    def _dump(self, idle: float) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            f = open_new(self.path)  # kept open for faulthandler until the process ends; never through a link
            f.write(f"rank {self.rank} (pid {os.getpid()}): no step completed for {idle:.0f} s ({self.what}="
                    f"{self.timeout:g}); {f'last completed step {self.step}' if self.step else 'no step completed in this process'}. "
                    "Stacks of every thread:\n\n")  # fmt: skip
            f.flush()
            self._file = f
            faulthandler.dump_traceback_later(60, exit=True, file=f)  # the backstop, should the next lines not run
            faulthandler.dump_traceback(file=f, all_threads=True)
            f.flush()
        except (OSError, FolderLink) as e:
            print(f"vitscale: watchdog could not write {self.path}: {e}", file=sys.stderr, flush=True)
        print(f"vitscale train: rank {self.rank}: no step completed for {idle:.0f} s ({self.what}={self.timeout:g}); "
              f"the stacks of its threads are in {self.path}", file=sys.stderr, flush=True)  # fmt: skip
        os._exit(EXIT_HANG)


__all__ = ["EXIT_HANG", "Watchdog"]
