"""What runs a shell command when vitscale reads it: a ``pipe:`` data path (webdataset's and
open_clip's convention, ``pipe:aws s3 cp s3://bucket/x.tar -``), and the command-line flag that lets the
ones a config file holds run (docs/trust.md, "No command runs from a file"). A leaf: the config loader
(which refuses such a value read from a file), the data layer (which runs it) and the commands (which
offer the flag) all import it.
"""

from __future__ import annotations

from typing import Any

PIPE = "pipe:"
"""The prefix of a data path whose bytes are a shell command's standard output."""

SHELL_FLAG = "--allow-shell-from-config"
"""Lets the ``pipe:`` data paths of a config file run (``vitscale.config.load_config(allow_shell=True)``);
without it such a value is refused unless given on the command line (docs/trust.md)."""


def scheme(url: str) -> str:
    """``pipe``, ``file`` (a local path or ``file://``) or the fsspec protocol (``s3``, ``https``, ...)."""
    if url.startswith(PIPE):
        return "pipe"
    if "://" not in url:
        return "file"
    return url.split("://", 1)[0].lower()


def runs_shell(spec: str) -> bool:
    """Whether reading ``spec`` (a ``data.train_path`` / ``data.val_path``) runs a shell command: one
    of its parts (joined with ``::``, brace patterns expanded as :func:`expand` expands them) is a
    ``pipe:`` command. ``vitscale.config.load_config`` refuses such a value read from a file."""
    for part in str(spec).split("::"):
        if "{" not in part:
            if scheme(part) == "pipe":
                return True
            continue
        from braceexpand import braceexpand  # lazily: a long pattern is walked, never held

        if any(scheme(item) == "pipe" for item in braceexpand(part)):
            return True
    return False


__all__ = ["PIPE", "SHELL_FLAG", "runs_shell", "scheme", "shell_value"]


_UNSET = object()


def shell_value(tree: Any, given: Any = _UNSET, key: str = "") -> tuple[str, str] | None:
    """``(dotted key, value)`` of the first value of ``tree`` (a config file's) that runs a shell
    command (``vitscale.shell.runs_shell``) and that ``given`` (the command line's overrides, the
    same shape) does not replace; None when there is none."""
    if key and given is not _UNSET and not isinstance(given, dict):
        return None  # the command line sets this value (or a mapping above it): the file's is not used
    found = None
    if isinstance(tree, dict):
        for k, v in tree.items():
            found = found or shell_value(v, given.get(k, _UNSET) if isinstance(given, dict) else _UNSET, f"{key}.{k}" if key else str(k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            found = found or shell_value(v, _UNSET, f"{key}[{i}]")
    elif isinstance(tree, str):
        found = (key, tree) if runs_shell(tree) else None
    return found
