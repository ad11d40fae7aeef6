"""``train.log``: everything rank 0 prints while a run is open, as the terminal finally shows it.

While a :class:`RunLog` is open, ``sys.stdout`` and ``sys.stderr`` are teed into the file: the
progress lines, notices, warnings (vitscale's loggers and Python's), the final summary. A progress
bar redraws its line with carriage returns; the file keeps what a terminal shows once the line ends
(the text after the last ``\\r``, escape sequences removed), so a bar leaves one line — its final
state — instead of every redraw, and a line written above a live bar lands in the file on its own.

vitscale's warnings (``logging.getLogger("vitscale")``) go through ``tqdm.write`` while the log is
open, above a live bar instead of through it. When the application configured logging itself (the
root logger has handlers) they are left to it on the console and only copied into the file.
"""

from __future__ import annotations

import datetime
import io
import logging
import re
import sys
from pathlib import Path
from typing import TextIO

from vitscale.safe_write import open_append

_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def visible(line: str) -> str:
    """What a terminal shows of ``line`` (no newline in it): the text after its last carriage
    return, without escape sequences and trailing blanks."""
    return _ESCAPE.sub("", line.rsplit("\r", 1)[-1]).rstrip()


class _Tee:
    """A text stream that writes to ``stream`` and records the text in a :class:`RunLog`."""

    def __init__(self, stream: TextIO, log: RunLog, key: str):
        self._stream, self._log, self._key = stream, log, key

    def write(self, text: str) -> int:
        n = self._stream.write(text)
        self._log._record(self._key, text)
        return n

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:  # a progress bar on a terminal stays a bar
        return self._stream.isatty()

    def __getattr__(self, name):  # fileno (terminal width), encoding, errors, ...
        return getattr(self._stream, name)


class _WarningHandler(logging.Handler):
    def __init__(self, log: RunLog, console: bool):
        super().__init__(logging.WARNING)
        self.log, self.console = log, console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = self.format(record)
            if self.console:  # through the tee: on the terminal above a live bar, and in the file
                from tqdm import tqdm

                tqdm.write(msg, file=sys.stderr)
            else:
                self.log.write_line(msg)
        except Exception:  # noqa: BLE001 — logging must never end a run
            self.handleError(record)


class _Buffer(io.StringIO):
    """What a :class:`RunLog` records before the run has its folder."""

    def flush(self) -> None:
        pass


class RunLog:
    """Tee this process's output into ``path`` (appended: a resumed run adds to its log).

    Use as a context manager; the file is written from :meth:`attach` on (what came before is kept
    until then); ``enabled=False`` (ranks other than 0) does nothing."""

    def __init__(self, path: str | Path, *, enabled: bool = True, header: str | None = None):
        self.path = Path(path)
        self.enabled = enabled
        self.header = header
        self._file: TextIO | None = None
        self._tees: tuple[_Tee, _Tee] | None = None
        self._saved: tuple[TextIO, TextIO] | None = None
        self._pending: dict[str, str] = {}
        self._handler: _WarningHandler | None = None

    def __enter__(self) -> RunLog:
        if not self.enabled:
            return self
        # Held in memory until :meth:`attach`: a run refused before it starts (bad settings, a folder
        # another run holds) writes nothing into the folder, least of all into another run's log.
        self._file = _Buffer()
        stamp = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
        self._file.write(f"==> {stamp} {self.header or ''}".rstrip() + "\n")
        self._saved = (sys.stdout, sys.stderr)
        self._tees = (_Tee(sys.stdout, self, "out"), _Tee(sys.stderr, self, "err"))
        sys.stdout, sys.stderr = self._tees
        self._handler = _WarningHandler(self, console=not logging.getLogger().handlers)
        logging.getLogger("vitscale").addHandler(self._handler)
        return self

    def attach(self) -> None:
        """The run has its folder: write what was recorded so far to the file, and the rest as it comes."""
        if not isinstance(self._file, _Buffer):
            return
        held = self._file.getvalue()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fresh = not self.path.exists() or self.path.stat().st_size == 0
            f = open_append(self.path)  # never through a symbolic link (vitscale.run.folder)
        except OSError:  # a folder that cannot be written: the run's own checks say so, readably
            return
        f.write(("" if fresh else "\n") + held)
        f.flush()
        self._file = f

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._file is None:
            return
        logging.getLogger("vitscale").removeHandler(self._handler)
        # put the streams back unless something replaced our tees meanwhile (then leave its choice)
        if sys.stdout is self._tees[0]:
            sys.stdout = self._saved[0]
        if sys.stderr is self._tees[1]:
            sys.stderr = self._saved[1]
        for key in list(self._pending):
            rest = visible(self._pending.pop(key))
            if rest:
                self._file.write(rest + "\n")
        if exc_type is KeyboardInterrupt:
            self._file.write("stopped: interrupted (KeyboardInterrupt)\n")
        elif exc is not None:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self._file.write(f"stopped by {exc_type.__name__}: {first}".rstrip(": ") + "\n")
        if not isinstance(self._file, _Buffer):
            self._file.close()
        self._file = None

    def write_line(self, text: str) -> None:
        """Record ``text`` in the file only (what another channel already showed on the console)."""
        if self._file is not None:
            for line in text.split("\n"):
                self._file.write(visible(line) + "\n")
            self._file.flush()

    def _record(self, key: str, text: str) -> None:
        if self._file is None or not text:
            return
        pending = self._pending.get(key, "")
        if pending.startswith("\r") and text[0] not in "\r\n":
            pending = ""  # a bar's redraw, then other text on the same line: the bar state is not kept
        *lines, rest = (pending + text).split("\n")
        for line in lines:
            self._file.write(visible(line) + "\n")
        if lines:
            self._file.flush()
        self._pending[key] = rest


__all__ = ["RunLog", "visible"]
