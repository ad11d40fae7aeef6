"""Helpers shared by the tests (importable from any test as ``helpers``: ``pythonpath`` in pyproject).

Errors name their norm: :func:`rel_l2` (relative L2 of the whole tensor), :func:`rel_max` (largest
absolute difference over the largest reference magnitude), :func:`rel_each` (largest element-wise
relative difference, for short sequences such as loss curves). All compute in float64.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch


def _f64(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64)
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


def rel_l2(a, b) -> float:
    """``‖a − b‖₂ / ‖b‖₂`` (``b`` the reference)."""
    a, b = _f64(a), _f64(b)
    return ((a - b).norm() / b.norm()).item()


def rel_max(a, b) -> float:
    """``max |a − b| / max |b|`` (``b`` the reference)."""
    a, b = _f64(a), _f64(b)
    return ((a - b).abs().max() / b.abs().max()).item()


def rel_each(a: Iterable[float], b: Iterable[float]) -> float:
    """``max_i |a_i − b_i| / |b_i|`` over paired values (``b`` the reference)."""
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def randomize(model: torch.nn.Module, seed: int = 0, scale: float = 0.2) -> None:
    """Every parameter replaced by ``scale`` x a standard normal draw (the init's zeros and ones hide
    layout mistakes in a conversion)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)


def assert_curves_close(got: dict[int, float], ref: dict[int, float], steps, label: str, tol: float) -> None:
    """``got`` logged exactly ``steps`` and follows ``ref`` (the one-process curve) within ``tol``
    relative at each of them."""
    assert sorted(got) == list(steps), f"{label}: logged steps {sorted(got)}"
    for s in steps:
        assert abs(got[s] - ref[s]) / abs(ref[s]) <= tol, f"{label} step {s}: {got[s]} vs one process {ref[s]}"


def take(loader: Iterable, n: int) -> list:
    """The first ``n`` batches of ``loader`` (fewer if it ends)."""
    out = []
    for b in loader:
        out.append(b)
        if len(out) == n:
            break
    return out


def assert_same_batch(a: dict, b: dict, keys=("image", "label", "index", "crop", "flip")) -> None:
    """Two loader batches hold equal tensors under ``keys``."""
    for k in keys:
        assert torch.equal(a[k], b[k]), k


@contextlib.contextmanager
def no_hang(seconds: float) -> Iterator[None]:
    """Fail (``TimeoutError``, which the CLI reports as one line and a non-zero exit) instead of hanging:
    SIGALRM interrupts Python code and a blocking call alike (PEP 475). Main thread only."""

    def fail(*_):
        raise TimeoutError(f"hung: still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fail)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def hub_cache(root: Path, repo: str, files: Path) -> Path:
    """The Hugging Face cache layout (https://huggingface.co/docs/huggingface_hub/guides/manage-cache):
    ``models--org--name/blobs/<sha256>``, ``snapshots/<commit>/<file>`` linked to its blob, ``refs/main``."""
    folder = root / ("models--" + repo.replace("/", "--"))
    commit = hashlib.sha1(repo.encode()).hexdigest()
    snap = folder / "snapshots" / commit
    (folder / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in files.iterdir():
        data = f.read_bytes()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    return root


def read_metrics(run: Path | str) -> list[dict]:
    """Every record of a run folder's ``metrics.jsonl``, in order."""
    lines = (Path(run) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def read_losses(run: Path | str) -> dict[int, float]:
    """``{step: loss}`` of a run folder's training records (the records that have a loss)."""
    return {r["step"]: r["loss"] for r in read_metrics(run) if "loss" in r}


def two_rank_curves(fn, *args, timeout: float = 240.0) -> dict[str, list[float]]:
    """``fn(*args)`` (``{label: per-step global-mean losses}``) on 2 gloo processes, launched by
    ``tests/distributed/_launch.py``; both ranks must log the same curves. Returns rank 0's."""
    # tests/distributed/_launch.py: on the path of the distributed tests that call this
    from _launch import run_distributed

    out = run_distributed(fn, 2, *args, timeout=timeout)
    assert out[0] == out[1], "both ranks must log the same global-mean loss"
    return out[0]


def assert_follow_one_process(curves: dict[str, list[float]], one, tol: float = 2e-4) -> None:
    """Every curve of ``curves`` follows the one-process curve (``one``: a list, or ``label -> list``) within
    ``tol`` by :func:`rel_each`, and that curve moves (training happens), so agreement is not trivial."""
    for label, got in curves.items():
        ref = one(label) if callable(one) else one
        assert abs(ref[-1] - ref[0]) > 1e-3, f"{label}: the one-process curve {ref} does not move"
        assert len(got) == len(ref) and rel_each(got, ref) <= tol, f"{label}: {got} vs one process {ref}"


# A tiny digits_vit run: one block of width 16, batches of 16, no evaluation, in this process.
TINY_RUN = ["model.num_layers=1", "model.hidden_size=16", "train.batch_size=16", "data.num_workers=0", "log.flops=false",
            "eval.every=0"]  # fmt: skip


def tiny_run(out: Path, *overrides: str, recipe: str = "digits_vit") -> Path:
    """``vitscale train RECIPE train.output_dir=OUT`` with :data:`TINY_RUN` and ``overrides`` (later ones
    win) through the CLI's entry point in this process; asserts it exits 0 and returns ``out``."""
    from vitscale.cli import main

    assert main(["train", recipe, f"train.output_dir={out}", *TINY_RUN, *overrides]) == 0
    return Path(out)


__all__ = ["assert_curves_close", "assert_follow_one_process", "assert_same_batch", "hub_cache", "no_hang", "randomize", "take", "read_losses", "tiny_run", "TINY_RUN", "read_metrics", "rel_each", "rel_l2", "rel_max", "two_rank_curves"]


def doc_commands(doc: Path, heading: str) -> list[list[str]]:
    """The first ``bash`` block after ``heading`` in the Markdown file ``doc``, one command a line
    (comment lines left out): what a user copies from the docs, for a test to run as written."""
    import re
    import shlex

    text = doc.read_text()
    block = re.search(r"```bash\n(.*?)```", text[text.index(heading):], re.S).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def photo_jpeg(a: np.ndarray, k: int) -> bytes:
    """A 420x320 JPEG crop ``k`` of the photo ``a`` (scikit-learn's sample photos): a real photo file."""
    from io import BytesIO

    from PIL import Image

    y, x = (k * 23) % 100, (k * 41) % 200
    buf = BytesIO()
    Image.fromarray(a[y:y + 320, x:x + 420]).save(buf, format="JPEG", quality=90)  # fmt: skip
    return buf.getvalue()
