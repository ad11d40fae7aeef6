"""Shared test setup: nothing a test run writes lands in the user's home."""

import pytest


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    # the measured CPU matmul peak (MFU on CPU) is cached here instead of ~/.cache/vitscale
    monkeypatch.setenv("VITSCALE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "vitscale_cache"))
