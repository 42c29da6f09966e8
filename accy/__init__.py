"""accy: a compiler service for tensor programs.

A program in the choir IR (MLIR generic syntax, ``semantic`` dialect) is lowered
through six stage pipelines (contract, tensor, dispatch, memory, kernel,
target) to CUDA C or host C, compiled and loaded. ``import accy`` imports
neither CuPy nor Dask.
"""

from __future__ import annotations

__version__ = "0.1.0"
