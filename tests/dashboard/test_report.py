"""The self-contained HTML report of one batch."""

from __future__ import annotations

import json
import re

import pytest

from accy.dashboard.records import StageRecords
from accy.dashboard.report import as_snapshot, write_html_report

VARIANTS = [
    {"id": f"layernorm[target=host,arg0={n}x{n}]", "program": "layernorm",
     "status": "ok", "elapsed_ns": n * 10_000,
     "stages": [{"stage": s, "key": f"{i:02x}{n:04x}", "reused": i < 2 and n > 64,
                 "elapsed_ns": n * 1000 * (i + 1), "plan_fingerprint": None, "pass_stats": {}}
                for i, s in enumerate(("contract", "tensor", "dispatch", "kernel", "compile"))]}
    for n in (64, 128, 256, 512)
] + [{"id": "layernorm[target=cuda:sm_90,arg0=96x96]", "program": "layernorm",
      "status": "failed", "elapsed_ns": 5_000_000,
      "stages": [{"stage": "contract", "key": "ff", "reused": False, "elapsed_ns": 5_000_000}],
      "failure": {"pipeline": "kernel", "pass": "vectorize", "message": "width 4 needs 4 | 96x96?",
                  "reproducer": "/tmp/accy-repro/ff.mlir"}}]


def docs_json(html: str) -> dict:
    """The Bokeh document embedded in the file."""
    blocks = re.findall(r'<script type="application/json" id="[^"]+">\s*(.*?)\s*</script>',
                        html, flags=re.S)
    assert len(blocks) == 1
    (doc,) = json.loads(blocks[0]).values()
    return doc


def assert_self_contained(html: str) -> None:
    assert not re.search(r'<script[^>]+src=["\']?https?://', html)
    assert not re.search(r'<link[^>]+href=["\']?https?://', html)
    assert "Bokeh.embed.embed_items" in html
    assert len(html) > 500_000  # BokehJS itself is inlined


def test_report_from_a_batch_report(tmp_path):
    path = write_html_report(tmp_path / "out" / "batch.html",
                             {"variants": VARIANTS, "summary": {"variants": 5}})
    assert path == tmp_path / "out" / "batch.html" and path.exists()
    assert list(path.parent.iterdir()) == [path]  # written atomically: no temporary left
    html = path.read_text()
    assert_self_contained(html)
    doc = json.dumps(docs_json(html))
    for text in ("layernorm[target=host,arg0=512x512]", "vectorize", "/tmp/accy-repro/ff.mlir",
                 "Slowest variants", "Reuse and miss rate", "Stage durations from receipts",
                 "no cluster tasks recorded"):
        assert text in doc
    assert "<title>accy batch: stages</title>" in html


def test_report_from_a_snapshot_has_the_timeline(tmp_path):
    records = StageRecords(maxlen=100)
    for i, stage in enumerate(("contract", "tensor", "kernel")):
        records.transition((f"accy_{stage}", f"{i:032x}"), "processing", "memory",
                           worker="tcp://10.1.2.3:4567", thread=1,
                           startstops=[{"action": "compute", "start": 100.0 + i,
                                        "stop": 100.5 + i}])
    records.record_batch(VARIANTS)
    snapshot = json.loads(json.dumps(records.snapshot()))  # as the API or a handler returns it
    html = write_html_report(tmp_path / "snap.html", snapshot, title="nightly").read_text()
    assert_self_contained(html)
    doc = json.dumps(docs_json(html))
    assert "10.1.2.3:4567" in doc and "Stage runs per worker (last 3 tasks)" in doc
    assert "Stage durations from cluster tasks" in doc
    assert "<title>nightly</title>" in html


def test_report_from_a_list_of_variants_and_bad_input(tmp_path):
    assert as_snapshot(VARIANTS)["variants"] == {"ok": 4, "failed": 1}
    assert as_snapshot({"variants": VARIANTS})["counts"] == as_snapshot(VARIANTS)["counts"]
    snapshot = as_snapshot(VARIANTS)
    assert as_snapshot(snapshot) == snapshot  # a snapshot passes through
    write_html_report(tmp_path / "list.html", VARIANTS)
    with pytest.raises(ValueError, match="expected a stage snapshot"):
        write_html_report(tmp_path / "bad.html", {"entries": {}})
    assert not (tmp_path / "bad.html").exists()
