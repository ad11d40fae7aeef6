"""What the ranks of a checkpoint job agree on: rank and world, one all-reduce of "every rank is ok",
every rank's lines, and the root cause of a failure (of this rank or, through DCP, of another)."""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.distributed as dist


def rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_ok(ok: bool) -> bool:
    """True when every rank says ok (one all-reduce; the ranks then take the same branch)."""
    if not (dist.is_available() and dist.is_initialized()):
        return ok
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    flag = torch.tensor([0 if ok else 1], device=device)
    dist.all_reduce(flag)
    return int(flag.item()) == 0


def all_lines(lines: list[str]) -> list[str]:
    """Every rank's lines, the same list on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return lines
    gathered: list[list[str]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, list(lines))  # strings between this run's own processes
    return sorted({line for part in gathered for line in part})


def cause(e: BaseException | None) -> str:
    """The root cause of a (possibly DCP-wrapped, possibly other-rank) failure, in one line."""
    failures = getattr(e, "failures", None)  # DCP's CheckpointException: {rank: (exception, traceback)}
    if isinstance(failures, dict) and failures:
        rank, exc = sorted(failures.items(), key=lambda kv: kv[0])[0]
        e = exc[0] if isinstance(exc, tuple) else exc
        prefix = f"rank {rank}: " if len(failures) < rank_world()[1] else ""
        return prefix + cause(e)
    if e is None:
        return "another rank failed (see its error)"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror} ({e.filename})" if e.filename else e.strerror
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]


def interruption(e: BaseException | None) -> BaseException | None:
    """The interruption inside a (possibly DCP-wrapped) failure of this rank — Ctrl-C, or a signal
    turned into an exception (:mod:`vitscale.signals`): anything that is not an ``Exception`` —
    to be raised as it is, not reported as a failed save. None when there is none."""
    failures = getattr(e, "failures", None)  # DCP's CheckpointException wraps what its steps raised
    if isinstance(failures, dict):
        for exc in failures.values():
            found = interruption(exc[0] if isinstance(exc, tuple) else exc)
            if found is not None:
                return found
        return None
    return e if e is not None and not isinstance(e, Exception) and type(e).__name__ != "CheckpointException" else None


@contextlib.contextmanager
def quiet():
    """DCP warns on every single-process save/load that it assumes a single process: it is intended."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is (disabled|unavailable)")
        yield


__all__ = ["all_lines", "all_ok", "barrier", "cause", "interruption", "quiet", "rank_world"]
