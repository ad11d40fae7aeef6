"""``hf-hub:org/name[@revision]``: a model repository of the Hugging Face Hub, found in the local cache
only. vitscale never downloads (it reads what ``hf download org/name`` or a timm /
open_clip ``pretrained=True`` call put there): ``huggingface_hub.snapshot_download(...,
local_files_only=True)`` resolves the cache the way the Hub's own tools do (``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub``; https://huggingface.co/docs/huggingface_hub/guides/manage-cache).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import UserError

PREFIX = "hf-hub:"
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(source: str | Path) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def resolve(source: str, setting: str = "checkpoint.init_from") -> Path:
    """The local snapshot folder of ``hf-hub:org/name[@revision]``; a one-line :class:`UserError`
    saying how to fetch it when the cache has none."""
    spec = source[len(PREFIX) :]
    repo, _, revision = spec.partition("@")
    if not _REPO.match(repo):
        raise UserError(f"{setting}={source}: expected hf-hub:ORG/NAME (or hf-hub:ORG/NAME@REVISION)")
    try:
        import huggingface_hub
    except ImportError:
        raise UserError(f"{setting}={source}: reading the Hugging Face cache needs the huggingface_hub package "
                        "(pip install 'vitscale[hub]')") from None  # fmt: skip
    try:
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # huggingface_hub < 0.24
        from huggingface_hub.utils import LocalEntryNotFoundError
    try:
        folder = huggingface_hub.snapshot_download(repo, revision=revision or None, local_files_only=True)
    except LocalEntryNotFoundError:
        cache = huggingface_hub.constants.HF_HUB_CACHE
        raise UserError(
            f"{setting}={source}: no snapshot of {repo}{'@' + revision if revision else ''} in the local Hugging Face cache "
            f"({cache}); vitscale never downloads: fetch it first with `hf download {repo}`"
            f"{' --revision ' + revision if revision else ''} (or point {setting} at a folder of its files)"
        ) from None
    return Path(folder)


__all__ = ["PREFIX", "is_hub_id", "resolve"]
