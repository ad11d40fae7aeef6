"""Checkpoints: DCP save/load through safetensors + JSON (nothing unpickled), checksummed, atomic,
last K kept, newest intact resumed; checksummed safetensors exports.

One module per job: ``checkpointer.py`` (saving and loading step folders), ``discovery.py`` (finding
them, the newest intact one), ``state.py`` (what a checkpoint holds), ``weights.py`` (model weights in
and out), ``storage.py`` (the file format) and ``integrity.py`` (checksums, guarded file access)."""

from .checkpointer import Checkpointer
from .discovery import find_checkpoint, list_checkpoints
from .integrity import CheckpointError, CorruptFile
from .state import NonFiniteWeights
from .weights import SaveError, export_safetensors, load_model_weights, read_weights, write_weights

__all__ = [
    "CheckpointError", "Checkpointer", "CorruptFile", "NonFiniteWeights", "SaveError", "export_safetensors",
    "find_checkpoint", "list_checkpoints", "load_model_weights", "read_weights", "write_weights",
]  # fmt: skip
