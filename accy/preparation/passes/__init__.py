"""The passes of the six stage pipelines, one module (or package) per stage.

Importing this package registers every pass by name (for reproducers).
"""

from __future__ import annotations

from accy.preparation.passes import (  # noqa: F401  (register passes)
    contract,
    dispatch,
    kernel,
    memory,
    target,
    tensor,
)
