"""Shared test setup: nothing a test run writes lands in the user's home or in the checkout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    # the measured CPU matmul peak (MFU on CPU) is cached here instead of ~/.cache/vitscale
    monkeypatch.setenv("VITSCALE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "vitscale_cache"))


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """One finished tiny digits_vit run (``helpers.tiny_run``), shared by the tests that only read it or
    work on a copy: 2 steps, its checkpoint at step 2, model.safetensors, config.yaml, metrics.jsonl,
    train.log, summary.json, report.html. Never write into it: copy it (``shutil.copytree``) first."""
    from helpers import tiny_run

    return tiny_run(tmp_path_factory.mktemp("finished") / "run", "train.max_steps=2", "checkpoint.every=2",
                    "log.progress=plain", "log.report=true")  # fmt: skip


# ------------------------------------------------------------------ data where it lives (issue 21)
# Real servers started by the tests: a localhost HTTP server (with a few faulty paths) and moto's
# standalone S3 server; the data: the digits as an image folder, WebDataset shards and Parquet files.


@pytest.fixture(scope="session")
def digits_data(tmp_path_factory):
    """``{root}/folder/{train,val}/<class>/*.png`` (8x8), ``{root}/wds/{train,val}/*.tar`` (train: 3
    shards of at most 500) and ``{root}/parquet/{train,val}/*.parquet``, all in the image folder's order,
    and ``{root}/shuffled/{train,val}/*.parquet`` as ``vitscale data convert`` writes them by default."""
    from vitscale.cli import main

    root = tmp_path_factory.mktemp("digits_data")
    assert main(["data", "digits", str(root / "folder"), "--size", "8"]) == 0
    for split in ("train", "val"):
        src = str(root / "folder" / split)
        in_order = ["--no-shuffle"]
        assert main(["data", "convert", src, str(root / "wds" / split), "--to", "webdataset", "--max-count", "500",
                     *in_order]) == 0  # fmt: skip
        assert main(["data", "convert", src, str(root / "parquet" / split), "--to", "parquet", *in_order]) == 0
        assert main(["data", "convert", src, str(root / "shuffled" / split), "--to", "parquet"]) == 0
    return root


@pytest.fixture(scope="session")
def local_server():
    """``local_server(handler) -> base URL``: a localhost ``http.server`` for an ``http.server`` request
    handler class, a thread per request (a client that stops reading early is no error here); every one
    started is stopped at the end of the session."""
    import http.server
    import threading

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            pass

    servers = []

    def serve(handler) -> str:
        srv = Server(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield serve
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.fixture(scope="session")
def http_serve(local_server):
    """``http_serve(folder) -> base URL``: a :func:`local_server` for ``folder``, except that paths with
    ``forbidden`` answer 403 and paths with ``slow`` send the headers and 2 KB of the file, then stall
    for 30 s."""
    import functools
    import http.server
    import time

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            if "forbidden" in self.path:
                self.send_error(403)
                return
            if "slow" in self.path:
                path = self.translate_path(self.path)
                data = open(path, "rb").read()  # noqa: SIM115 - a test server
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[:2048])
                self.wfile.flush()
                time.sleep(30)
                return
            super().do_GET()

        def log_message(self, *args):
            pass

    return lambda folder: local_server(functools.partial(Handler, directory=str(folder)))


@pytest.fixture(scope="session")
def s3_server():
    """moto's standalone S3 server on localhost: ``(endpoint URL, environment for s3fs)``."""
    from moto.server import ThreadedMotoServer

    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}  # fmt: skip
    yield env["AWS_ENDPOINT_URL"], env
    srv.stop()


def _made_by_tools(name: str) -> bool:
    """Folders that Python, pytest, ruff and `make` (the venvs, the editable install) write into a
    checkout: not the tests' doing."""
    return name in (".git", "__pycache__", ".pytest_cache", ".ruff_cache") or name.startswith(".venv") or name.endswith(".egg-info")


def _tree(root: Path) -> dict[str, tuple[int, int] | None]:
    """Every folder (None) and file ((size, mtime)) under ``root``, but :func:`_made_by_tools`."""
    seen: dict[str, tuple[int, int] | None] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not _made_by_tools(d)]
        rel = os.path.relpath(folder, root)
        seen[rel + "/"] = None
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:  # removed while we walked
                continue
            seen[os.path.join(rel, name)] = (st.st_size, st.st_mtime_ns)
    return seen


@pytest.fixture(scope="session", autouse=True)
def _checkout_unchanged():
    """Tests write only under their own temporary folders: the session fails (an error at the teardown of
    its last test) when the checkout has new, changed or removed files or folders afterwards — a run
    folder made from a default ``train.output_dir``, a report written into the current folder."""
    before = _tree(REPO)
    yield
    after = _tree(REPO)
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p, 0) != after.get(p, 0))
    if changed:
        shown = ", ".join(("+" if p not in before else "-" if p not in after else "~") + p for p in changed[:10])
        more = f" and {len(changed) - 10} more" if len(changed) > 10 else ""
        pytest.fail(f"the tests changed the checkout {REPO} (+ new, - removed, ~ changed): {shown}{more}; a test "
                    "must write only under its tmp_path", pytrace=False)  # fmt: skip


# ------------------------------------------------------------------ the order the tests run in
def pytest_collection_modifyitems(config, items):
    """The long tests first (``slow`` and ``multiprocess``, as marked), the rest in their order.

    make test runs pytest-xdist with ``--dist worksteal``: each worker starts with a share of the list
    and one that runs out takes queued tests from the other. A long test that comes last keeps one
    worker busy while the other waits; one that comes first overlaps with the many short ones.
    Longest-first ordering (Graham, "Bounds on multiprocessing timing anomalies", 1969) is what this
    approximates. (Without work stealing, xdist's ``load`` scheduling leaves each worker the tests it
    was first dealt, and one worker would run most of the long ones alone.)"""
    items.sort(key=lambda item: 0 if item.get_closest_marker("slow") or item.get_closest_marker("multiprocess") else 1)
