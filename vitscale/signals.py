"""SIGTERM ends a command the way Ctrl-C does: as an exception, so that everything on the way out
runs — a checkpoint being written removes its partial folder, the run folder's lock is released, logs
are closed — and the command exits with 143 (128 + SIGTERM, what a shell reports for a process that
the signal killed) and one line, ``vitscale train: terminated (SIGTERM)``.

Python's default for SIGTERM is to die at once, running nothing: a scheduler stopping a job (Slurm
sends SIGTERM first) left ``run.lock`` and a partial ``.tmp-step_…`` folder behind. The handler is
installed for the duration of a command by :func:`vitscale.cli.main`; a process forked from it
(a DataLoader worker) keeps the default behaviour. Saving a checkpoint on a signal is the trainer's
(:mod:`vitscale.train.preemption`); its loader workers outlive the signal (:func:`loader_worker_signals`).
"""

from __future__ import annotations

import contextlib
import os
import signal

EXIT_TERMINATED = 128 + signal.SIGTERM


class Terminated(BaseException):
    """The process received SIGTERM (a BaseException, like KeyboardInterrupt: no ``except Exception``
    swallows it). ``exit_code``: the command's (143; a subclass sets its own)."""

    exit_code = EXIT_TERMINATED


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


def loader_worker_signals() -> None:
    """In a data-loader worker process (its ``worker_init_fn``): the trainer decides what a signal
    means (``checkpoint.save_on_signal``: finish the step, save, exit), so its workers keep feeding
    it. A terminal's Ctrl-C and a scheduler's signal reach every process of the job, and PyTorch's
    workers die on any SIGTERM not sent by their parent (its worker signal handler), which failed
    the step being finished: here SIGINT, SIGUSR1 and SIGUSR2 are ignored, and the first SIGTERM too
    (the next one — the loader ending a stuck worker at exit, a scheduler's second — ends it). A
    worker whose trainer is gone notices and exits (PyTorch's worker checks its parent)."""

    def first_sigterm(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    for name in ("SIGINT", "SIGUSR1", "SIGUSR2"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    signal.signal(signal.SIGTERM, first_sigterm)


__all__ = ["EXIT_TERMINATED", "Terminated", "loader_worker_signals", "sigterm_raises"]
