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
