"""Save on a signal (``checkpoint.save_on_signal``): a preempted run loses at most the step in flight.

A signal of the set (default SIGTERM — what Slurm and other schedulers send to stop a job —,
SIGUSR1 — the warning ``sbatch --signal=USR1@120`` asks for — and SIGINT, Ctrl-C) is only *noted*
by its handler; the training loop finishes the step it is in, all ranks agree that the run stops at
that step, a checkpoint is written (an asynchronous one waited for), and the job exits with code
128 + the signal's number (143, 138, 130), the line saying which checkpoint to resume from. A second
signal of the set quits at once (Ctrl-C twice: ``KeyboardInterrupt``; otherwise the command ends
as for an unhandled SIGTERM, :mod:`vitscale.signals`).

The signal may reach only some ranks (``kill`` of one process, a node's agent forwarding it). The
ranks agree through one all-reduce (maximum) of a 4-byte CPU tensor per step on a gloo process group
of its own (made before the first step): the host decides, so a step that does not log still reads
nothing back from the device (docs/architecture.md), and the collective never queues behind the GPU's work. The all-reduce is
pipelined — launched after a step, read after the next — so it costs the loop nothing measurable
where a blocking one added ~1.2 ms to a 2 ms step (2 gloo ranks on a shared 2-core machine:
``benchmarks/results/preemption_flag_cpu_202611.json``); the price is one more step before the stop.

A signal is honoured even when the step in progress never ends (a collective whose peer hangs, a
loader stuck on a file system, a start-up that never reaches its first step): from the first signal a
deadline runs (``checkpoint.signal_deadline`` seconds, a daemon timer); when the step has not ended by
then, one line says so, naming the last checkpoint saved, and the process exits with the same code
128 + the signal's number, without saving the step it could not finish. The deadline is cancelled
once the ranks have agreed to stop (the step ended): the save that follows is not bounded by it.

A process forked from the trainer (a DataLoader worker) inherits the handler: there it ignores SIGINT
and SIGUSR1 and the first SIGTERM (a terminal's Ctrl-C and Slurm's signal reach every process of the
job; the workers must keep feeding the step being finished), and dies on the next SIGTERM (the loader
ending its workers).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from vitscale.signals import Terminated


class Preempted(Terminated):
    """The run stopped on a signal after saving a checkpoint: exit code 128 + the signal's number."""

    def __init__(self, message: str, signum: int, quiet: bool = False):
        super().__init__(message)
        self.exit_code = 128 + signum
        self.quiet = quiet  # said by rank 0 only (every rank stops on the same step)


UNCATCHABLE = ("SIGKILL", "SIGSTOP")


def signal_number(name: str) -> int:
    """The number of a signal a run can catch, by name (``SIGTERM``); a one-line :class:`ConfigError`
    for a name this system does not know or a signal no process can catch (SIGKILL, SIGSTOP)."""
    from vitscale.errors import ConfigError

    known = signal.Signals.__members__
    catchable = sorted(n for n in known if n.startswith("SIG") and not n.startswith("SIG_") and n not in UNCATCHABLE)
    if name in UNCATCHABLE:
        raise ConfigError(f"checkpoint.save_on_signal: {name} cannot be caught by any process; use e.g. SIGTERM, "
                          "SIGUSR1, SIGINT")  # fmt: skip
    if name not in known or not name.startswith("SIG") or name.startswith("SIG_"):
        import difflib

        close = difflib.get_close_matches(str(name), catchable, n=1)
        raise ConfigError(f"checkpoint.save_on_signal: {name!r} is not a signal name here"
                          f"{f' (did you mean {close[0]}?)' if close else ''}; e.g. SIGTERM, SIGUSR1, SIGINT")  # fmt: skip
    return int(known[name])


class Preemption:
    """The trainer's save-on-signal component: ``names`` the signals (``checkpoint.save_on_signal``).
    Its handlers are installed while ``with preemption:`` runs (in the main thread; nested uses
    install them once) — :func:`vitscale.train.train` does so before the run is built, so that the
    loader's worker processes, forked later, inherit them; :meth:`agreed` is the per-step decision
    (collective with several ranks)."""

    def __init__(self, names: tuple[str, ...] | list[str], deadline: float | None = None, group=None):
        self.signums = [signal_number(n) for n in names]
        self.deadline = deadline  # seconds from the first signal to the end of the step (None: no deadline)
        self.last_saved = lambda: None  # the newest checkpoint saved, for the deadline's line (watch)
        self._timer: threading.Timer | None = None
        self.requested = 0
        self.group = None
        self._previous: dict[int, Any] = {}
        self._depth = 0
        self._flags: list = []
        self._work = None  # the agreement under way (launched after the previous step)
        self._steps = 0
        self._single = False  # known to be one process (no agreement needed)
        if group is not None:  # the agreement's group given (a job of several runs: its ranks, all of them)
            import torch

            self.group = group
            self._flags = [torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)]

    @classmethod
    def build(cls, cc, group=None) -> Preemption:
        """The component of the ``checkpoint`` group ``cc``: its signals (``save_on_signal``) and their
        deadline (``signal_deadline``). Built from the config, not the assembled run: it is entered
        before the run is built (see the class). ``group``: a gloo process group the agreement spans
        instead of the run's own ranks (None: the run's; a job of several runs gives its whole job's, so
        that every run stops after the same step)."""
        return cls(cc.save_on_signal, cc.signal_deadline, group)

    def watch(self, last_saved) -> None:
        """``last_saved()``: the newest checkpoint saved (a path or None), named if the deadline passes."""
        self.last_saved = last_saved

    def _join(self) -> None:
        """With several ranks, the gloo group of the agreement, made by every rank at the same point of the
        run, after the run's own groups: when the trainer enters this component, before its first step.
        Not at the first agreement: a peer lost before it (a node killed while its first step ran) left
        the others waiting in ``new_group`` for the process group's whole timeout, with no error."""
        import torch
        import torch.distributed as dist

        self._single = not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)
        if not self._single:
            self.group = dist.new_group(backend="gloo")
            self._flags = [torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)]

    def __enter__(self) -> Preemption:
        self._depth += 1
        if self._depth == 1 and threading.current_thread() is threading.main_thread():
            pid = os.getpid()
            for s in self.signums:
                self._previous[s] = signal.signal(s, lambda signum, frame: self._noted(signum, pid))
        if self.group is None and self.signums and not self._single and _in_process_group():
            self._join()  # the trainer's ``with``: the run's process group exists
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self._settle()  # the run ended normally: the agreement launched after its last step completes
        self._depth -= 1
        if self._depth == 0:
            self._cancel()
            for s, handler in self._previous.items():
                signal.signal(s, handler)
            self._previous.clear()

    def _noted(self, signum: int, pid: int) -> None:
        name = signal.Signals(signum).name
        if os.getpid() != pid:  # a forked child (a DataLoader worker): the trainer decides
            if signum == signal.SIGTERM:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the next one (the loader's terminate) ends it
            return
        if self.requested:  # the second signal: quit at once
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Preempted(f"terminated ({name}, a second signal: no checkpoint saved)", signum)
        self.requested = signum
        within = f" (within {self.deadline:g} s)" if self.deadline else ""
        os.write(2, f"vitscale: {name} received: finishing the current step{within}, then saving a checkpoint and "
                    f"exiting (send it again to quit at once)\n".encode())  # fmt: skip
        if self.deadline:
            self._timer = threading.Timer(self.deadline, self._expired, (signum,))
            self._timer.daemon = True
            self._timer.start()

    def _expired(self, signum: int) -> None:
        """The deadline passed with the step unfinished: one line naming the last checkpoint, then exit
        (``os._exit``: the main thread may be stuck where no exception reaches it)."""
        import sys

        try:
            last = self.last_saved()
        except Exception:  # noqa: BLE001 - the exit must happen whatever the record says
            last = None
        name = signal.Signals(signum).name
        saved = f"the last checkpoint saved is {last}: run the same command to resume" if last else "no checkpoint was saved"
        line = (f"vitscale train: {name}: the step in progress did not end within checkpoint.signal_deadline="
                f"{self.deadline:g} s; exiting without saving it ({saved})")  # fmt: skip
        try:
            print(line, file=sys.stderr, flush=True)  # through train.log's tee when it is open
        except Exception:  # noqa: BLE001
            os.write(2, (line + "\n").encode())
        os._exit(128 + signum)

    def _cancel(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def agreed(self, segments=None) -> int:
        """The signal every rank stops on after this step (0: go on): the largest number noted by any
        rank. With several ranks, pipelined: the all-reduce of the flags noted by the end of the
        previous step is waited for, and this step's is launched, to complete in gloo's thread while the
        next step computes — every rank reads the same value after the same step, one step after the
        signal's (measured: benchmarks/results/preemption_flag_cpu_202611.json). ``segments``
        (:class:`~vitscale.train.segments.Segments`): the run's segment is marked as ended by it."""
        found = self.requested
        if self.group is None and self.signums and not self._single:
            self._join()
        if self.group is not None:
            import torch.distributed as dist

            found = 0
            if self._work is not None:
                self._work.wait()
                found = int(self._flags[(self._steps - 1) % 2][0])
            flag = self._flags[self._steps % 2]
            flag[0] = self.requested
            self._work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
            self._steps += 1
        if found:
            self._cancel()  # the step ended on every rank: the save that follows is not bounded
            if segments is not None:
                segments.ended = signal.Signals(found).name
        return found

    def _settle(self) -> None:
        work, self._work = self._work, None
        if work is not None:
            work.wait()

    def stop(self, signum: int, last: bool, step: int, checkpoints) -> None:
        """After the checkpoint of ``step`` was started on signal ``signum`` (0: none, nothing to do): wait
        for its write, then end the run — unless ``step`` is the run's last, which ends anyway. Rank 0
        says so; the others stop quietly."""
        if not signum or last:
            return
        self._settle()  # every rank launched one more agreement after this step: it completes on every rank
        checkpoints.wait()
        name = signal.Signals(signum).name
        raise Preempted(f"stopped by {name} after step {step}; checkpoint {checkpoints.last} saved: run the same "
                        f"command to resume", signum, quiet=_rank() != 0)  # fmt: skip


def _in_process_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if _in_process_group() else 0


__all__ = ["Preempted", "Preemption"]
