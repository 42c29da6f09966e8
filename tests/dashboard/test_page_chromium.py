"""/accy/stages in a real browser: headless Chromium renders the page's Bokeh plots.

Chromium's one-shot modes (``--screenshot``, ``--dump-dom`` with
``--virtual-time-budget``) capture a Bokeh *server* page before its document
arrives over the websocket (virtual time does not wait for websocket
messages), so the live page is driven through the DevTools protocol instead:
navigate, wait until the plots have drawn, read the DOM (Bokeh renders into
shadow roots, which ``--dump-dom`` does not show), collect JavaScript errors,
and take the screenshot. The static HTML report needs no websocket, so it is
checked with the one-shot ``--screenshot``.

Set ``ACCY_DASHBOARD_SCREENSHOT=docs/dashboard.png`` to also save a screenshot
of the page with about 30 variants (the one in the docs).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

import accy.distributed as ad
from accy.dashboard.report import write_html_report

sys.path.insert(0, str(Path(__file__).parent))
from fake_batch import fake_refresh  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
         "--window-size=1400,1000", "--hide-scrollbars"]

# Counts what Bokeh drew, looking inside the shadow roots it renders into.
PROBE = """(() => {
  const acc = {canvases: 0, drawn: 0, rows: 0, roots: 0, text: ""};
  const walk = (root) => {
    for (const el of root.querySelectorAll("*")) {
      if (el.tagName === "CANVAS") { acc.canvases++; if (el.width > 0 && el.height > 0) acc.drawn++; }
      if (el.classList && el.classList.contains("slick-row")) acc.rows++;
      if (el.tagName !== "STYLE" && el.tagName !== "SCRIPT") {
        for (const node of el.childNodes) if (node.nodeType === 3) acc.text += node.textContent + " ";
      }
      if (el.shadowRoot) walk(el.shadowRoot);
    }
  };
  walk(document);
  acc.roots = document.querySelectorAll("[data-root-id]").length;
  acc.text = acc.text.slice(0, 200000);
  return JSON.stringify(acc);
})()"""


class DevTools:
    """The smallest DevTools-protocol client: one page target over tornado's websocket."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.next_id = 0
        self.errors: list[str] = []

    async def call(self, method: str, **params) -> dict:
        self.next_id += 1
        mine = self.next_id
        await self.ws.write_message(json.dumps({"id": mine, "method": method, "params": params}))
        while True:
            raw = await asyncio.wait_for(self.ws.read_message(), 30)
            assert raw is not None, "the DevTools connection closed"
            msg = json.loads(raw)
            if msg.get("id") == mine:
                assert "error" not in msg, msg["error"]
                return msg["result"]
            self._event(msg)

    def _event(self, msg: dict) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            self.errors.append(json.dumps(params["exceptionDetails"])[:2000])
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description")))
                                        for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(params["entry"].get("text", ""))


def open_chromium(tmp: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([CHROMIUM, *FLAGS, "--remote-debugging-port=0",
                             f"--user-data-dir={tmp}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    active = Path(tmp) / "DevToolsActivePort"
    deadline = time.monotonic() + 30
    while not (active.exists() and active.read_text().count("\n") >= 1):
        assert proc.poll() is None, "chromium exited"
        assert time.monotonic() < deadline, "chromium did not open its DevTools port"
        time.sleep(0.05)
    port = int(active.read_text().split()[0])
    for _ in range(100):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as reply:
            pages = [t for t in json.load(reply) if t["type"] == "page"]
        if pages:
            return proc, pages[0]["webSocketDebuggerUrl"]
        time.sleep(0.05)
    raise AssertionError("chromium has no page target")


async def render(ws_url: str, url: str, want_rows: int, timeout: float = 20) -> tuple[dict, list, bytes]:
    from tornado.websocket import websocket_connect

    ws = await websocket_connect(ws_url, max_message_size=64 << 20)
    tools = DevTools(ws)
    try:
        for domain in ("Page", "Runtime", "Log"):
            await tools.call(f"{domain}.enable")
        await tools.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while True:
            found = json.loads((await tools.call("Runtime.evaluate", expression=PROBE,
                                                 returnByValue=True))["result"]["value"])
            if (found["drawn"] >= 3 and found["rows"] >= want_rows) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
        # Grow the viewport to the whole page, let Bokeh lay out again, then capture.
        size = (await tools.call("Page.getLayoutMetrics"))["cssContentSize"]
        await tools.call("Emulation.setDeviceMetricsOverride", width=1400,
                         height=max(1000, int(size["height"])), deviceScaleFactor=1,
                         mobile=False)
        await asyncio.sleep(1.0)
        shot = await tools.call("Page.captureScreenshot", format="png")
        return found, tools.errors, base64.b64decode(shot["data"])
    finally:
        ws.close()


def browse(url: str, want_rows: int) -> tuple[dict, list, bytes]:
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        proc, ws_url = open_chromium(tmp)
        try:
            return asyncio.run(render(ws_url, url, want_rows))
        finally:
            close_chromium(proc)


def close_chromium(proc: subprocess.Popen) -> None:
    """Stop the chromium we started and its helpers (its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the helpers go after the browser
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def ink(png: bytes, top: int = 0) -> float:
    """The fraction of the image below ``top`` pixels that is not background
    (a page whose plots did not draw is one flat colour under Dask's navbar)."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        body = image.convert("RGB").crop((0, top, image.width, image.height))
        found = body.getcolors(body.width * body.height)
    background = max(found)[0]
    return 1 - background / (body.width * body.height)


NAVBAR = 60  # pixels


def test_the_stages_page_renders_its_plots():
    n = 30 if os.environ.get("ACCY_DASHBOARD_SCREENSHOT") else 8
    with LocalCluster(processes=False, n_workers=2, threads_per_worker=2,
                      dashboard_address="127.0.0.1:0", **ad.local_cluster_kwargs()) as cluster, \
            Client(cluster) as client:
        fake_refresh(client, n_variants=n, scale=1.0 if n == 30 else 0.2, failures=2)
        url = f"http://127.0.0.1:{cluster.scheduler.http_server.port}/accy/stages"
        found, errors, png = browse(url, want_rows=2)
    assert errors == []
    assert found["roots"] == 1
    assert found["drawn"] >= 3  # durations, rates, timeline (and the tables' own)
    assert found["rows"] >= 2 + 2  # the slowest variants and both failures
    for text in ("accy stages", "Slowest variants", "Recent failures", "tile-reductions",
                 "softmax[target=host"):
        assert text in found["text"]
    assert png.startswith(b"\x89PNG") and ink(png, top=NAVBAR) > 0.1
    if target := os.environ.get("ACCY_DASHBOARD_SCREENSHOT"):
        Path(target).write_bytes(png)


def test_the_html_report_renders_offline(tmp_path):
    variants = [{"id": f"softmax[target=host,arg0={n}x{n}]", "program": "softmax",
                 "status": "ok", "elapsed_ns": n * 1000,
                 "stages": [{"stage": s, "key": f"{i:02x}{n}", "reused": i % 2 == 0,
                             "elapsed_ns": n * 100 * (i + 1)}
                            for i, s in enumerate(("contract", "tensor", "kernel"))]}
                for n in (64, 128, 256)]
    report = write_html_report(tmp_path / "report.html", {"variants": variants})
    shot = tmp_path / "report.png"
    run = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                          "--enable-logging=stderr", "--v=0", f"--screenshot={shot}",
                          "--virtual-time-budget=5000", report.as_uri()],
                         check=True, capture_output=True, text=True, timeout=120)
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    assert any("[bokeh" in line for line in console)  # BokehJS ran, from the file itself
    assert not [line for line in console if "Uncaught" in line or "rror" in line]
    assert ink(shot.read_bytes()) > 0.05
