"""A refusal under the real torchrun, two CPU ranks (issue 49, the README walk): each rank printed the
same line (for ``vitscale eval`` of an unknown config, 600 characters listing every built-in one) and
torchrun's own traceback came after them. Now rank 0 prints it once, every rank exits with code 2, and
torchrun's report names it as the root cause, at its end (``vitscale.launcher``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _launch import free_port

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _torchrun(*argv: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                             str(free_port()), "-m", "vitscale", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip


def test_a_refusal_under_torchrun_is_said_once_by_rank_0():
    """The walk's line: ``torchrun --nproc-per-node 2 -m vitscale eval no_such_config`` (``train`` and
    argparse's refusals take the same path: tests/unit/test_launcher.py, with the launcher's store)."""
    said = "vitscale eval: no config file or built-in config named 'no_such_config'"
    p = _torchrun("eval", "no_such_config")
    log, _ = p.communicate(timeout=240)
    assert p.returncode != 0, log[-3000:]
    printed = [line for line in log.splitlines() if line.startswith("vitscale eval")]
    assert len(printed) == 1 and printed[0].startswith(said), log[-3000:]  # once: no "(rank 1)" copy
    assert "digits_vit" in printed[0]  # the whole line: every built-in config listed
    exits = re.findall(r"^\s+exitcode\s*:\s*(-?\d+)", log, re.MULTILINE)  # the report's entries
    assert exits == ["2", "2"], log[-3000:]  # both ranks: 2, none stopped by a signal
    root = log[log.index("Root Cause"):]
    assert "rank      : 0" in root and said in root, root  # the root cause: rank 0, the refusal
