"""Checkpoints: DCP save/load through safetensors + JSON (nothing unpickled), checksummed, atomic,
last K kept, newest intact resumed; checksummed safetensors exports."""

from .checkpointer import (
    Checkpointer,
    SaveError,
    find_checkpoint,
    list_checkpoints,
    read_tensor_metadata,
    read_weights,
    resolve_checkpoint,
)
from .integrity import CheckpointError, CorruptFile

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "CorruptFile",
    "SaveError",
    "find_checkpoint",
    "list_checkpoints",
    "read_tensor_metadata",
    "read_weights",
    "resolve_checkpoint",
]
