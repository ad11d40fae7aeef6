"""Where data lives: local paths, fsspec URLs (``s3://``, ``gs://``, ``az://``, ``http(s)://``,
``hf://``) and ``pipe:`` commands, for every format that reads files (shards, Parquet).

- :func:`expand`: a ``data.train_path`` / ``data.val_path`` into its files: several specs joined with
  ``::``, brace patterns (``train-{000000..000099}.tar``, also inside a ``pipe:`` command), globs,
  and folders (local or remote: every file with the format's extension).
- :func:`open_stream`: one file for reading front to back (a local file, an fsspec URL streamed
  without range requests, the standard output of a ``pipe:`` command — webdataset's and open_clip's
  convention, ``pipe:aws s3 cp s3://bucket/x.tar -``); :func:`open_random`: seekable (local or fsspec
  with range requests); :func:`local_copy`: a local copy of a remote file in ``data.shard_cache``.
- :func:`read_retrying`: transient errors (a connection reset, a timeout, a 5xx answer, a failed
  command) are retried with exponential backoff, continuing after what was already read; permanent
  ones (404, 403, a corrupt file) are not.
- :func:`check_urls`: the up-front checks: every URL's scheme has its fsspec package installed
  (s3fs, gcsfs, adlfs, aiohttp, huggingface_hub), the first file opens.

Credentials come from each store's standard environment (``AWS_*`` / ``AWS_ENDPOINT_URL`` for S3,
``GOOGLE_APPLICATION_CREDENTIALS`` for GCS, ``AZURE_STORAGE_*`` for Azure, ``HF_TOKEN`` for the Hub).
``hf://`` URLs are read through huggingface_hub; with ``HF_HUB_OFFLINE=1`` only the local Hub cache is
read (``hf://datasets/<repo>/<path>`` from the cached snapshot), never the network.
"""

from __future__ import annotations

import glob
import hashlib
import io
import logging
import os
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator

from ..errors import CheckError
from ..shell import PIPE, scheme
from .files import describe_skipped, open_regular, split_regular

log = logging.getLogger("vitscale.data")

# fsspec protocol -> the package that implements it (fsspec's own registry names the class)
SCHEME_PACKAGES = {
    "s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
    "abfss": "adlfs", "adl": "adlfs", "http": "aiohttp", "https": "aiohttp", "hf": "huggingface_hub",
}  # fmt: skip
INSTALL = {"s3fs": "pip install 'vitscale[s3]'", "gcsfs": "pip install 'vitscale[gcs]'",
           "adlfs": "pip install adlfs", "aiohttp": "pip install aiohttp", "huggingface_hub": "pip install huggingface_hub"}  # fmt: skip


class RemoteOptions:
    """Settings of remote reading (``data.remote_retries`` ...), taken from any config with them."""

    def __init__(self, retries: int = 3, backoff_s: float = 1.0, timeout_s: float = 60.0, cache: str | None = None,
                 deadline_s: float = 1800.0):  # fmt: skip
        self.retries, self.backoff_s, self.timeout_s, self.cache = retries, backoff_s, timeout_s, cache
        self.deadline_s = deadline_s

    @classmethod
    def of(cls, cfg) -> RemoteOptions:
        return cls(cfg.remote_retries, cfg.remote_backoff_s, cfg.remote_timeout_s, cfg.shard_cache,
                   getattr(cfg, "remote_deadline_s", 1800.0))  # fmt: skip


# ------------------------------------------------------------------------------------------ names
def is_local(url: str) -> bool:
    return scheme(url) == "file"


def local_path(url: str) -> str:
    return url[len("file://"):] if url.startswith("file://") else url


def name_of(url: str) -> str:
    """The file name of a path, URL or ``pipe:`` command (its last word that looks like a file)."""
    if url.startswith(PIPE):
        words = [w for w in url[len(PIPE):].split() if "." in os.path.basename(w)]
        return os.path.basename(words[-1]) if words else url
    return os.path.basename(url.rstrip("/"))


def _braces(text: str) -> list[str]:
    if "{" not in text:
        return [text]
    from braceexpand import braceexpand  # a dependency of webdataset

    return list(braceexpand(text))


def _fs(url: str, opts: RemoteOptions | None = None):
    """(fsspec filesystem, path) of a URL; with ``opts``, its reads bounded by ``opts.timeout_s``."""
    import fsspec

    return fsspec.core.url_to_fs(url, **(_http_kwargs(url, opts) if opts is not None else {}))


def _hf_offline() -> bool:
    try:
        from huggingface_hub import constants
    except ImportError:
        return False
    return bool(constants.HF_HUB_OFFLINE)


def hf_local(url: str) -> str:
    """``hf://datasets/<owner>/<name>[@rev]/<path>`` in the local Hub cache (offline mode); a
    ``CheckError`` when it is not there."""
    from huggingface_hub import snapshot_download

    rest = url[len("hf://"):]
    kind, _, rest = rest.partition("/")
    parts = rest.split("/")
    if kind not in ("datasets", "models", "spaces") or len(parts) < 2:
        raise CheckError(f"{url}: expected hf://datasets/<owner>/<name>/<path>")
    repo, path = "/".join(parts[:2]), "/".join(parts[2:])
    repo, _, rev = repo.partition("@")
    try:
        root = snapshot_download(repo, repo_type=kind[:-1], revision=rev or None, local_files_only=True)
    except Exception as e:  # LocalEntryNotFoundError and friends: nothing cached
        raise CheckError(f"{url}: HF_HUB_OFFLINE is set and {repo} is not in the local Hub cache "
                         f"({type(e).__name__}); download it once online, or unset HF_HUB_OFFLINE") from None  # fmt: skip
    return os.path.join(root, path)


# ------------------------------------------------------------------------------------------ lists
def expand(spec: str, exts: tuple[str, ...], field: str = "data.train_path", opts: RemoteOptions | None = None) -> list[str]:
    """The files of ``spec`` (see the module docstring); a ``CheckError`` naming ``field`` when it
    expands to nothing. ``opts``: a remote listing's reads bounded by ``data.remote_timeout_s``."""
    out: list[str] = []
    for part in str(spec).split("::"):
        for item in _braces(part):
            kind = scheme(item)
            if kind == "pipe":
                out.append(item)
            elif kind == "hf" and _hf_offline():
                out += _list_local(hf_local(item), exts, spec)
            elif kind == "file":
                out += _list_local(local_path(item), exts, spec)
            else:
                check_scheme(item, field)
                try:
                    out += _list_remote(item, exts, opts)
                except Exception as e:  # a store that refuses or never answers: one line naming the path
                    raise CheckError(f"{field}={spec}: listing {item} failed: {describe_error(e)}") from None
    if not out:
        raise CheckError(f"{field}={spec}: expands to no {' / '.join(exts)} files; check the path, pattern or folder")
    return out


def _list_local(path: str, exts: tuple[str, ...], spec: str) -> list[str]:
    folder = os.path.isdir(path)
    if folder:
        found = sorted(p for p in glob.glob(os.path.join(path, "*")) if p.endswith(exts) and not os.path.isdir(p))
    elif any(c in path for c in "*?["):
        found = sorted(glob.glob(path))
    else:
        found = [path]
    found, special = split_regular(found)  # a FIFO named x.tar would block the first read forever
    if special:
        log.warning("%s", describe_skipped(f"data files {spec}", special))
    return [p for p in found if os.path.isfile(p)] if folder else found  # a folder's broken links: not listed


def _list_remote(url: str, exts: tuple[str, ...], opts: RemoteOptions | None = None) -> list[str]:
    fs, path = _fs(url, opts)
    if any(c in path for c in "*?["):
        return sorted(fs.unstrip_protocol(p) for p in fs.glob(path))
    if path.endswith(exts):  # a file: its existence is checked when it is opened
        return [url]
    try:
        found = fs.find(path) if fs.isdir(path) else []
    except (FileNotFoundError, NotImplementedError):
        found = []
    return sorted(fs.unstrip_protocol(p) for p in found if p.endswith(exts)) or [url]


# ------------------------------------------------------------------------------------------ checks
def check_scheme(url: str, field: str) -> None:
    """``CheckError`` when the URL's scheme needs a package that is not installed (or is unknown)."""
    kind = scheme(url)
    if kind in ("file", "pipe"):
        return
    import fsspec

    try:
        fsspec.get_filesystem_class(kind)
    except ValueError:
        raise CheckError(f"{field}={url}: fsspec knows no {kind}:// storage") from None
    except ImportError:
        pkg = SCHEME_PACKAGES.get(kind, f"the package of fsspec's {kind}:// protocol")
        raise CheckError(f"{field}={url}: reading {kind}:// needs the {pkg} package: "
                         f"{INSTALL.get(pkg, f'pip install {pkg}')}") from None  # fmt: skip
    if kind == "http" or kind == "https":
        import importlib.util

        if importlib.util.find_spec("aiohttp") is None:
            raise CheckError(f"{field}={url}: reading {kind}:// needs the aiohttp package: pip install aiohttp")


def check_urls(urls: list[str], field: str, opts: RemoteOptions) -> None:
    """Up-front: every scheme readable here, and the first file opens (one line naming it otherwise)."""
    for kind in sorted({scheme(u) for u in urls}):
        check_scheme(next(u for u in urls if scheme(u) == kind), field)
    first = urls[0]
    try:
        with open_stream(first, opts) as f:
            head = f.read(512)
    except Exception as e:
        raise CheckError(f"{field}: the first file {first} cannot be read: {describe_error(e)}") from None
    if not head:
        raise CheckError(f"{field}: the first file {first} is empty")


# ------------------------------------------------------------------------------------------ opening
STDERR_KEPT = 1 << 16  # the tail of a command's standard error kept for its error line


class _PipeStream:
    """The standard output of a shell command; closing it checks the command's exit status.

    Its standard error is drained as it runs, by a thread that keeps the last 64 KiB (read after
    stdout ended, a command that wrote more than the pipe holds, 64 KiB on Linux, blocked forever on
    its next write). Each read waits at most ``opts.timeout_s`` for a byte and the whole output at
    most ``opts.deadline_s`` (a silent or trickling command is a ``TimeoutError``: retried, then
    skipped)."""

    def __init__(self, url: str, opts: RemoteOptions | None = None):
        import threading

        opts = opts or RemoteOptions()
        self.url, self.cmd = url, url[len(PIPE):]
        self.timeout_s, self.deadline = opts.timeout_s, time.monotonic() + opts.deadline_s
        self.deadline_s = opts.deadline_s
        # its own process group: closing early ends the whole pipeline, not just the shell
        self.proc = subprocess.Popen(self.cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # noqa: S602
                                     start_new_session=True)  # fmt: skip
        self._err = bytearray()
        self._drain = threading.Thread(target=self._read_stderr, name="vitscale-pipe-stderr", daemon=True)
        self._drain.start()

    def _read_stderr(self) -> None:
        try:
            while chunk := os.read(self.proc.stderr.fileno(), 1 << 16):
                self._err += chunk
                del self._err[:-STDERR_KEPT]
        except (OSError, ValueError):  # closed under it: the stream was closed early
            pass

    def read(self, n: int = -1) -> bytes:
        out = bytearray()
        fd = self.proc.stdout.fileno()
        while n < 0 or len(out) < n:
            chunk = self._read_some(fd, (1 << 20) if n < 0 else min(n - len(out), 1 << 20))
            if not chunk:
                break
            out += chunk
        if not out and n != 0:
            self._finish()
        return bytes(out)

    def _read_some(self, fd: int, n: int) -> bytes:
        import select

        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"command {self.cmd!r} still sending after data.remote_deadline_s={self.deadline_s:g} s")
        ready, _, _ = select.select([fd], [], [], min(self.timeout_s, left))
        if not ready:
            if left <= self.timeout_s:
                raise TimeoutError(f"command {self.cmd!r} still sending after data.remote_deadline_s={self.deadline_s:g} s")
            raise TimeoutError(f"command {self.cmd!r} sent nothing for data.remote_timeout_s={self.timeout_s:g} s")
        return os.read(fd, n)

    def _finish(self) -> None:
        status = self.proc.wait()
        if status != 0:
            self._drain.join(timeout=5)
            err = bytes(self._err).decode(errors="replace").strip().splitlines()
            raise OSError(f"command {self.cmd!r} exited with status {status}" + (f": {err[-1]}" if err else ""))

    def close(self) -> None:
        if self.proc.poll() is None:  # stopped early: not an error
            import signal

            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                self.proc.kill()
            self.proc.wait()
        self._drain.join(timeout=1)
        for f in (self.proc.stdout, self.proc.stderr):
            f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _http_kwargs(url: str, opts: RemoteOptions) -> dict:
    """The per-read timeout of a store: aiohttp's for http(s); botocore's for S3 (its default waits
    60 s a read and retries on its own: a silent endpoint held start-up for minutes), one attempt each,
    vitscale retrying (``data.remote_retries``)."""
    if scheme(url) in ("s3", "s3a"):
        return {"config_kwargs": {"connect_timeout": opts.timeout_s, "read_timeout": opts.timeout_s,
                                  "retries": {"max_attempts": 1}}}  # fmt: skip
    if scheme(url) not in ("http", "https"):
        return {}
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=opts.timeout_s, sock_read=opts.timeout_s)
    return {"client_kwargs": {"timeout": timeout}}


def open_file(path: str):
    """A local data file for reading (the one place a local shard or table is opened): a FIFO, socket
    or device is refused before a byte is read (:func:`vitscale.data.files.open_regular`), never blocks."""
    return open_regular(path)


class _Raw(io.RawIOBase):
    """A file-like object's ``read`` as the raw stream of an ``io.BufferedReader``; with a deadline
    (``data.remote_deadline_s``), a read that starts past it is a ``TimeoutError`` (each read itself is
    bounded by ``data.remote_timeout_s``): a server that trickles bytes cannot hold a reader forever."""

    def __init__(self, f, deadline_s: float | None = None, url: str = ""):
        self.f, self.url = f, url
        self.deadline_s = deadline_s
        self.deadline = time.monotonic() + deadline_s if deadline_s is not None else None

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TimeoutError(f"{self.url} not read within data.remote_deadline_s={self.deadline_s:g} s")
        data = self.f.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.f.close()
        super().close()


READ_SIZE = 1 << 20  # a remote stream is read 1 MiB at a time: each read is a round trip through
# fsspec's event-loop thread, and readers (tarfile) ask for 10 KiB


def open_stream(url: str, opts: RemoteOptions):
    """``url`` for reading front to back (see the module docstring)."""
    kind = scheme(url)
    if kind in ("file", "pipe") or (kind == "hf" and _hf_offline()):
        return _open_stream(url, opts)
    return io.BufferedReader(_Raw(_open_stream(url, opts), opts.deadline_s, url), buffer_size=READ_SIZE)


def _open_stream(url: str, opts: RemoteOptions):
    kind = scheme(url)
    if kind == "pipe":
        return _PipeStream(url, opts)
    if kind == "file":
        return open_file(local_path(url))
    if kind == "hf" and _hf_offline():
        return open_file(hf_local(url))
    import fsspec

    # http(s): one streamed GET, no range requests; a size given skips fsspec's HEAD request, which would
    # turn any refusal (403, 500) into "not found"
    if kind in ("http", "https"):
        fs, path = fsspec.core.url_to_fs(url, **_http_kwargs(url, opts))
        return fs.open(path, "rb", block_size=0, size=1)
    return fsspec.open(url, "rb", **_http_kwargs(url, opts)).open()


def open_random(url: str, opts: RemoteOptions):
    """``url`` seekable (local, or an fsspec URL read by range requests)."""
    kind = scheme(url)
    if kind == "file":
        return open_file(local_path(url))
    if kind == "hf" and _hf_offline():
        return open_file(hf_local(url))
    if kind == "pipe":
        raise ValueError(f"{url}: a pipe: command cannot be read at random positions")
    import fsspec

    return fsspec.open(url, "rb", **_http_kwargs(url, opts)).open()


def cache_dir(opts: RemoteOptions) -> str:
    """``data.shard_cache``, else ``shards/`` in vitscale's cache folder (``$VITSCALE_CACHE_DIR``, else
    ``~/.cache/vitscale``, as for the measured CPU peak of ``vitscale.tools.mfu``)."""
    root = os.environ.get("VITSCALE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vitscale"
    )
    return opts.cache or os.path.join(root, "shards")


def local_copy(url: str, opts: RemoteOptions) -> str:
    """A local path with the content of ``url``: the path itself for a local file, else a copy in the
    shard cache (``data.shard_cache``), downloaded once (retrying) and reused by later runs."""
    if is_local(url):
        return local_path(url)
    if scheme(url) == "hf" and _hf_offline():
        return hf_local(url)
    folder = cache_dir(opts)
    os.makedirs(folder, exist_ok=True)
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    target = os.path.join(folder, f"{digest}-{name_of(url)}")
    if os.path.isfile(target):
        return target

    def download() -> str:
        part = f"{target}.part-{os.getpid()}"
        try:
            with open_stream(url, opts) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            cut = cut_short(part, name_of(url))
            if cut:  # a server that closes early without a length looks like the end: never cached as complete
                raise EOFError(f"{url} was cut short ({cut}): not cached")
            os.replace(part, target)  # complete files only: another process may download it too
        finally:
            if os.path.exists(part):
                os.remove(part)
        return target

    return retrying(download, url, opts)


def cut_short(path: str, name: str) -> str | None:
    """Why a downloaded tar or Parquet file is visibly incomplete (an HTTP answer without a length
    ends where the connection closes), else None: a tar ends with two zero blocks, a Parquet file with
    its footer and the magic ``PAR1``."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if name.endswith(".tar"):
            if size < 2 * tarfile.BLOCKSIZE or size % tarfile.BLOCKSIZE:
                return f"{size} bytes, not whole tar blocks"
            f.seek(size - 2 * tarfile.BLOCKSIZE)
            if f.read().strip(b"\0"):
                return f"{size} bytes, no end-of-archive blocks"
        elif name.endswith(".parquet"):
            head = f.read(4)
            f.seek(max(size - 4, 0))
            if size < 12 or head != b"PAR1" or f.read(4) != b"PAR1":
                return f"{size} bytes, no Parquet footer"
    return None


# ------------------------------------------------------------------------------------------ errors
def describe_error(e: BaseException) -> str:
    """One short phrase for a read error (an HTTP status, a missing file, ...)."""
    status = getattr(e, "status", None) or getattr(e, "code", None)
    if isinstance(status, int) and 100 <= status < 600:
        return f"HTTP {status} {getattr(e, 'message', '') or ''}".strip()
    if isinstance(e, FileNotFoundError):
        return "not found (404 / no such file)"
    if isinstance(e, PermissionError):
        return "permission denied (403)"
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def transient(e: BaseException, url: str) -> bool:
    """Whether reading ``url`` again may succeed: network errors, timeouts, 5xx, 408, 429, a failed
    command, a remote stream cut short. Not: 4xx, a missing file, a corrupt local file."""
    status = getattr(e, "status", None)
    if isinstance(status, int):
        return status >= 500 or status in (408, 429)
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(e, (tarfile.ReadError, EOFError)):
        return not is_local(url)  # a remote stream cut short reads as a truncated file
    return isinstance(e, (OSError, TimeoutError, ConnectionError)) or type(e).__module__.startswith("aiohttp")


def retrying(fn: Callable[[], object], url: str, opts: RemoteOptions, sleep=time.sleep):
    """``fn()`` with transient errors retried ``opts.retries`` times, backing off exponentially."""
    for attempt in range(opts.retries + 1):
        try:
            return fn()
        except Exception as e:
            if attempt >= opts.retries or not transient(e, url):
                raise
            wait = opts.backoff_s * 2**attempt
            log.warning("reading %s failed (%s): retrying in %.1f s (%d of %d)", url, describe_error(e), wait,
                        attempt + 1, opts.retries)  # fmt: skip
            sleep(wait)
    raise AssertionError("unreachable")


def read_retrying(read: Callable[[], Iterator], url: str, opts: RemoteOptions, sleep=time.sleep) -> Iterator:
    """The items of ``read()`` (a fresh iterator over ``url`` per call), a transient error retried
    with backoff: the next attempt skips the items already given, so none is repeated or missed."""
    given, attempt = 0, 0
    while True:
        try:
            for n, item in enumerate(read()):
                if n < given:
                    continue
                given += 1
                yield item
            return
        except Exception as e:
            if attempt >= opts.retries or not transient(e, url):
                raise
            wait = opts.backoff_s * 2**attempt
            attempt += 1
            log.warning("reading %s failed after %d samples (%s): retrying in %.1f s (%d of %d)", url, given,
                        describe_error(e), wait, attempt, opts.retries)  # fmt: skip
            sleep(wait)


__all__ = ["PIPE", "RemoteOptions", "check_scheme", "check_urls", "cut_short", "describe_error", "expand", "is_local",
           "local_copy", "name_of", "open_file", "open_random", "open_stream", "read_retrying", "retrying",
           "scheme", "transient"]
