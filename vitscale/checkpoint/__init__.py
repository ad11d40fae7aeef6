"""Checkpoints: DCP save/load (atomic, last K, safe metadata reading), safetensors export."""

from .checkpointer import (
    Checkpointer,
    SafeFileSystemReader,
    dcp_load,
    list_checkpoints,
    read_tensor_metadata,
    resolve_checkpoint,
    safe_load_metadata,
)

__all__ = [
    "Checkpointer",
    "SafeFileSystemReader",
    "dcp_load",
    "list_checkpoints",
    "read_tensor_metadata",
    "resolve_checkpoint",
    "safe_load_metadata",
]
