"""Passes and the pass manager.

A pass is a small frozen dataclass: its fields are its options, ``name`` is
kebab-case, and ``apply(ctx, module)`` does the work. A pipeline is a tuple
of passes run by a :class:`PassManager`, which keeps an analysis cache
(analyses are dropped unless a pass says it preserves them), runs
instrumentation hooks (timing), gathers per-pass statistics, verifies after
each pass, enforces work limits, and on failure keeps a :class:`Reproducer`:
the pipeline, the failing pass with its options, the message and the IR just
before that pass. ``accy repro FILE`` replays a written reproducer.

Example
-------
>>> from dataclasses import dataclass
>>> from accy.choir.builtin import ModuleOp
>>> @dataclass(frozen=True)
... class CountOps(Pass):
...     name = "count-ops"
...     def apply(self, ctx, module):
...         ctx.stat("ops", sum(1 for _ in module.walk()))
>>> pm = PassManager("demo", (CountOps(),))
>>> pm.run(ModuleOp.build()).stats["count-ops"]["ops"]
1
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from accy.choir.ir import Operation
from accy.choir.location import Location
from accy.errors import AccyError, PassFailedError, VerifyError, WorkLimitError
from accy.files import write_atomic
from accy.paths import user_dir


class _BrokenIR(AccyError):
    """The verifier rejected what a pass produced (a bug in that pass)."""


PASS_REGISTRY: dict[str, type[Pass]] = {}
"""Pass classes by name, so a reproducer can rebuild its pass."""

REPRO_HEADER = "// accy-reproducer: "


@dataclass(frozen=True)
class Pass:
    """Base of every pass. Subclasses are frozen dataclasses; fields are options."""

    name: ClassVar[str] = ""
    preserves: ClassVar[frozenset[str]] = frozenset()
    """Names of analyses this pass keeps valid (``{"*"}``: it changes nothing)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            PASS_REGISTRY[cls.name] = cls

    def apply(self, ctx: PassContext, module: Operation) -> None:
        raise NotImplementedError

    def options(self) -> dict[str, Any]:
        """The pass's options as JSON-able values."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


class AnalysisCache:
    """Results of analyses over a module, dropped when a pass does not preserve them."""

    def __init__(self) -> None:
        self._results: dict[str, Any] = {}
        self.computed = 0
        """How many times an analysis actually ran (for statistics and tests)."""

    def get(self, name: str, compute: Callable[[], Any]) -> Any:
        if name not in self._results:
            self._results[name] = compute()
            self.computed += 1
        return self._results[name]

    def invalidate(self, preserved: frozenset[str]) -> None:
        if "*" in preserved:
            return
        self._results = {k: v for k, v in self._results.items() if k in preserved}


@dataclass
class PassContext:
    """What a pass sees besides the module: analyses and statistics.

    A pass reads its options from its own fields only (so a reproducer can
    rebuild it from the pass name and those fields).
    """

    analyses: AnalysisCache = field(default_factory=AnalysisCache)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    current: str = ""

    def stat(self, key: str, n: int = 1) -> None:
        """Add ``n`` to the current pass's statistic ``key``."""
        d = self.stats.setdefault(self.current, {})
        d[key] = d.get(key, 0) + n

    def analysis(self, name: str, compute: Callable[[], Any]) -> Any:
        return self.analyses.get(name, compute)


class Instrumentation:
    """Hooks around each pass; subclass and override what you need."""

    def before_pass(self, p: Pass, module: Operation) -> None: ...

    def after_pass(self, p: Pass, module: Operation, elapsed_ns: int) -> None: ...


class TimingInstrumentation(Instrumentation):
    """Accumulates wall time per pass name (ns)."""

    def __init__(self) -> None:
        self.elapsed_ns: dict[str, int] = {}

    def after_pass(self, p: Pass, module: Operation, elapsed_ns: int) -> None:
        self.elapsed_ns[p.name] = self.elapsed_ns.get(p.name, 0) + elapsed_ns


@dataclass(frozen=True)
class WorkLimits:
    """Bounds on one stage run: op count after any pass, and wall time."""

    max_ops: int = 1_000_000
    deadline_s: float = 300.0


@dataclass
class Reproducer:
    """Pipeline, failing pass (with options), message and the IR just before the pass."""

    pipeline: str
    pass_name: str
    pass_options: dict[str, Any]
    message: str
    ir: str
    truncated: bool = False
    location: str = ""

    def text(self) -> str:
        meta = {"pipeline": self.pipeline, "pass": self.pass_name,
                "options": self.pass_options, "message": self.message,
                "truncated": self.truncated, "location": self.location}
        return REPRO_HEADER + json.dumps(meta, sort_keys=True) + "\n" + self.ir

    def write(self, directory: str | None = None, name: str | None = None) -> str:
        """Write the reproducer atomically as ``.mlir`` (it reads in mlir-opt); return its path."""
        directory = directory or user_dir("reproducers")
        name = name or f"accy-repro-{self.pipeline}-{self.pass_name}-{os.getpid()}.mlir"
        return write_atomic(os.path.join(directory, name), self.text())

    @staticmethod
    def read(path: str) -> Reproducer:
        try:
            with open(path, encoding="utf-8") as f:
                first = f.readline()
                ir = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise AccyError(f"cannot read reproducer {path}: {e}") from None
        if not first.startswith(REPRO_HEADER):
            raise AccyError(f"{path} is not an accy reproducer (no '{REPRO_HEADER.strip()}' "
                            f"header line)")
        try:
            meta = json.loads(first[len(REPRO_HEADER):])
            return Reproducer(meta["pipeline"], meta["pass"], dict(meta["options"]),
                              meta["message"], ir, bool(meta.get("truncated")),
                              meta.get("location", ""))
        except (ValueError, KeyError, TypeError) as e:
            raise AccyError(f"{path}: malformed reproducer header: {e}") from None


@dataclass
class PipelineResult:
    """What a pipeline run gathered: per-pass statistics and timings."""

    stats: dict[str, dict[str, int]]
    pass_ns: dict[str, int]
    analyses_computed: int


def count_ops(op: Operation) -> int:
    return sum(1 for _ in op.walk())


class PassManager:
    """Runs a pipeline of passes over a module.

    Parameters
    ----------
    name
        The pipeline name (``contract``, ``tensor``, …), recorded in reproducers.
    passes
        The pipeline, in order.
    instrumentations
        Extra hooks (a :class:`TimingInstrumentation` is always attached).
    verify_each
        Verify the module after every pass, so a pass that breaks the IR is
        the one that fails.
    limits
        Work limits; passing them raises :class:`WorkLimitError`.
    record_bytes
        Cap on the IR text kept in a reproducer (longer IR is truncated and says so).
    """

    def __init__(
        self,
        name: str,
        passes: Sequence[Pass],
        instrumentations: Iterable[Instrumentation] = (),
        *,
        verify_each: bool = True,
        limits: WorkLimits | None = None,
        record_bytes: int | None = None,
        verifier: Callable[[Operation], None] | None = None,
    ) -> None:
        self.name = name
        self.passes = tuple(passes)
        self.timing = TimingInstrumentation()
        self.instrumentations = [self.timing, *instrumentations]
        self.verify_each = verify_each
        self.limits = limits or WorkLimits()
        self.record_bytes = record_bytes
        if verifier is None:
            from accy.choir.verifier import verify

            verifier = verify
        self.verifier: Callable[[Operation], None] = verifier

    def _before(self, module: Operation, index: int) -> Operation:
        """``module`` (the pipeline's input) after the passes before pass ``index``."""
        ctx = PassContext()
        for p in self.passes[:index]:
            ctx.current = p.name
            p.apply(ctx, module)
        return module

    def run(self, module: Operation, ctx: PassContext | None = None,
            source: Callable[[], Operation] | None = None) -> PipelineResult:
        """Run every pass; on failure raise :class:`PassFailedError` with a reproducer.

        On failure the IR before the failing pass is rebuilt by replaying the passes
        before it (they are deterministic) on the pipeline's input. ``source`` returns
        a fresh copy of that input when the caller keeps one untouched (a stage runs on
        a clone of its input product); without it the input is snapshot as wire bytes
        first — an encode of every stage's input, a tenth of a stage run, for a
        reproducer that is almost never needed."""
        from accy.choir.printer import print_op
        from accy.choir.wire import decode, encode

        ctx = ctx or PassContext()
        start = time.perf_counter()
        if source is None:
            snapshot = encode(module)

            def source() -> Operation:
                return decode(snapshot)
        for index, p in enumerate(self.passes):
            ctx.current = p.name
            for ins in self.instrumentations:
                ins.before_pass(p, module)
            t0 = time.perf_counter_ns()
            try:
                p.apply(ctx, module)
                if self.verify_each:
                    try:
                        self.verifier(module)
                    except VerifyError as e:
                        raise _BrokenIR(f"pass '{p.name}' produced invalid IR: {e.message}", e.loc) \
                            from e
                n_ops = count_ops(module)
                if n_ops > self.limits.max_ops:
                    raise WorkLimitError(f"{n_ops} operations after pass '{p.name}' exceed the "
                                         f"limit of {self.limits.max_ops}")
                if time.perf_counter() - start > self.limits.deadline_s:
                    raise WorkLimitError(f"pipeline '{self.name}' ran past its deadline of "
                                         f"{self.limits.deadline_s:g} s (at pass '{p.name}')")
            except Exception as e:  # every failure, a pass's bug included, gets a reproducer
                message = str(e) if isinstance(e, AccyError) else \
                    f"internal error in pass '{p.name}': {type(e).__name__}: {e}"
                loc: Location | None = getattr(e, "loc", None)
                # debuginfo: a replay reports the same located message
                try:
                    ir = print_op(self._before(source(), index), debuginfo=True)
                except Exception:  # a pass that is not deterministic: keep the input
                    ir = ("// the IR at the pipeline's input (replaying the passes before "
                          f"'{p.name}' failed)\n" + print_op(source(), debuginfo=True))
                truncated = False
                if self.record_bytes is not None and len(ir.encode()) > self.record_bytes:
                    cut = ir.encode()[: self.record_bytes].decode("utf-8", "ignore")
                    ir = cut + f"\n// … truncated: {len(ir.encode()) - len(cut.encode())} " \
                               f"more bytes (record-bytes cap {self.record_bytes})\n"
                    truncated = True
                repro = Reproducer(self.name, p.name, p.options(), message, ir, truncated,
                                   str(loc) if loc is not None and loc.known else "")
                cls = WorkLimitError if isinstance(e, WorkLimitError) else PassFailedError
                if loc is not None and loc.known and isinstance(e, AccyError):
                    # one ``FILE:LINE:COL: error: …`` line, not a location inside the message
                    raise cls(f"pipeline '{self.name}', pass '{p.name}': {e.message}", repro,
                              loc) from e
                raise cls(f"pipeline '{self.name}', pass '{p.name}': {message}", repro) from e
            elapsed = time.perf_counter_ns() - t0
            for ins in self.instrumentations:
                ins.after_pass(p, module, elapsed)
            ctx.analyses.invalidate(p.preserves)
        return PipelineResult(ctx.stats, dict(self.timing.elapsed_ns), ctx.analyses.computed)


def replay(repro: Reproducer) -> None:
    """Run the reproducer's pass on its IR; raises the same :class:`PassFailedError`.

    The pass is looked up among the declared ones (:data:`PASS_REGISTRY`);
    :func:`accy.pipeline.replay` declares every stage's passes first.
    """
    from accy.choir.parser import parse_module
    from accy.choir.verifier import verify

    if repro.truncated:
        raise AccyError("this reproducer's IR was truncated by the record-bytes cap; "
                        "it cannot be replayed")
    cls = PASS_REGISTRY.get(repro.pass_name)
    if cls is None:
        raise AccyError(f"unknown pass '{repro.pass_name}' in reproducer")
    module = parse_module(repro.ir, "<reproducer>")
    verify(module)
    p = cls(**repro.pass_options)
    PassManager(repro.pipeline, (p,)).run(module)
