"""The pass manager: failures and their reproducers (file, replay, ``accy repro``), the
analysis cache, timing, statistics and work limits.

The passes here are test passes, registered under ``test-passes-*`` names.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from accy.choir.attributes import F32, IntegerAttr, StringAttr, TensorType, UnitAttr
from accy.choir.builtin import ModuleOp
from accy.choir.ir import Operation
from accy.choir.location import Location
from accy.choir.parser import parse_module
from accy.choir.passes import (
    PASS_REGISTRY,
    Instrumentation,
    Pass,
    PassContext,
    PassManager,
    Reproducer,
    WorkLimits,
    replay,
)
from accy.choir.printer import print_op
from accy.cli import main
from accy.errors import AccyError, PassFailedError, VerifyError, WorkLimitError

FILE = "m.mlir"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TEXT = '''"builtin.module"() ({
  "func.func"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<4xf32>):
    %0 = "semantic.neg"(%x) : (tensor<4xf32>) -> tensor<4xf32>
    %1 = "semantic.exp"(%0) : (tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%1) : (tensor<4xf32>) -> ()
  }) : () -> ()
}) : () -> ()
'''


def module() -> ModuleOp:
    return parse_module(TEXT, FILE)


def semantic_ops(m: Operation) -> list[Operation]:
    return [op for op in m.walk() if op.op_name.startswith("semantic.")]


# ------------------------------------------------------------------- test passes


@dataclass(frozen=True)
class Tag(Pass):
    """Marks every semantic op with ``tag``."""

    name = "test-passes-tag"
    preserves = frozenset({"test-op-count"})
    tag: str = "seen"

    def apply(self, ctx: PassContext, module: Operation) -> None:
        for op in semantic_ops(module):
            op.attributes[self.tag] = UnitAttr()
            ctx.stat("tagged")


@dataclass(frozen=True)
class Refuse(Pass):
    """Changes the IR, then fails with a located error at the first ``semantic.exp``."""

    name = "test-passes-refuse"
    reason: str = "exp is not welcome"
    limit: int = 3

    def apply(self, ctx: PassContext, module: Operation) -> None:
        for op in semantic_ops(module):
            op.attributes["half-done"] = UnitAttr()  # must not leak into the reproducer
        exp = next(op for op in module.walk() if op.op_name == "semantic.exp")
        raise VerifyError(f"{self.reason} (limit {self.limit})", exp.loc)


@dataclass(frozen=True)
class Crash(Pass):
    """A pass with a bug: an exception that is not an accy error."""

    name = "test-passes-crash"

    def apply(self, ctx: PassContext, module: Operation) -> None:
        raise ZeroDivisionError("division by zero in a pass")


@dataclass(frozen=True)
class Break(Pass):
    """Leaves invalid IR: the first op uses the second op's result."""

    name = "test-passes-break"

    def apply(self, ctx: PassContext, module: Operation) -> None:
        neg, exp = semantic_ops(module)
        neg.set_operand(0, exp.result)


@dataclass(frozen=True)
class Grow(Pass):
    """Adds ``n`` unregistered ops to the entry function."""

    name = "test-passes-grow"
    n: int = 10

    def apply(self, ctx: PassContext, module: Operation) -> None:
        assert isinstance(module, ModuleOp)
        func = module.entry()
        for i in range(self.n):
            func.body.insert_before(func.return_op, Operation.create(
                "test.filler", [], [], {"i": IntegerAttr(i)}))
        ctx.stat("added", self.n)


@dataclass(frozen=True)
class Count(Pass):
    """Reads the ``test-op-count`` analysis and records it."""

    name = "test-passes-count"
    preserves = frozenset({"*"})

    def apply(self, ctx: PassContext, module: Operation) -> None:
        n = ctx.analysis("test-op-count", lambda: sum(1 for _ in module.walk()))
        ctx.stat("seen-ops", n)


@dataclass(frozen=True)
class Clobber(Pass):
    """Changes the IR and preserves no analysis."""

    name = "test-passes-clobber"

    def apply(self, ctx: PassContext, module: Operation) -> None:
        for op in semantic_ops(module):
            op.attributes["clobbered"] = StringAttr("yes")


# ----------------------------------------------------------------- failure + repro


def fail(pipeline: tuple[Pass, ...], **kw: object) -> PassFailedError:
    m = module()
    with pytest.raises(PassFailedError) as info:
        PassManager("test-pipeline", pipeline, **kw).run(m)  # type: ignore[arg-type]
    return info.value


def test_failure_carries_a_reproducer() -> None:
    err = fail((Tag(), Refuse(reason="nope", limit=7), Tag("after")))
    repro = err.reproducer
    assert isinstance(repro, Reproducer)
    assert repro.pipeline == "test-pipeline"
    assert repro.pass_name == "test-passes-refuse"
    assert repro.pass_options == {"reason": "nope", "limit": 7}
    assert repro.message == f"{FILE}:5:5: error: nope (limit 7)"
    assert repro.location == f"{FILE}:5:5"
    assert not repro.truncated
    # the IR just before the failing pass: the earlier pass's work, not the failing one's
    assert "seen" in repro.ir and "half-done" not in repro.ir and "after" not in repro.ir
    before = module()
    Tag().apply(PassContext(), before)
    assert print_op(parse_module(repro.ir)) == print_op(before)
    # the error itself: one located line naming the pipeline and the pass
    assert str(err) == (f"{FILE}:5:5: error: pipeline 'test-pipeline', pass "
                        f"'test-passes-refuse': nope (limit 7)")
    assert isinstance(err.__cause__, VerifyError)


def test_a_kept_input_replaces_the_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``source`` (a stage keeps its input product untouched) nothing is encoded
    up front, and a failure's reproducer is the same as from the snapshot."""
    import accy.choir.wire as wire

    pipeline = (Tag(), Refuse(reason="nope", limit=7), Tag("after"))
    expected = fail(pipeline).reproducer
    encodes: list[int] = []
    real = wire.encode
    monkeypatch.setattr(wire, "encode", lambda op: encodes.append(1) or real(op))
    kept = module()
    calls: list[int] = []

    def source() -> Operation:
        calls.append(1)
        return kept.clone()

    PassManager("ok", (Tag(),)).run(module(), source=source)
    assert encodes == [] and calls == []
    with pytest.raises(PassFailedError) as info:
        PassManager("test-pipeline", pipeline).run(module(), source=source)
    assert encodes == [] and calls == [1]
    assert info.value.reproducer == expected


def test_reproducer_keeps_source_locations() -> None:
    repro = fail((Refuse(),)).reproducer
    m = parse_module(repro.ir, "elsewhere.mlir")
    exp = next(op for op in m.walk() if op.op_name == "semantic.exp")
    assert (exp.loc.file, exp.loc.line, exp.loc.col) == (FILE, 5, 5)


def test_internal_error_in_a_pass_is_a_pass_failure() -> None:
    err = fail((Crash(),))
    assert str(err) == ("pipeline 'test-pipeline', pass 'test-passes-crash': internal error in "
                        "pass 'test-passes-crash': ZeroDivisionError: division by zero in a pass")
    assert err.reproducer.pass_name == "test-passes-crash"
    assert isinstance(err.__cause__, ZeroDivisionError)


def test_pass_that_breaks_the_ir_is_the_one_that_fails() -> None:
    err = fail((Tag(), Break(), Tag("after")))
    assert err.reproducer.pass_name == "test-passes-break"
    assert str(err) == (f"{FILE}:4:5: error: pipeline 'test-pipeline', pass 'test-passes-break': "
                        f"pass 'test-passes-break' produced invalid IR: operand 0 of "
                        f"'semantic.neg' does not dominate its use")


def test_without_verify_each_the_broken_ir_goes_through() -> None:
    m = module()
    PassManager("p", (Break(),), verify_each=False).run(m)
    neg, exp = semantic_ops(m)
    assert neg.operands[0] is exp.result


def test_reproducer_file_reads_back_and_replays(tmp_path: Path) -> None:
    err = fail((Tag(), Refuse(reason="still no", limit=2)))
    path = err.reproducer.write(str(tmp_path), "r.mlir")
    assert path == str(tmp_path / "r.mlir")
    assert [p.name for p in tmp_path.iterdir()] == ["r.mlir"]  # no temporary left behind
    back = Reproducer.read(path)
    assert back == err.reproducer
    with pytest.raises(PassFailedError) as info:
        replay(back)
    assert str(info.value) == str(err)
    assert info.value.reproducer.message == err.reproducer.message


def test_reproducer_default_name_and_directory(tmp_path: Path) -> None:
    path = fail((Refuse(),)).reproducer.write(str(tmp_path / "new" / "dir"))
    assert os.path.basename(path).startswith("accy-repro-test-pipeline-test-passes-refuse-")
    assert path.endswith(".mlir") and os.path.exists(path)


def test_reproducer_file_is_mlir_after_its_header(tmp_path: Path) -> None:
    path = fail((Refuse(),)).reproducer.write(str(tmp_path), "r.mlir")
    header, _, ir = Path(path).read_text().partition("\n")
    assert header.startswith("// accy-reproducer: {")
    parse_module(Path(path).read_text(), path)  # the header is a comment: the file parses
    assert ir == fail((Refuse(),)).reproducer.ir


def test_reproducer_file_reads_in_mlir_opt(tmp_path: Path) -> None:
    if shutil.which("mlir-opt-19") is None:
        pytest.skip("mlir-opt-19 is not installed")
    path = fail((Tag(), Refuse())).reproducer.write(str(tmp_path), "r.mlir")
    proc = subprocess.run(["mlir-opt-19", "--allow-unregistered-dialect",
                           "-mlir-print-op-generic", "-mlir-print-debuginfo", path],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert print_op(parse_module(proc.stdout), debuginfo=True) == Reproducer.read(path).ir


def test_reading_something_that_is_not_a_reproducer(tmp_path: Path) -> None:
    plain = tmp_path / "plain.mlir"
    plain.write_text(TEXT)
    with pytest.raises(AccyError, match="is not an accy reproducer"):
        Reproducer.read(str(plain))
    bad = tmp_path / "bad.mlir"
    bad.write_text("// accy-reproducer: {not json\n" + TEXT)
    with pytest.raises(AccyError, match="malformed reproducer header"):
        Reproducer.read(str(bad))
    with pytest.raises(AccyError, match="cannot read reproducer"):
        Reproducer.read(str(tmp_path / "missing.mlir"))


def test_replay_of_an_unknown_pass() -> None:
    repro = Reproducer("p", "test-passes-no-such-pass", {}, "m", TEXT)
    with pytest.raises(AccyError, match="unknown pass 'test-passes-no-such-pass'"):
        replay(repro)


def test_replay_of_a_fixed_pass_passes() -> None:
    repro = Reproducer("p", Tag.name, {"tag": "ok"}, "it used to fail", TEXT)
    replay(repro)  # no error: the failure no longer reproduces


# ----------------------------------------------------------------------- accy repro


def one_error_line(stderr: str) -> str:
    """stderr is at most a ``replaying …`` note and exactly one error line, no traceback."""
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    rest = [line for line in lines if not line.startswith("replaying pipeline ")]
    assert len(lines) - len(rest) <= 1 and len(rest) == 1, stderr
    assert rest[0].startswith("error: ") or ": error: " in rest[0], stderr
    return rest[0]


def test_accy_repro_replays_the_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) \
        -> None:
    path = fail((Refuse(reason="replay me", limit=1),)).reproducer.write(str(tmp_path), "r.mlir")
    assert main(["repro", path]) == 1
    out, err = capsys.readouterr()
    line = one_error_line(err)
    assert line == (f"{FILE}:5:5: error: pipeline 'test-pipeline', pass 'test-passes-refuse': "
                    f"replay me (limit 1)")
    assert "replaying pipeline 'test-pipeline', pass 'test-passes-refuse'" in err
    assert out == ""


def test_accy_repro_of_a_fixed_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) \
        -> None:
    path = Reproducer("p", Tag.name, {"tag": "ok"}, "it used to fail", TEXT).write(
        str(tmp_path), "fixed.mlir")
    assert main(["repro", path]) == 0
    assert "no longer fails" in capsys.readouterr().out


def test_accy_repro_of_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) \
        -> None:
    assert main(["repro", str(tmp_path / "nope.mlir")]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: cannot read reproducer")


def test_accy_repro_in_a_real_process(tmp_path: Path) -> None:
    """The exit-code contract end to end: this module's passes registered, then the CLI."""
    path = fail((Refuse(reason="from a subprocess", limit=4),)).reproducer.write(
        str(tmp_path), "r.mlir")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import test_passes; "
            "from accy.cli import main; sys.exit(main(['repro', sys.argv[2]]))")
    proc = subprocess.run([sys.executable, "-c", code, str(HERE), path], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert one_error_line(proc.stderr).endswith("from a subprocess (limit 4)")
    # without the pass registered, the real `python -m accy repro` says so in one line
    proc = subprocess.run([sys.executable, "-m", "accy", "repro", path], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert one_error_line(proc.stderr) == "error: unknown pass 'test-passes-refuse' in reproducer"


# ------------------------------------------------------------------ analysis cache


def test_analysis_is_recomputed_only_after_a_pass_that_does_not_preserve_it() -> None:
    ctx = PassContext()
    result = PassManager("p", (Count(), Count(), Tag(), Count(), Clobber(), Count())).run(
        module(), ctx)
    # computed by the 1st Count; kept by Count (preserves *) and Tag (preserves it);
    # dropped by Clobber, so the last Count computes it again
    assert result.analyses_computed == 2
    assert ctx.analyses.computed == 2


def test_analysis_value_is_the_cached_one_until_invalidated() -> None:
    ctx = PassContext()
    pm = PassManager("p", (Count(), Grow(n=5), Count()))
    result = pm.run(module(), ctx)
    # Grow preserves nothing: the second Count sees the 5 new ops
    ops = sum(1 for _ in module().walk())  # module, func, neg, exp, return
    assert ops == 5
    assert result.stats["test-passes-count"]["seen-ops"] == ops + (ops + 5)


def test_a_pass_that_preserves_an_analysis_keeps_a_stale_value() -> None:
    """Preserving is a promise: the cache believes it (so a wrong promise shows)."""

    @dataclass(frozen=True)
    class GrowButPreserve(Grow):
        name = "test-passes-grow-preserving"
        preserves = frozenset({"test-op-count"})

    ctx = PassContext()
    PassManager("p", (Count(), GrowButPreserve(n=3), Count())).run(module(), ctx)
    assert ctx.analyses.computed == 1
    assert ctx.stats["test-passes-count"]["seen-ops"] == 2 * 5  # both saw the count of 5


# ------------------------------------------------------- timing and statistics


def test_timing_records_every_pass() -> None:
    pm = PassManager("p", (Tag(), Count(), Grow(n=2), Clobber()))
    result = pm.run(module())
    assert set(result.pass_ns) == {Tag.name, Count.name, Grow.name, Clobber.name}
    assert all(isinstance(ns, int) and ns > 0 for ns in result.pass_ns.values())
    assert pm.timing.elapsed_ns == result.pass_ns


def test_instrumentation_sees_every_pass_in_order() -> None:
    seen: list[tuple[str, str]] = []

    class Log(Instrumentation):
        def before_pass(self, p: Pass, module: Operation) -> None:
            seen.append(("before", p.name))

        def after_pass(self, p: Pass, module: Operation, elapsed_ns: int) -> None:
            seen.append(("after", p.name))

    PassManager("p", (Tag(), Count()), [Log()]).run(module())
    assert seen == [("before", Tag.name), ("after", Tag.name), ("before", Count.name),
                    ("after", Count.name)]


def test_statistics_accumulate() -> None:
    ctx = PassContext()
    result = PassManager("p", (Tag("a"), Grow(n=2), Tag("b"), Grow(n=3))).run(module(), ctx)
    assert result.stats == {Tag.name: {"tagged": 4}, Grow.name: {"added": 5}}
    # and across runs sharing one context
    PassManager("p", (Tag("c"),)).run(module(), ctx)
    assert ctx.stats[Tag.name]["tagged"] == 6


def test_same_pass_twice_is_timed_as_one_name() -> None:
    pm = PassManager("p", (Tag("a"), Tag("b")))
    assert list(pm.run(module()).pass_ns) == [Tag.name]


# -------------------------------------------------------------------- work limits


def test_op_limit_exceeded_is_a_work_limit_error() -> None:
    total = sum(1 for _ in module().walk())
    err = fail((Tag(), Grow(n=10)), limits=WorkLimits(max_ops=total + 5))
    assert isinstance(err, WorkLimitError)
    assert err.reproducer.pass_name == Grow.name
    assert str(err) == (f"pipeline 'test-pipeline', pass '{Grow.name}': {total + 10} operations "
                        f"after pass '{Grow.name}' exceed the limit of {total + 5}")
    # within the limit, the same pipeline runs
    PassManager("p", (Grow(n=10),), limits=WorkLimits(max_ops=total + 10)).run(module())


def test_deadline_exceeded_is_a_work_limit_error() -> None:
    err = fail((Tag(),), limits=WorkLimits(deadline_s=0.0))
    assert isinstance(err, WorkLimitError)
    assert "ran past its deadline of 0 s (at pass 'test-passes-tag')" in str(err)


def test_record_bytes_truncates_the_reproducer_and_says_so(tmp_path: Path) -> None:
    err = fail((Refuse(),), record_bytes=100)
    repro = err.reproducer
    assert repro.truncated
    full = len(print_op(module(), debuginfo=True).encode())
    kept, _, note = repro.ir.rpartition("// … truncated: ")
    assert len(kept.encode()) <= 101
    assert note.startswith(f"{full - 100} more bytes (record-bytes cap 100)")
    back = Reproducer.read(repro.write(str(tmp_path), "t.mlir"))
    assert back.truncated
    with pytest.raises(AccyError, match="truncated by the record-bytes cap; it cannot be "
                                        "replayed"):
        replay(back)


def test_record_bytes_larger_than_the_ir_keeps_it_whole() -> None:
    repro = fail((Refuse(),), record_bytes=1 << 20).reproducer
    assert not repro.truncated
    assert repro.ir == print_op(module(), debuginfo=True)


def test_record_bytes_never_splits_a_character() -> None:
    text = TEXT.replace('sym_name = "main"', 'note = "ééé", sym_name = "main"')
    m = parse_module(text, FILE)
    full = print_op(m, debuginfo=True).encode()
    cap = full.index("é".encode()) + 1  # in the middle of the first 'é'
    with pytest.raises(PassFailedError) as info:
        PassManager("p", (Refuse(),), record_bytes=cap).run(m)
    ir = info.value.reproducer.ir
    assert ir.startswith(full[:cap - 1].decode()) and "é" not in ir
    assert ir[cap - 1:].startswith("\n// … truncated: ")


def test_pass_options_rebuild_the_pass() -> None:
    p = Refuse(reason="r", limit=9)
    assert PASS_REGISTRY[p.name](**p.options()) == p
    assert Tag().options() == {"tag": "seen"}
    t = TensorType((4,), F32)
    assert t == TensorType((4,), F32)  # pass options and IR types alike compare by value


def test_passes_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Tag().tag = "other"  # type: ignore[misc]


def test_the_doctest_pipeline_shape() -> None:
    """A pipeline with no passes runs, with empty statistics and timings."""
    result = PassManager("empty", ()).run(module())
    assert result.stats == {} and result.pass_ns == {} and result.analyses_computed == 0


def test_failure_location_of_an_unlocated_error_is_empty() -> None:
    @dataclass(frozen=True)
    class Unlocated(Pass):
        name = "test-passes-unlocated"

        def apply(self, ctx: PassContext, module: Operation) -> None:
            raise VerifyError("no place", Location())

    err = fail((Unlocated(),))
    assert err.reproducer.location == ""
    assert str(err) == "pipeline 'test-pipeline', pass 'test-passes-unlocated': no place"
