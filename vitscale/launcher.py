"""What a command's error looks like when ``torchrun`` started it on many ranks.

Every rank of a job reads the same command line and config, so a refusal (exit code 2: the command
line or the config must change) reaches all of them alike: under torchrun each of 8 ranks printed the
same line (for ``vitscale eval`` of an unknown config, 600 characters listing every built-in one), and
torchrun's own report of the failed workers (a traceback and a box of ``error_file: <N/A>`` entries)
came after them. Here a refusal is said once:

- rank 0 prints it, writes it into its ``TORCHELASTIC_ERROR_FILE`` (torchrun's report then shows the
  line as the root cause, at its end, instead of a link to the elastic docs) and tells the other ranks
  through the launcher's store that it has;
- every other rank waits for that word (at most :data:`WAIT_S` seconds), then exits quietly with the
  same code (its error file names rank 0). The wait is what makes it hold: a rank that exited at
  once had torchrun stop rank 0 (SIGTERM) before rank 0 had printed anything. A rank that hears
  nothing in time, or is stopped by torchrun meanwhile, has its own line printed, or leaves it to
  the rank that failed first.

Another error (a file one rank cannot read, its device) is printed by the rank it happened on, named
``(rank N)``, and written into that rank's error file. Ranks started by another launcher (Slurm's
``srun``: ``RANK`` set, no torchrun agent) keep rank 0's line only. Nothing here imports torch unless
torchrun started the process.
"""

from __future__ import annotations

import json
import os
import sys
import time

from .errors import EXIT_USAGE

WAIT_S = 20.0
"""How long a rank other than 0 waits for rank 0 to say a refusal before it says it itself."""
LINGER_S = 5.0
"""How long it then waits for torchrun to stop it (sent once rank 0 has exited, so that torchrun names
rank 0 as the root cause; ranks on another node hear no such signal) before it exits by itself."""


def rank() -> int:
    """This process's global rank under torchrun / Slurm (``RANK``), 0 otherwise."""
    try:
        return int(os.environ.get("RANK", "0") or 0)
    except ValueError:
        return 0


def under_torchrun() -> bool:
    """Whether torchrun's elastic agent started this process (it sets ``TORCHELASTIC_RUN_ID``)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def say(text: str, code: int, line: str | None = None) -> None:
    """Print ``text`` (what a command prints for an error it ends with: ``vitscale train: ...``, or
    argparse's usage and error) on standard error as this rank should, for exit code ``code``;
    ``line``: the one line torchrun's report shows (default: the last line of ``text``)."""
    r = rank()
    line = line or text.strip().splitlines()[-1]
    if r and code == EXIT_USAGE:
        if not under_torchrun():
            return  # another launcher: rank 0 says it, as every rank reaches it alike
        heard = _wait_for_rank0()
        if heard:  # rank 0 leaves first: torchrun then reports it as the root cause and stops this rank
            _wait(lambda: False, LINGER_S)
        if heard is not False:  # None: torchrun stopped this rank while it waited (another rank ended)
            _leaving()
            why = "as rank 0 says" if heard else "stopped by torchrun before rank 0 had said why"
            _error_file(f"refused (exit code {code}), {why}")
            return  # rank 0 said nothing in WAIT_S: this rank says its own
    print(text, file=sys.stderr, flush=True)
    _error_file(line)
    if r == 0 and code == EXIT_USAGE and under_torchrun():
        _tell_the_others()
        _leaving()


def _leaving() -> None:
    """This rank exits with a refusal said (by it: rank 0; by rank 0: another): torchrun's SIGTERM, sent
    to the ranks still running once one has exited, must not turn its exit code 2 into a death by
    signal (``-15`` in torchrun's report) while the interpreter shuts down. ``vitscale.signals.sigterm_raises`` leaves the handler
    set here in place."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _error_file(line: str) -> None:
    """``line`` as this worker's failure in torchrun's report: the JSON its error handler reads from
    ``TORCHELASTIC_ERROR_FILE``, in the layout its ``ErrorHandler.record_exception`` writes (the line
    in place of a traceback); the earliest is reported as the root cause. Nothing without torchrun, or
    when the file cannot be written."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or not under_torchrun():
        return
    try:
        with open(path, "w") as f:
            json.dump({"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}}, f)
    except OSError:
        pass


def _key() -> str:
    return f"vitscale/refused/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def _store():
    """A client of the torchrun agent's store (``MASTER_ADDR:MASTER_PORT``, what every rank's process
    group joins), or None where the agent serves none or it cannot be reached."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or not os.environ.get("MASTER_PORT"):
        return None
    try:
        from datetime import timedelta

        from torch.distributed import TCPStore

        return TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"]), is_master=False,
                        timeout=timedelta(seconds=10), wait_for_workers=False)  # fmt: skip
    except Exception:  # noqa: BLE001 - no store: the rank says its own line
        return None


def _tell_the_others() -> None:
    store = _store()
    if store is not None:
        try:
            store.set(_key(), "said")
        except Exception:  # noqa: BLE001 - the others then say it themselves after WAIT_S
            pass


def _wait_for_rank0() -> bool | None:
    """True once rank 0 has said its refusal; None when this rank is stopped while waiting (torchrun
    ending the job: a rank has exited); False after :data:`WAIT_S` without a word, or without a store."""
    store = _store()
    if store is None:
        return False
    try:
        return _wait(lambda: store.check([_key()]), WAIT_S)
    except Exception:  # noqa: BLE001 - the store went away with its agent: the job is ending
        return None


def _wait(done, seconds: float) -> bool | None:
    """Poll ``done()`` until it is true (True) or ``seconds`` have passed (False); None when SIGTERM
    (``vitscale.signals.Terminated``) or Ctrl-C arrives meanwhile."""
    from .signals import Terminated

    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if done():
                return True
            time.sleep(0.05)  # short sleeps: a signal's handler runs between them
    except (Terminated, KeyboardInterrupt):
        return None
    return False
