"""A self-contained HTML report of one batch: the ``/accy/stages`` figures, offline.

:func:`write_html_report` takes either the scheduler plugin's snapshot
(``client.scheduler.accy_stages()``, which has the cluster's task timeline) or
the batch's own data — a JSON report ``{"variants": [...], ...}`` or a list of
variant dicts — when no scheduler plugin recorded it. The figures are the
page's (:mod:`accy.dashboard.figures`); BokehJS is inlined, so the file opens
without a network.

Example
-------
>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "batch.html")
>>> _ = write_html_report(path, {"variants": [{"id": "a[target=host]", "status": "ok",
...     "stages": [{"stage": "contract", "key": "01", "reused": False, "elapsed_ns": 10**6}]}]})
>>> "contract" in open(path).read()
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from accy.dashboard.records import snapshot_from_variants

SNAPSHOT_KEYS = frozenset({"stages", "counts", "durations", "timeline", "slowest", "failures"})


def as_snapshot(data: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A snapshot dict from a snapshot, a batch report (``{"variants": [...]}``)
    or a list of variant dicts.

    Example
    -------
    >>> as_snapshot([])["stages"]
    []
    """
    if isinstance(data, Mapping):
        if SNAPSHOT_KEYS <= data.keys():
            return dict(data)
        if "variants" in data and not isinstance(data["variants"], Mapping):
            return snapshot_from_variants(data["variants"])
        raise ValueError("expected a stage snapshot, a batch report with a 'variants' list, "
                         f"or a list of variants; got a dict with keys {sorted(data)[:8]}")
    return snapshot_from_variants(data)


def write_html_report(path: str | os.PathLike[str],
                      data: Mapping[str, Any] | Sequence[Mapping[str, Any]],
                      title: str = "accy batch: stages") -> Path:
    """Write the stage figures of ``data`` to ``path`` as one offline HTML file.

    ``data`` is a snapshot (``accy_stages``), a batch report or a list of
    variants (see :func:`as_snapshot`). The write is atomic. Returns the path.
    """
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    from accy.dashboard.figures import StagesDashboard
    from accy.files import write_atomic

    board = StagesDashboard()
    board.update(as_snapshot(data))
    text = file_html(board.root, INLINE, title)
    path = Path(path)
    write_atomic(path, text)
    return path
