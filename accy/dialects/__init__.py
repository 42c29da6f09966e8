"""The dialects of accy, one module per stage product.

Importing this package registers every op class with the choir registry, so
the parser and the wire decoder build declared ops.
"""

from __future__ import annotations

from accy.dialects import dispatch, kernel, prim, semantic  # noqa: F401  (register ops)
