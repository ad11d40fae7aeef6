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
        if signal.getsignal(signal.SIGTERM) is handler:  # one set meanwhile stays (a rank leaving: vitscale.launcher)
            signal.signal(signal.SIGTERM, previous)


def loader_worker_signals() -> None:
    """In a data-loader worker process (its ``worker_init_fn``): the trainer decides what a signal
    means (``checkpoint.save_on_signal``: finish the step, save, exit), so its workers keep feeding
    it. A terminal's Ctrl-C and a scheduler's signal reach every process of the job, and PyTorch's
    workers die on any SIGTERM not sent by their parent (its worker signal handler): the trainer's
    next batch then failed ("DataLoader worker ... is killed by signal") in the step being finished.
    Here SIGINT, SIGUSR1 and SIGUSR2 are ignored; a SIGTERM from the trainer (the loader ending its
    workers, or Python's multiprocessing at exit) ends the worker at once, as PyTorch's handler does;
    one from elsewhere is ignored the first time and ends it the second. SIGTERM is taken by a thread
    waiting for it (``sigwaitinfo`` tells the sender) where the platform has one; elsewhere the first
    SIGTERM is ignored whoever sent it."""
    import threading

    for name in ("SIGINT", "SIGUSR1", "SIGUSR2"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    parent = os.getppid()
    if not hasattr(signal, "sigwaitinfo"):

        def first_sigterm(signum, frame):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

        signal.signal(signal.SIGTERM, first_sigterm)
        return

    def watch() -> None:
        external = 0
        while True:
            info = signal.sigwaitinfo({signal.SIGTERM})
            if info.si_pid == parent or os.getppid() != parent or external:
                os._exit(0 if info.si_pid == parent else EXIT_TERMINATED)
            external += 1

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # this thread and the next: taken by sigwaitinfo
    threading.Thread(target=watch, name="vitscale-loader-sigterm", daemon=True).start()


__all__ = ["EXIT_TERMINATED", "Terminated", "loader_worker_signals", "sigterm_raises"]
