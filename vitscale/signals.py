"""SIGTERM ends a command the way Ctrl-C does: as an exception, so that everything on the way out
runs — a checkpoint being written removes its partial folder, the run folder's lock is released, logs
are closed — and the command exits with 143 (128 + SIGTERM, what a shell reports for a process that
the signal killed) and one line, ``vitscale train: terminated (SIGTERM)``.

Python's default for SIGTERM is to die at once, running nothing: a scheduler stopping a job (Slurm
sends SIGTERM first) left ``run.lock`` and a partial ``.tmp-step_…`` folder behind. The handler is
installed for the duration of a command by :func:`vitscale.cli.main`; a process forked from it
(a DataLoader worker) keeps the default behaviour. Saving on the signal is not done here.
"""

from __future__ import annotations

import contextlib
import os
import signal

EXIT_TERMINATED = 128 + signal.SIGTERM


class Terminated(BaseException):
    """The process received SIGTERM (a BaseException, like KeyboardInterrupt: no ``except Exception``
    swallows it)."""


@contextlib.contextmanager
def sigterm_raises():
    """While the block runs in the main thread, SIGTERM raises :class:`Terminated` in this process."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pid = os.getpid()

    def handler(signum, frame):
        if os.getpid() != pid:  # a forked child (a DataLoader worker): die as it would have
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated("terminated (SIGTERM)")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["EXIT_TERMINATED", "Terminated", "sigterm_raises"]
