"""The dialects of accy, one module per stage product.

Importing this package registers every op class with the choir registry, so
the parser and the wire decoder build declared ops.
"""

from __future__ import annotations

import importlib

for _name in ("semantic", "prim", "dispatch", "kernel"):
    try:
        importlib.import_module(f"accy.dialects.{_name}")
    except ModuleNotFoundError as _e:  # pragma: no cover - a dialect still being written
        if _e.name != f"accy.dialects.{_name}":
            raise
