"""What runs a shell command when vitscale reads it: a ``pipe:`` data path (webdataset's and
open_clip's convention, ``pipe:aws s3 cp s3://bucket/x.tar -``), and the command-line flag that lets the
ones a config file holds run (docs/trust.md, "No command runs from a file"). A leaf: the config loader
(which refuses such a value read from a file), the data layer (which runs it) and the commands (which
offer the flag) all import it.
"""

from __future__ import annotations

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


__all__ = ["PIPE", "SHELL_FLAG", "runs_shell", "scheme"]
