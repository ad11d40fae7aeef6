"""How a job ran: vitscale version and git commit, torch / CUDA, devices, layout, host and command line.

Recorded in a run's ``summary.json`` (``env``) and shown by its report; ``vitscale bench`` records the
commit the same way. Every field is best effort: without git, a GPU or a torchrun launcher the field
is None or left out, never an error.
"""

from __future__ import annotations

import os
import platform
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def git_commit() -> str | None:
    """The commit of the vitscale checkout this code runs from (``+dirty`` when tracked files under
    ``vitscale/`` differ from it); None when vitscale is not running from a git checkout of its own
    (an installed package, even one inside some other repository) or git is missing."""
    root = Path(__file__).resolve().parents[2]
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True,
                             timeout=10)  # fmt: skip
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root:
            return None
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "vitscale"], cwd=root, capture_output=True,
                               timeout=30)  # fmt: skip
        return sha.stdout.strip() + ("+dirty" if dirty.returncode == 1 else "")
    except (OSError, subprocess.SubprocessError):
        return None


def command_line(argv: list[str] | None = None) -> str:
    """The command as a person would type it again: ``vitscale train digits_vit ...`` (the console
    script, or ``vitscale.cli.main`` called with arguments), ``python -m vitscale ...`` (``-m``, also
    what torchrun starts on every rank)."""
    from vitscale.cli import invoked_argv  # set while vitscale.cli.main(argv) runs

    called = invoked_argv()
    argv = list(argv if argv is not None else called if called is not None else sys.argv)
    if not argv:
        return ""
    first = Path(argv[0])
    if first.name == "__main__.py" and first.parent.name == "vitscale":
        head = ["python", "-m", "vitscale"]
    elif first.name in ("vitscale", "vitscale.exe"):
        head = ["vitscale"]
    else:
        head = [argv[0]]
    return shlex.join(head + argv[1:])


def environment(device: torch.device | None = None, layout: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record of where and how this process runs (for ``summary.json``'s ``env``)."""
    import torch

    from vitscale.version import __version__

    from .mfu import _cpu_name

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    env: dict[str, Any] = {
        "vitscale": __version__,
        "git_commit": git_commit(),
        "command": command_line(),
        "cwd": os.getcwd(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": str(device) if device is not None else None,
        "gpu_count": len(gpus),
        "gpus": gpus,
        "cpu": _cpu_name(),
        "cpu_threads": torch.get_num_threads(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
    }
    if layout is not None:
        env["layout"] = layout
    return env


__all__ = ["command_line", "environment", "git_commit"]
