"""NVRTC under concurrency: N concurrent compile loops in pool processes and in accy's
Dask workers, alternating, three rounds; prints JSON (median and max ms per compile).

Each loop compiles 20 variants of one layernorm kernel (the source ``accy emit``
writes for ``graphs/layernorm.mlir`` at 64×4096, a constant changed per compile so
nothing is cached). It tells whether a worker's environment slows NVRTC, and how
NVRTC scales with concurrency on the machine.

    python3 benchmarks/nvrtc_concurrency.py 15   # on the GPU machine
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SOURCE_ENV = "ACCY_NVRTC_SOURCE"


def loop(offset: int, n: int = 20) -> float:
    """Median ms of ``n`` NVRTC compiles (distinct sources) in this process."""
    from accy.executable.device import compile_cuda

    with open(os.environ[SOURCE_ENV]) as f:
        base = f.read()
    times = []
    for i in range(n):
        source = base.replace("4096", str(4096 + 8 * (offset * 100 + i)))
        t0 = time.perf_counter()
        compile_cuda(source, "sm_90", options=["--fmad=false"])
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from distributed import Client

    from accy.distributed.local import gpu_devices, local_cluster

    path = os.environ.setdefault(SOURCE_ENV, "/tmp/accy-nvrtc-layernorm.cu")
    with open(path, "w") as f:
        subprocess.run([sys.executable, "-m", "accy", "emit",
                        os.path.join(ROOT, "graphs", "layernorm.mlir"), "--target", "cuda:sm_90",
                        "--shape", "arg0=64x4096"], stdout=f, check=True)
    w = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    kw = {"resources": {"GPU": 1}} if gpu_devices() else {}
    out = []
    spawn = multiprocessing.get_context("spawn")
    with local_cluster(w) as cluster, Client(cluster) as client, \
            ProcessPoolExecutor(w, mp_context=spawn) as pool:
        client.wait_for_workers(w)
        list(pool.map(loop, range(w), [2] * w))  # warm-up, both sides
        client.gather(client.map(loop, range(w), [2] * w, pure=False, **kw))
        for r in range(3):
            for who in (("pool", "dask") if r % 2 == 0 else ("dask", "pool")):
                t0 = time.perf_counter()
                offsets = [1000 * r + 50 * (who == "dask") + i for i in range(w)]
                if who == "pool":
                    medians = list(pool.map(loop, offsets))
                else:
                    medians = client.gather(client.map(loop, offsets, pure=False, **kw))
                out.append({"round": r, "who": who,
                            "median_ms": round(statistics.median(medians), 2),
                            "max_ms": round(max(medians), 2),
                            "wall_s": round(time.perf_counter() - t0, 2)})
                print(out[-1], file=sys.stderr, flush=True)
    print(json.dumps({"concurrency": w, "rounds": out}))


if __name__ == "__main__":
    main()
