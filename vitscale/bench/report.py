"""Provenance of a benchmark result (the commit, the device's short name for result file names) and
writing it as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..tools.env import git_commit

# Device-name fragments -> the short name used in result file names (first hit wins).
_SLUGS = (
    "gb200",
    "b200",
    "gh200",
    "h200",
    "h100",
    "h800",
    "a100",
    "a800",
    "l40s",
    "l40",
    "l4",
    "a10g",
    "a10",
    "4090",
    "v100",
)


def device_slug(device: str | torch.device) -> str:
    """``cpu``, or a GPU's short name from its device name (``h100``, ``h200``, ``a100``, ...)."""
    device = torch.device(device) if not isinstance(device, torch.device) else device
    if device.type != "cuda":
        return device.type
    name = torch.cuda.get_device_name(device).lower()
    for slug in _SLUGS:
        if slug in name:
            return slug
    return "".join(c for c in name.replace("nvidia", "") if c.isalnum()) or "cuda"


def write_json(result: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


__all__ = ["device_slug", "git_commit", "write_json"]
