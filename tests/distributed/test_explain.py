"""`--explain`: a stage that ran says which part of its key changed since the last publish."""

from __future__ import annotations

import os

from accy.distributed.batch import run_batch
from accy.sweep import Variant

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOFTMAX = os.path.join(ROOT, "graphs", "softmax.mlir")


def _why(outcome, stage):  # type: ignore[no-untyped-def]
    return next(r for r in outcome.receipts if r.stage == stage)


def test_a_changed_option_is_named_for_the_stage_that_reads_it(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, client = cluster
    store = str(tmp_path / "store")
    first = run_batch(client, [Variant(SOFTMAX, "cuda:sm_90", {0: (8, 256)},
                                       {"kernel.block_size": 128})], store_url=store)
    assert first.outcomes[0].status == "ok"
    second = run_batch(client, [Variant(SOFTMAX, "cuda:sm_90", {0: (8, 256)},
                                        {"kernel.block_size": 256})], store_url=store)
    out = second.outcomes[0]
    assert out.status == "ok"
    for stage in ("contract", "tensor", "dispatch", "memory"):
        r = _why(out, stage)
        assert r.reused and r.source == "cluster", r
    kernel = _why(out, "kernel")
    assert not kernel.reused and kernel.explain == "option block_size: 128 -> 256"


def test_a_changed_program_names_the_input_fingerprint(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, client = cluster
    prog = tmp_path / "p.mlir"
    text = open(SOFTMAX).read()
    prog.write_text(text)
    v = Variant(str(prog), "host", {0: (4, 64)})
    assert run_batch(client, [v]).outcomes[0].status == "ok"
    prog.write_text(text.replace('"semantic.softmax"(%x) {axis = -1 : i64}',
                                 '"semantic.softmax"(%x) {axis = 1 : i64}'))
    out = run_batch(client, [v]).outcomes[0]
    contract = _why(out, "contract")
    assert out.status == "ok" and not contract.reused
    assert contract.explain.startswith("input fingerprint ")
