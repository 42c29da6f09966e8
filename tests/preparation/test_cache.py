"""The preparation cache: reuse, early cutoff, failures, forks; and the report types."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from accy.choir.passes import Pass, PassContext, Reproducer, replay
from accy.errors import AccyError, PassFailedError, VerifyError
from accy.pipeline import PREPARATION_NAMES as STAGES
from accy.preparation import recipe
from accy.preparation.cache import (
    BackendPreparationCache,
    PreparationFailed,
    PreparationUpdate,
)
from accy.preparation.options import RunOptions
from accy.preparation.products import Revision, SemanticModule, TargetJob
from accy.preparation.report import (
    BackendPreparationFailure,
    BatchReport,
    PreparationReport,
    Receipt,
    summary,
    variant_json,
    write_report,
)
from accy.preparation.stages import PreparationRequest

ROOT = Path(__file__).resolve().parents[2]
SOFTMAX = ROOT / "graphs" / "softmax.mlir"
SHAPES = {0: (8, 4096)}


@dataclass(frozen=True)
class AlwaysFails(Pass):
    """A test pass that fails on any module (registered, so a reproducer replays it)."""

    name = "test-always-fails"
    reason: str = "boom"

    def apply(self, ctx: PassContext, module) -> None:
        raise AccyError(f"injected failure: {self.reason}")


def softmax() -> SemanticModule:
    return SemanticModule.from_file(str(SOFTMAX))


def softmax_with_dead_exp() -> SemanticModule:
    text = SOFTMAX.read_text()
    dead = ('    %dead = "semantic.exp"(%x) : (tensor<?x?xf32>) -> tensor<?x?xf32>\n'
            '    "func.return"(%0)')
    assert '    "func.return"(%0)' in text
    return SemanticModule.from_text(text.replace('    "func.return"(%0)', dead, 1),
                                    str(SOFTMAX))


def request(target: str = "host", options: tuple[str, ...] = (),
            shapes: dict[int, tuple[int, ...]] | None = None) -> PreparationRequest:
    return PreparationRequest(source=str(SOFTMAX), variant="test",
                              options=RunOptions.parse(target, list(options)),
                              shapes=dict(SHAPES if shapes is None else shapes))


def marks(update: PreparationUpdate) -> dict[str, str]:
    return {r.stage: "reused" if r.reused else "ran" for r in update.report}


ALL_RAN = {s: "ran" for s in STAGES}
ALL_REUSED = {s: "reused" for s in STAGES}


@pytest.fixture(scope="module")
def warm() -> tuple[BackendPreparationCache, PreparationUpdate]:
    """A cache after one full refresh of softmax on the host (shared; tests fork it)."""
    cache = BackendPreparationCache()
    return cache, cache.refresh_from_semantic_module(softmax(), request())


# -- the cache


def test_first_refresh_runs_every_stage(warm):
    cache, first = warm
    assert marks(first) == ALL_RAN
    assert isinstance(first.prepared, TargetJob)
    assert cache.current_prepared() is first.prepared
    assert first.report.stages == list(STAGES)
    for r in first.report:
        assert r.explain == "no published entry for this variant"
        assert r.pass_stats is not None and r.pass_ns is not None
        assert (r.plan_fingerprint is not None) == (r.stage in ("dispatch", "memory", "kernel"))
        assert r.key == first.results[r.stage].key.hex
    assert cache.current == first.keys


def test_second_refresh_reuses_every_stage(warm):
    cache, first = warm
    staged = cache.fork()
    second = staged.refresh_from_semantic_module(softmax(), request())
    assert marks(second) == ALL_REUSED
    assert second.prepared is first.prepared
    assert second.keys == first.keys
    for r in second.report:
        assert r.source == "memory" and r.explain is None and r.pass_stats == {}
        assert r.plan_fingerprint == first.results[r.stage].plan_fingerprint
    assert second.report.ran() == 0 and second.report.reused() == len(STAGES)


def test_revision_refresh_reuses_without_decoding(warm):
    cache, first = warm
    good = Revision.of(softmax())
    assert marks(cache.fork().refresh_from_semantic_revision(good, request())) == ALL_REUSED
    # The contract key needs only the revision's fingerprint: reusing it never decodes the wire.
    undecodable = Revision(b"not msgpack", good.fingerprint, good.source)
    update = cache.fork().refresh(undecodable, request())
    assert update.prepared is first.prepared


def test_kernel_option_reruns_kernel_and_target_only(warm):
    cache = BackendPreparationCache()
    cache.refresh_from_semantic_module(softmax(), request("cuda:sm_90"))
    update = cache.fork().refresh_from_semantic_module(
        softmax(), request("cuda:sm_90", ("kernel.block_size=128",)))
    assert marks(update) == {"contract": "reused", "tensor": "reused", "dispatch": "reused",
                             "memory": "reused", "kernel": "ran", "target": "ran"}


def test_explain_names_the_changed_option(warm):
    cache, _ = warm
    update = cache.fork().refresh_from_semantic_module(
        softmax(), request(options=("kernel.block_size=128",)))
    kernel = update.report.receipt("kernel")
    assert kernel is not None and not kernel.reused
    assert "option block_size: 0 -> 128" in kernel.explain
    assert "input fingerprint" not in kernel.explain


def test_dead_op_reruns_contract_then_cuts_off(warm):
    cache, first = warm
    update = cache.fork().refresh_from_semantic_module(softmax_with_dead_exp(), request())
    assert marks(update) == {"contract": "ran", **{s: "reused" for s in STAGES[1:]}}
    assert "input fingerprint" in update.report.receipt("contract").explain
    assert update.results["contract"].product.fingerprint() == \
        first.results["contract"].product.fingerprint()
    assert update.prepared is first.prepared


def test_shape_change_reruns_everything(warm):
    cache, first = warm
    update = cache.fork().refresh_from_semantic_module(softmax(), request(shapes={0: (16, 4096)}))
    assert marks(update) == ALL_RAN
    assert "option shapes" in update.report.receipt("contract").explain
    assert update.prepared.fingerprint() != first.prepared.fingerprint()


def test_admission_check_drops_a_product_that_fails_to_verify(warm):
    cache, first = warm
    staged = cache.fork()
    broken = first.results["memory"]
    # A fresh entry under the memory key whose product no longer verifies.
    from accy.preparation.stages import StageResult

    bad_product = type(broken.product)(broken.product.clone_module(), broken.product.meta)

    def refuse() -> None:
        raise VerifyError("tampered entry")

    bad_product.verify = refuse  # type: ignore[method-assign]
    staged.put(StageResult("memory", broken.key, bad_product, broken.elapsed_ns,
                           broken.pass_stats, broken.pass_ns, broken.plan_fingerprint))
    update = staged.refresh_from_semantic_module(softmax(), request())
    got = marks(update)
    assert got["memory"] == "ran"
    assert all(got[s] == "reused" for s in ("contract", "tensor", "dispatch"))
    # the re-run memory product has the same content, so kernel and target are cut off
    assert got["kernel"] == got["target"] == "reused"
    assert "failed the admission check" in update.report.receipt("memory").explain
    assert "tampered entry" in update.report.receipt("memory").explain
    assert update.results["memory"].product is not bad_product
    # the caller's cache was not touched
    assert cache.current_result("memory") is first.results["memory"]


def test_failing_pass_raises_with_a_replayable_reproducer(warm, tmp_path, monkeypatch):
    cache, first = warm
    real = recipe.configure

    def with_failure(stage, options, shapes=None):
        passes = real(stage, options, shapes)
        return (*passes, AlwaysFails("memory broke")) if stage == "memory" else passes

    monkeypatch.setattr(recipe, "configure", with_failure)
    staged = cache.fork()
    before = dict(cache.current)
    with pytest.raises(PreparationFailed) as info:
        # a memory option changes the memory key, so the memory stage (and its
        # injected pass) runs; contract … dispatch are reused
        staged.refresh_from_semantic_module(softmax(), request(options=("memory.alignment=512",)),
                                            artifact_dir=str(tmp_path))
    err = info.value
    assert isinstance(err, AccyError) and err.stage == "memory"
    f = err.failure
    assert (f.pipeline, f.pass_name, f.stage) == ("memory", "test-always-fails", "memory")
    assert "injected failure: memory broke" in f.message
    assert f.reproducer_path is not None and f.reproducer_path.startswith(str(tmp_path))
    assert f.to_json() == {"pipeline": "memory", "pass": "test-always-fails",
                           "message": f.message, "reproducer": f.reproducer_path}
    assert err.report.stages == ["contract", "tensor", "dispatch"]
    assert err.report.reused() == 3
    assert isinstance(err.error, PassFailedError)
    assert "reproducer: " in str(err)

    repro = Reproducer.read(f.reproducer_path)
    assert (repro.pipeline, repro.pass_name) == ("memory", "test-always-fails")
    with pytest.raises(PassFailedError, match="injected failure: memory broke"):
        replay(repro)

    # the caller's cache is untouched; the failed fork kept its old chain too
    assert cache.current == before
    assert cache.current_prepared() is first.prepared
    assert staged.current == before


def test_failure_of_the_first_stage_has_an_empty_report(tmp_path, monkeypatch):
    real = recipe.configure
    monkeypatch.setattr(recipe, "configure", lambda stage, options, shapes=None:
                        (AlwaysFails(),) if stage == "contract" else real(stage, options, shapes))
    cache = BackendPreparationCache()
    with pytest.raises(PreparationFailed) as info:
        cache.refresh_from_semantic_module(softmax(), request(), artifact_dir=str(tmp_path))
    assert len(info.value.report) == 0
    assert cache.current_prepared() is None and cache.current == {}
    assert os.path.dirname(info.value.failure.reproducer_path) == str(tmp_path)


def test_fork_does_not_see_later_refreshes_of_its_fork(warm):
    cache, first = warm
    a = cache.fork()
    b = a.fork()
    update = b.refresh_from_semantic_module(softmax(), request(shapes={0: (4, 4096)}))
    assert b.current_prepared() is update.prepared
    assert a.current_prepared() is first.prepared
    assert cache.current_prepared() is first.prepared
    assert update.keys["target"] in b and update.keys["target"] not in a
    assert update.keys["target"] not in cache
    # and the other way round: a refresh of the original does not reach an older fork
    c = cache.fork()
    a.refresh_from_semantic_module(softmax(), request(shapes={0: (2, 4096)}))
    assert c.current == cache.current == first.keys


def test_capacity_bounds_the_entries_but_keeps_the_current_chain():
    cache = BackendPreparationCache(capacity=len(STAGES))
    cache.refresh_from_semantic_module(softmax(), request(shapes={0: (2, 4096)}))
    latest = cache.refresh_from_semantic_module(softmax(), request(shapes={0: (4, 4096)}))
    assert len(cache) == len(STAGES)
    assert all(cache.current_result(s) is latest.results[s] for s in STAGES)
    again = cache.refresh_from_semantic_module(softmax(), request(shapes={0: (2, 4096)}))
    assert marks(again) == ALL_RAN
    assert "option shapes" in again.report.receipt("contract").explain
    with pytest.raises(ValueError):
        BackendPreparationCache(capacity=0)


# -- the report types


def test_receipt_json_has_exactly_the_interface_fields():
    r = Receipt("memory", "ab" * 16, False, 123, "00" * 8, {"plan-buffers": {"buffers": 2}})
    assert r.to_json() == {"stage": "memory", "key": "ab" * 16, "reused": False,
                           "elapsed_ns": 123, "plan_fingerprint": "00" * 8,
                           "pass_stats": {"plan-buffers": {"buffers": 2}}}
    full = Receipt("load", "cd" * 16, False, 0, skipped="no GPU", explain="x", pass_ns={"a": 1})
    js = full.to_json()
    assert js["skipped"] == "no GPU" and js["explain"] == "x" and js["pass_ns"] == {"a": 1}
    assert "source" not in js
    assert Receipt.from_json(js) == full
    with pytest.raises(ValueError):
        Receipt("linking", "00", False, 1)
    with pytest.raises(ValueError):
        Receipt("tensor", "00", True, 1, source="disk")


def test_report_keeps_pipeline_order_and_counts():
    report = PreparationReport()
    report.add(Receipt("load", "05", False, 7, skipped="no GPU"))
    report.add(Receipt("tensor", "01", True, 2, source="store"))
    report.add(Receipt("contract", "00", False, 5))
    report.add(Receipt("compile", "04", False, 11))
    assert report.stages == ["contract", "tensor", "compile", "load"]
    assert report.elapsed_ns == [5, 2, 11, 7]
    assert (report.ran(), report.reused()) == (2, 1)
    assert [r["stage"] for r in report.to_json()] == report.stages
    with pytest.raises(ValueError):
        report.add(Receipt("tensor", "01", False, 2))


def test_failure_without_a_reproducer():
    f = BackendPreparationFailure.from_error(PassFailedError("no repro"), "kernel", None)
    assert f.reproducer_path is None and f.pipeline == "kernel"
    assert f.to_json()["reproducer"] is None


def test_batch_report_file(tmp_path, warm):
    _, first = warm
    failure = BackendPreparationFailure("kernel", "plan-kernels", "bad tile", "/tmp/r.mlir",
                                        "kernel")
    variants = [
        variant_json("softmax[target=host]", "ok", first.report),
        variant_json("softmax[target=host,kernel.block_size=64]", "failed",
                     [r.to_json() for r in first.report.receipts[:4]], failure),
        variant_json("softmax[target=cuda:sm_90]", "ok",
                     [Receipt("compile", "aa", True, 3, source="store"),
                      Receipt("load", "bb", False, 1, skipped="no GPU")]),
    ]
    s = summary(variants)
    assert s == {"variants": 3, "ok": 2, "failed": 1, "stage_runs": 6 + 4, "reuses": 1}
    path = write_report(str(tmp_path / "out" / "r.json"), variants, s)
    doc = json.loads(Path(path).read_text())
    assert doc == {"variants": variants, "summary": s}
    assert doc["variants"][1]["failure"] == {"pipeline": "kernel", "pass": "plan-kernels",
                                             "message": "bad tile", "reproducer": "/tmp/r.mlir"}
    assert "failure" not in doc["variants"][0]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["r.json"]  # no temp left behind
    with pytest.raises(ValueError):
        variant_json("x", "failed", [])
    with pytest.raises(ValueError):
        variant_json("x", "maybe", [])

    batch = BatchReport()
    batch.add("a", "ok", first.report)
    batch.add("b", "failed", [], failure)
    assert batch.failed == 1
    batch.write(str(tmp_path / "b.json"))
    assert json.loads((tmp_path / "b.json").read_text())["summary"]["variants"] == 2
