"""No partial checkpoint left behind: a save interrupted by an exception *or a signal* (Ctrl-C, the
SIGTERM a scheduler sends, which vitscale turns into an exception: :mod:`vitscale.signals`) removes
its ``.tmp-step_…`` folder on the way out, and the leftovers of a process killed outright (SIGKILL,
a lost node: no code runs) are removed by the next run of the folder before it looks for
checkpoints. A partial folder never has a step folder's name, so it is never resumed from either way."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from .collective import rank_world

TMP_PREFIX = ".tmp-step_"


def remove_leftovers(root: str | os.PathLike) -> None:
    """Rank 0 removes the ``.tmp-step_…`` folders under ``root`` (the run folder is locked by this run,
    so none of them is being written)."""
    root = Path(root)
    if rank_world()[0] != 0 or not root.is_dir():
        return
    for p in root.iterdir():
        if p.name.startswith(TMP_PREFIX):
            if p.is_symlink() or not p.is_dir():
                p.unlink(missing_ok=True)
            else:
                shutil.rmtree(p, ignore_errors=True)


@contextlib.contextmanager
def removed_on_failure(path: Path | None):
    """Remove the folder ``path`` (None: nothing) when the block raises anything — an error, Ctrl-C,
    a signal turned into an exception — and let it go on up."""
    try:
        yield
    except BaseException:
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
        raise


__all__ = ["TMP_PREFIX", "remove_leftovers", "removed_on_failure"]
