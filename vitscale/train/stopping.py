"""What stops or saves a run before its last step, one component: a signal (:mod:`.preemption`:
save on ``checkpoint.save_on_signal``, all ranks agreeing, within ``checkpoint.signal_deadline``), a
hang (:mod:`.watchdog`: ``train.hang_timeout``), and the record of how each start of the job ended
(:mod:`.segments`).

:class:`Stopping` is built from the ``checkpoint`` and ``train`` groups and the rank
(:meth:`Stopping.build`), before the run is assembled: :func:`vitscale.train.train` enters it for the
whole command, so that a signal or a hang during start-up is handled too, and the trainer enters it
again around the loop. The loop calls :meth:`~Stopping.begin` once, then after each step
:meth:`~Stopping.agreed` (save now?) and :meth:`~Stopping.after_step` (a signal's save waited for and
the run ended; else the watchdog told of the progress).
"""

from __future__ import annotations

import contextlib

from .preemption import Preemption
from .watchdog import Watchdog


class Stopping:
    """``preemption``: save on a signal; ``watchdog``: the hang timeout. A context manager (entered
    more than once: each part counts its entries)."""

    def __init__(self, preemption: Preemption, watchdog: Watchdog):
        self.preemption, self.watchdog = preemption, watchdog
        self.segments = None
        self._stack: list[contextlib.ExitStack] = []

    @classmethod
    def build(cls, cc, *, train, rank: int, agreement=None) -> Stopping:
        """From the ``checkpoint`` group ``cc`` (the signals and their deadline), the ``train`` group
        (``hang_timeout``, ``output_dir``) and this process's ``rank``; ``agreement``: the process group
        a signal's stop is agreed over when it is not the run's own (:meth:`Preemption.build`)."""
        return cls(Preemption.build(cc, agreement), Watchdog.build(train, rank=rank))

    def __enter__(self) -> Stopping:
        stack = contextlib.ExitStack()
        stack.enter_context(self.preemption)
        stack.enter_context(self.watchdog)
        self._stack.append(stack)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.pop().__exit__(*exc)

    def begin(self, step: int, *, segments, checkpoints) -> None:
        """The loop begins at ``step``: a new segment of the run (``segments``:
        :class:`~vitscale.train.segments.Segments`); ``checkpoints`` names the last one saved if a
        signal's deadline passes."""
        self.segments = segments
        segments.start(step)
        self.preemption.watch(lambda: checkpoints.last)

    def agreed(self) -> int:
        """The signal every rank stops on after this step (0: go on); the segment marked as ended by it."""
        return self.preemption.agreed(self.segments)

    def after_step(self, signum: int, last: bool, step: int, checkpoints) -> None:
        """After ``step`` (and its save, on signal ``signum``): a signal ends the run once the write is
        done (:class:`~vitscale.train.preemption.Preempted`), unless the step is the run's last; else
        the watchdog is told of the progress."""
        self.preemption.stop(signum, last, step, checkpoints)
        self.watchdog.beat(step)


__all__ = ["Stopping"]
