"""What a checkpoint file raises when it cannot be written or read as asked."""

from __future__ import annotations

from ..runtime.errors import MiniparError


class CheckpointError(MiniparError, ValueError):
    """A checkpoint cannot be written or read as asked: names the file and the array."""


class PickledCheckpointError(CheckpointError):
    """A checkpoint file would need a pickle to load; minipar never unpickles."""
