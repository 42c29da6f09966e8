"""Local files written atomically: a reader never sees half a file.

The artifact store (:mod:`accy.store`) has its own fsspec-aware version; this
is for reports, reproducers, sources and loaded libraries on the local disk.

Example
-------
>>> import tempfile, os
>>> p = os.path.join(tempfile.mkdtemp(), "a", "x.txt")
>>> write_atomic(p, "hello") == p, open(p).read()
(True, 'hello')
"""

from __future__ import annotations

import os
import tempfile
from typing import Any


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> str:
    """Write ``data`` to ``path`` through a temporary name in the same folder, then rename.

    Missing parent folders are created. Returns ``path`` as a string.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def jsonable(value: Any) -> Any:
    """``value`` with every tuple turned into a list, recursively.

    Dask's comms decode msgpack arrays as tuples, so what arrives at a
    handler (and what a client gets back) has tuples where the sender had lists.
    """
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    return value
