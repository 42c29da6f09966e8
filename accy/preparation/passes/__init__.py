"""The passes of the six stage pipelines, one module (or package) per stage.

Importing this package registers every pass by name (for reproducers).
"""

from __future__ import annotations

import importlib

for _stage in ("contract", "tensor", "dispatch", "memory", "kernel", "target"):
    try:
        importlib.import_module(f"accy.preparation.passes.{_stage}")
    except ModuleNotFoundError as _e:  # a stage still being written
        if _e.name != f"accy.preparation.passes.{_stage}":
            raise
