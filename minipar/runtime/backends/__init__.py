"""Backends move data between ranks: `sim` (threads in this process) and `mpi` (processes)."""
