"""A fake refresh for the dashboard tests: variants whose stages are ``accy_<stage>``
tasks that sleep, recorded and published as a batch would (``test_http`` and
``test_page_chromium`` draw the records it leaves)."""

from __future__ import annotations

import hashlib
import random
import time

from distributed import Client, wait

import accy.distributed as ad
from accy.dashboard.records import STAGES

PIPELINE = STAGES  # contract … target, compile, load
# What each stage depends on (so identical runs across variants share a task).
INPUTS = {"contract": ("program", "shape"), "tensor": ("program", "shape"),
          "dispatch": ("program", "shape", "target"), "memory": ("program", "shape", "target"),
          "kernel": ("program", "shape", "target", "block"),
          "target": ("program", "shape", "target", "block"),
          "compile": ("program", "shape", "target", "block"),
          "load": ("program", "shape", "target", "block")}
SECONDS = {"contract": 0.002, "tensor": 0.004, "dispatch": 0.002, "memory": 0.003,
           "kernel": 0.008, "target": 0.004, "compile": 0.05, "load": 0.01}


def run_stage(_previous, seconds: float) -> int:
    time.sleep(seconds)
    return 1


def hexkey(*parts: object) -> str:
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()


def fake_refresh(client: Client, n_variants: int, scale: float = 1.0, seed: int = 0,
                 failures: int = 2) -> list[dict]:
    """Refresh ``n_variants`` fake variants as accy_<stage> tasks and record them.

    Identical stage runs share one task (their receipts all say ran); the
    first ``failures`` variants fail in the kernel stage; CUDA loads are
    skipped ("no GPU"). The ok variants publish (and a stale publish
    conflicts). Then a third of them refresh again with a new block size:
    contract … memory are reused (no task), kernel … load run anew.
    Returns every variant dict sent to ``accy_record_batch``.
    """
    rng = random.Random(seed)
    programs = ["softmax", "layernorm", "matmul", "rmsnorm"]
    futures = []  # held until the publish has pinned the tasks

    def refresh(batch: list[tuple[dict, bool]], reuse_before: str | None) -> list[dict]:
        sent = []
        for axes, fail in batch:
            vid = (f"{axes['program']}[target={axes['target']},arg0={axes['shape']},"
                   f"kernel.block_size={axes['block']}]")
            receipts, previous, total = [], None, 0
            reusing = reuse_before is not None
            for stage in PIPELINE:
                reusing = reusing and stage != reuse_before
                key = hexkey(stage, *(axes[a] for a in INPUTS[stage]))
                seconds = SECONDS[stage] * scale * rng.uniform(0.5, 2.0)
                receipt = {"stage": stage, "key": key, "reused": reusing,
                           "elapsed_ns": 0 if reusing else int(seconds * 1e9),
                           "plan_fingerprint": key[:16], "pass_stats": {}}
                if not reusing:
                    previous = client.submit(run_stage, previous, seconds,
                                             key=(f"accy_{stage}", key))
                    futures.append(previous)
                    total += receipt["elapsed_ns"]
                if stage == "load" and axes["target"].startswith("cuda"):
                    receipt["skipped"] = "no GPU"
                receipts.append(receipt)
                if fail and stage == "kernel":
                    break
            variant = {"id": vid, "program": axes["program"], "elapsed_ns": total,
                       "status": "failed" if fail else "ok", "stages": receipts}
            if fail:
                variant["failure"] = {
                    "pipeline": "kernel", "pass": "tile-reductions",
                    "message": f"tile-reductions: block {axes['block']} does not divide the row",
                    "reproducer": f"/tmp/accy-repro/{hexkey(vid)[:12]}.mlir"}
            sent.append(variant)
        wait(futures)
        client.sync(client.scheduler.accy_record_batch, variants=sent)
        return sent

    first = [({"program": programs[i % len(programs)],
               "shape": ["1024x1024", "8192x4096"][(i // 4) % 2],
               "target": ["host", "cuda:sm_90"][(i // 2) % 2],
               "block": [128, 256][(i // 16) % 2]}, i < failures) for i in range(n_variants)]
    variants = refresh(first, None)
    ok = [v for v in variants if v["status"] == "ok"]
    entries = {r["key"]: {"stage": r["stage"], "task_key": [f"accy_{r['stage']}", r["key"]],
                          "elapsed_ns": r["elapsed_ns"]} for v in ok for r in v["stages"]}
    reply = ad.publish_with_merge(
        client, entries, {v["id"]: {"stages": [r["key"] for r in v["stages"]]} for v in ok},
        [e["task_key"] for e in entries.values()])
    assert reply["ok"]
    assert not ad.publish(client, reply["version"] - 1, {}, {}, [])["ok"]
    again = [({**axes, "block": 512}, False) for axes, fail in first if not fail]
    return variants + refresh(again[: max(1, n_variants // 3)], reuse_before="kernel")
