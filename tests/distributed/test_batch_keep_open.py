"""`accy batch --keep-open` and `--html`: the dashboard line comes first, the report before the wait."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_keep_open_prints_the_dashboard_first_and_writes_the_report_before_waiting(tmp_path):  # type: ignore[no-untyped-def]
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"programs: [{ROOT}/graphs/softmax.mlir]\nshapes: [{{arg0: 8x256}}]\n")
    report, html = tmp_path / "r.json", tmp_path / "r.html"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "accy", "batch", str(sweep), "--workers", "1", "--no-progress",
         "--cache", str(tmp_path / "store"), "--report", str(report), "--html", str(html),
         "--keep-open", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=env)
    try:
        first = proc.stdout.readline()  # type: ignore[union-attr]
        assert first.startswith("dashboard: http"), first
        deadline = time.monotonic() + 90
        while not (report.exists() and html.exists()):
            assert proc.poll() is None, "accy batch exited before writing its report"
            assert time.monotonic() < deadline, "no report within 90 s"
            time.sleep(0.2)
        time.sleep(0.5)
        assert proc.poll() is None, "--keep-open should still be waiting"
        data = json.loads(report.read_text())
        assert data["summary"]["variants"] == 1 and data["variants"][0]["status"] == "ok"
        page = html.read_text()
        assert "<html" in page.lower()
        assert not re.search(r"<script[^>]*\ssrc=", page), "the HTML report loads a script"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_an_unreachable_scheduler_is_one_error_line() -> None:
    sweep = os.path.join(ROOT, "graphs", "sweeps", "quickstart.yaml")
    proc = subprocess.run([sys.executable, "-m", "accy", "batch", sweep, "--scheduler",
                           "tcp://127.0.0.1:9", "--no-progress"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error: cannot reach the Dask scheduler")
    assert "Traceback" not in proc.stderr
