"""How a script of this folder writes a file it generates from the code (``docs/recipes.md``,
``vitscale/models/zoo.json``), or, with ``--check``, says whether the file is current (the tests run
that): one command line for each."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_or_check(out: Path, render: Callable[[], str], script: str, doc: str, what: str) -> int:
    """The ``main`` of ``script`` (``scripts/make_zoo.py``): write ``render()`` to ``out``, or with
    ``--check`` exit 1 when ``out`` differs from it. ``doc``: the script's docstring (its first
    paragraph is the help); ``what``: what the file is generated from, for the help of ``--check``."""
    rel = out.relative_to(ROOT)
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help=f"exit 1 if {rel} is not what {what} give")
    args = ap.parse_args()
    text = render()
    if args.check:
        if not out.is_file() or out.read_text() != text:
            print(f"{rel} is out of date: run python {script}", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(f"wrote {rel} ({len(text.splitlines())} lines)")
    return 0
