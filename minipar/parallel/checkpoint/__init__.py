"""Checkpoints of a parallel training run: each rank writes what it holds; any layout loads it."""

from .dp import load, read_full_state, save_consolidated, save_sharded

__all__ = ["load", "read_full_state", "save_consolidated", "save_sharded"]
