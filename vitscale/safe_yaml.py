"""YAML with limits: the one reader of every YAML a run takes in (configs, dotted overrides, a run
folder's stored ``config.yaml``), for a file that a stranger may have written.

``yaml.safe_load`` already refuses to build objects (``!!python/object`` and friends), but it still
accepts input that costs without bound *after* it is loaded: an alias bomb ("billion laughs": ten
anchors each listing the previous one ten times, a few hundred bytes) loads as a small shared graph
that every later walk (merging, comparing, printing a value with ``!r``) expands to 10^9 nodes; a
50,000-deep nest overflows the recursion of the composer. So before anything is built, the event
stream (libyaml's C parser when PyYAML has it) is read once with these limits, and anything past
them is a :class:`vitscale.errors.ConfigError` of one line naming the source and the limit:

- at most :data:`MAX_BYTES` of text;
- at most :data:`MAX_DEPTH` nested mappings / sequences;
- at most :data:`MAX_NODES` nodes once every alias is expanded (what a walk of the result visits);
- plain YAML only: no tag other than YAML's own ``str``, ``int``, ``float``, ``bool``, ``null``,
  ``seq``, ``map`` (and ``binary``/``timestamp`` are refused too: a config holds neither).

Then the text is loaded by PyYAML's safe loader. Any other YAML or value error is one line as well.
The limits are far above what a config needs (the largest built-in recipe: ~120 nodes, depth 3).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

MAX_BYTES = 1 << 20
"""Largest YAML text read (1 MiB; a run's config.yaml is a few KB)."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and sequences."""
MAX_NODES = 200_000
"""Most nodes after expanding aliases (room for a 21,841-name class list, ImageNet-21k's)."""



class YAMLLimitError(ConfigError):
    """YAML past a limit of this module, or with a tag: refused, never read some other way."""


_TAG = "tag:yaml.org,2002:"
_ALLOWED_TAGS = {_TAG + t for t in ("str", "int", "float", "bool", "null", "seq", "map")} | {"!"}
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's C parser when PyYAML was built with it


def _where(source: str, event: Any) -> str:
    mark = getattr(event, "start_mark", None)
    return f"{source} line {mark.line + 1}" if mark is not None else source


def _check_events(text: str, source: str) -> None:
    """Walk the event stream once: depth, expanded size and tags, refusing at the first excess."""
    sizes: dict[str, int] = {}  # anchor -> expanded node count of its node
    stack: list[list] = []  # open collections: [anchor, expanded size so far]
    for ev in yaml.parse(text, Loader=_LOADER):
        tag = getattr(ev, "tag", None)
        if tag is not None and tag not in _ALLOWED_TAGS:
            raise YAMLLimitError(f"{_where(source, ev)}: the tag {tag.replace(_TAG, '!!')[:60]} is not allowed (plain YAML only: "
                              f"mappings, lists, strings, numbers, true/false, null)")  # fmt: skip
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            stack.append([ev.anchor, 1])
            if len(stack) > MAX_DEPTH:
                raise YAMLLimitError(f"{_where(source, ev)}: nested more than {MAX_DEPTH} levels deep (a config is a few levels)")
            continue
        if isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, size = stack.pop()
        elif isinstance(ev, yaml.ScalarEvent):
            anchor, size = ev.anchor, 1
        elif isinstance(ev, yaml.AliasEvent):
            anchor, size = None, sizes.get(ev.anchor, 1)
        else:
            continue
        if anchor is not None:
            sizes[anchor] = size
        if stack:
            stack[-1][1] += size
        if size > MAX_NODES or (stack and stack[-1][1] > MAX_NODES):
            why = "aliases of aliases, a YAML 'billion laughs'" if sizes else "a config holds a few hundred"
            raise YAMLLimitError(f"{_where(source, ev)}: more than {MAX_NODES:,} values once aliases are expanded ({why})")


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:200] or type(e).__name__


def load_yaml(text: str | bytes, source: str = "YAML") -> Any:
    """The value of the YAML document ``text`` (``None`` when empty), within the limits of this
    module; ``source`` names it in errors (a path, or "override data.mean=...")."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"{source}: not UTF-8 text") from None
    if len(text.encode("utf-8", errors="replace")) > MAX_BYTES:
        raise YAMLLimitError(f"{source}: more than {MAX_BYTES >> 20} MiB of YAML (a config is a few KB)")
    try:
        _check_events(text, source)
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader (SafeLoader / CSafeLoader)
    except ConfigError:
        raise
    except (yaml.YAMLError, ValueError, TypeError, RecursionError, OverflowError) as e:
        raise ConfigError(f"{source}: not a valid config ({type(e).__name__}: {_one_line(e)})") from None


def read_yaml(path: str | os.PathLike) -> Any:
    """:func:`load_yaml` of a file, reading at most :data:`MAX_BYTES` + 1 bytes of it. The file must be
    a regular file (a FIFO or a device would block the read or never end)."""
    p = Path(path)
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise YAMLLimitError(f"{p}: not a regular file")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise YAMLLimitError(f"{p}: more than {MAX_BYTES >> 20} MiB of YAML (a config is a few KB)")
    return load_yaml(data, str(p))


__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "YAMLLimitError", "load_yaml", "read_yaml"]
