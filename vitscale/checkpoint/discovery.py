"""Finding checkpoints and checking them before use: the step folders of a run, the newest *intact*
one (every file verified against its checksum, the ranks sharing the work; a damaged one skipped with
a warning naming the file), and the refusal of the previous format (DCP's pickled ``.metadata``)."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from .collective import all_lines, rank_world
from .integrity import CheckpointError
from .storage import INDEX, verify

STEP_RE = re.compile(r"^step_(\d+)$")
log = logging.getLogger("vitscale.checkpoint")


def legacy_error(path: Path) -> CheckpointError:
    """An old-format checkpoint is never read (its index is a pickle): one line saying what to do."""
    return CheckpointError(
        f"{path} is in vitscale's old checkpoint format (a pickled DCP .metadata, which can run code when read) and is "
        f"not read: start a new train.output_dir, or for a checkpoint you made yourself, export its weights with the "
        f"vitscale that wrote it (vitscale convert {path} model.safetensors) and start from checkpoint.init_from=model.safetensors"
    )


def is_legacy(path: Path) -> bool:
    return (path / ".metadata").is_file() and not (path / INDEX).exists()


def is_step_folder(p: Path) -> bool:
    return (p / INDEX).is_file() or (p / ".metadata").is_file()


def damaged(problems: list[str]) -> CheckpointError:
    """The one-line error of a checkpoint whose files failed :func:`verify`."""
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return CheckpointError(f"damaged checkpoint: {problems[0]}{more}")


def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """Step folders under ``root`` as (step, path), oldest first (intact or not: see :func:`verify`)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_RE.match(p.name)) and p.is_dir()]
    return sorted(found)


def newest_intact(found: list[tuple[int, Path]], root: Path, *, keys=None, need=(), collective: bool) -> tuple[Path, dict]:
    """The newest checkpoint of ``found`` whose files all verify; damaged ones are skipped with a
    warning; raises a one-line :class:`CheckpointError` when none is intact. ``collective``: every
    rank calls it and checksums its share of the files."""
    rank, world = rank_world() if collective else (0, 1)
    bad: list[str] = []
    for _, path in reversed(found):
        if path.is_symlink():  # docs/trust.md, "Symbolic links": a run folder's checkpoints are its own
            idx, problems = None, [f"{path}: is a symbolic link (to {os.readlink(path)}); a run's step folders are its own"]
        elif is_legacy(path):
            raise legacy_error(path)
        else:
            idx, problems = verify(path, keys=keys, share=(rank, world), need=need)
        if collective:
            problems = all_lines(problems)
        if not problems:
            return path, idx
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        if rank == 0:
            log.warning("skipping damaged checkpoint %s: %s%s", path.name, problems[0], more)
        bad.append(problems[0] + more)
    raise CheckpointError(f"no intact checkpoint in {root}: " + "; ".join(bad))


def find_checkpoint(path: str | os.PathLike, keys: set[str] | None = None) -> tuple[Path, dict]:
    """(step folder, verified index) from a step folder, a ``checkpoints/`` folder or a run folder
    (its newest intact checkpoint). One process; only the files holding ``keys`` are checksummed."""
    p = Path(path)
    if is_step_folder(p):
        if is_legacy(p):
            raise legacy_error(p)
        idx, problems = verify(p, keys=keys)
        if problems:
            raise damaged(problems)
        return p, idx
    for root in (p, p / "checkpoints"):
        if root != p and root.is_symlink():  # inside a run folder nothing is followed (docs/trust.md)
            raise CheckpointError(f"{root} is a symbolic link (to {os.readlink(root)}); a run's checkpoints/ is a folder of its own")
        found = list_checkpoints(root)
        if found:
            return newest_intact(found, root, keys=keys, collective=False)
    raise FileNotFoundError(f"no checkpoint at {str(path)!r} (expected a step_N folder, checkpoints/ or a run folder)")


__all__ = ["STEP_RE", "damaged", "find_checkpoint", "is_legacy", "is_step_folder", "legacy_error", "list_checkpoints", "newest_intact"]
