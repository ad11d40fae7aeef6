"""Check benchmark command lines without running them: ``python -m vitscale.bench.dry_run < commands``.

Each input line is one command as ``benchmarks/run_gpu.sh`` would run it after ``$PYTHON``: either
``-m vitscale <command> ...`` or ``<script.py> ...``. Every line is run with ``--dry-run`` appended in
this one process (argument parsing, model names, overrides), so checking a whole GPU script costs
one interpreter start. Exit status 1 if any line fails.
"""

from __future__ import annotations

import runpy
import shlex
import sys


def check(line: str) -> str | None:
    """None if the command parses and its dry run passes, else the error."""
    argv = shlex.split(line) + ["--dry-run"]
    old = sys.argv
    try:
        if argv[:2] == ["-m", "vitscale"]:
            from vitscale.cli import main

            rc = main(argv[2:])
            return None if rc == 0 else f"exit status {rc}"
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            runpy.run_path(argv[0], run_name="__main__")
        return None
    except SystemExit as e:
        return None if e.code in (0, None) else f"exit status {e.code}"
    except Exception as e:  # noqa: BLE001 - report every failure, keep checking the others
        return f"{type(e).__name__}: {e}"
    finally:
        sys.argv = old


def main() -> int:
    failed = 0
    for line in sys.stdin:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        err = check(line)
        print(
            f"{'ok  ' if err is None else 'FAIL'} {line}" + ("" if err is None else f"\n     {err}"),
            flush=True,
        )
        failed += err is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
