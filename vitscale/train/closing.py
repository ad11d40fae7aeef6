"""Closing a writer can never hang the end of a run: TensorBoard's event writer, a tracker's upload
(W&B, MLflow) each get a bounded time, in a daemon thread; past it the writer is abandoned with a line
saying so, and the run ends (its own files — metrics.jsonl, summary.json, checkpoints — are complete
before any writer is closed). A Ctrl-C once hung closing the TensorBoard writer this way."""

from __future__ import annotations

import threading

CLOSE_TIMEOUT_S = 30.0


def bounded(fn, what: str, info, seconds: float = CLOSE_TIMEOUT_S) -> bool:
    """Run ``fn()`` for at most ``seconds``; True when it finished. An error is one line through ``info``."""
    failed: list[BaseException] = []

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported below, never raised into the exit path
            failed.append(e)

    t = threading.Thread(target=run, name=f"close-{what}", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        info(f"closing {what} took more than {seconds:g} s: abandoned (it may miss its last records)")
        return False
    if failed:
        info(f"closing {what} failed ({type(failed[0]).__name__}: {str(failed[0])[:200]})")
    return not failed


__all__ = ["CLOSE_TIMEOUT_S", "bounded"]
