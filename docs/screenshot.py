"""Take docs/dashboard.png from a real batch: run sweeps on a local cluster, open /accy/stages.

    python3 docs/screenshot.py [OUT.png]

The batch is real (the quickstart, static and mlp sweeps, plus one variant
that fails for a genuine reason: a dynamic program with one argument left
unbound). Chromium is driven through its DevTools protocol, reusing the
helpers of tests/dashboard/test_page_chromium.py.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _chromium_helpers():  # type: ignore[no-untyped-def]
    path = os.path.join(ROOT, "tests", "dashboard", "test_page_chromium.py")
    spec = importlib.util.spec_from_file_location("accy_page_chromium", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def main() -> None:
    from distributed import Client, LocalCluster

    from accy.distributed import local_cluster_kwargs
    from accy.distributed.batch import _record, run_batch
    from accy.distributed.state import unpin
    from accy.sweep import Variant, load_sweeps

    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "docs", "dashboard.png")
    sweeps = [os.path.join(ROOT, "graphs", "sweeps", n)
              for n in ("quickstart.yaml", "static.yaml", "mlp.yaml", "softmax.yaml")]
    variants = load_sweeps(sweeps)
    variants.append(Variant(os.path.join(ROOT, "graphs", "dynamic.mlir"), "host",
                            {0: (16, 32)}))  # arg1 left unbound: fails in the tensor stage
    helpers = _chromium_helpers()
    with LocalCluster(processes=False, n_workers=2, threads_per_worker=1,
                      dashboard_address="127.0.0.1:0", **local_cluster_kwargs()) as cluster, \
            Client(cluster) as client:
        store = tempfile.mkdtemp(prefix="accy-shot-store-")
        result = run_batch(client, variants, store_url=store)
        _record(client, result)
        again = run_batch(client, variants[:10], store_url=store)  # a reused refresh, too
        _record(client, again)
        url = f"http://127.0.0.1:{cluster.scheduler.http_server.port}/accy/stages"
        found, errors, png = helpers.browse(url, want_rows=2)
        unpin(client)
    with open(out, "wb") as f:
        f.write(png)
    print(f"{out}: {len(png)} bytes, {found['drawn']} canvases drawn, "
          f"{len(errors)} JS errors; {len(variants)} variants, {result.failed} failed")


if __name__ == "__main__":
    main()
