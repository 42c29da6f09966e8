"""The pipeline: one ordered table of stages that every driver iterates.

::

    stage     input → product                 what it does (recipe)        key reads
    contract  SemanticModule → ContractJob    bind shapes, fold, CSE, DCE  contract.*, shapes
    tensor    ContractJob → TensorJob         decompose, lower to prim     tensor.*
    dispatch  TensorJob → DispatchJob         fuse into launch regions     dispatch.*
    memory    DispatchJob → MemoryJob         plan global buffers          memory.*
    kernel    MemoryJob → KernelJob           loop nests, thread mapping   kernel.*, target kind
    target    KernelJob → TargetJob           C / CUDA source + launches   target.*, target
    ── appended by the target's backend (accy.target.backend) ──
    compile   TargetJob → CompiledFragment    cc / NVRTC                   compiler, flags, arch
    load      CompiledFragment → Loaded…      ctypes / CuPy (per process)  compile key

The local caches (:mod:`accy.preparation.cache`, :mod:`accy.executable.cache`),
the Dask graph and its worker tasks (:mod:`accy.distributed`), ``accy opt
--to/--from``, the reports and the dashboard all read this table; nothing
else lists the stages.

A stage's **key** is ``H(stage, version, input, every option it reads)``
(:meth:`Stage.key`), its **version** follows its code (:attr:`Stage.version`:
the source of the driver, the stage's own recipe function and everything
they import — :func:`accy.preparation.keys.import_closure`), so editing a
module a stage can reach re-keys that stage and the stages after it that
read its product, and nothing before it.

Example
-------
>>> [s.name for s in preparation()]
['contract', 'tensor', 'dispatch', 'memory', 'kernel', 'target']
>>> from accy.preparation.options import RunOptions
>>> [s.name for s in stages_for(RunOptions.parse("host"))][-2:]
['compile', 'load']
>>> stage("kernel").input.__name__, stage("kernel").product.__name__
('MemoryJob', 'KernelJob')
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accy.choir.passes import Pass, PassContext, PassManager, Reproducer
from accy.choir.passes import replay as replay_pass
from accy.errors import OptionError
from accy.preparation import recipe
from accy.preparation.keys import StageKey, code_version, function_imports, make_key
from accy.preparation.options import RunOptions
from accy.preparation.products import (
    ContractJob,
    DispatchJob,
    KernelJob,
    MemoryJob,
    Product,
    SemanticModule,
    TargetJob,
    TensorJob,
)
from accy.preparation.stages import PreparationRequest, StageResult, plan_fingerprint

Shapes = Mapping[int, tuple[int, ...]]

DRIVER = ("accy.pipeline", "accy.preparation.stages")
"""The code every stage run goes through (its version is in every stage's)."""


@dataclass(frozen=True)
class Stage:
    """One stage of the table."""

    name: str
    input: type
    product: type
    dialects: tuple[str, ...] = ()
    """The dialect modules of the IR it reads and makes (registered ops it sees
    without importing them; their code is part of its version)."""
    implementation: tuple[str, ...] = ()
    """Modules that implement it beyond its recipe function (compile, load)."""
    plans: bool = False
    """It makes plans (dispatch, memory, kernel): its receipt has a plan fingerprint."""
    manual: int = 1
    """Bumped by hand only to invalidate stored products without a code change."""

    @property
    def version(self) -> str:
        """``MANUAL-hash``: the manual number and the source of its code's import closure
        (computed once per process)."""
        return _version(self)

    @property
    def reads_shapes(self) -> bool:
        """Its key reads the argument shapes (contract: where the shapes enter)."""
        return self.name == "contract"

    def reads(self, options: RunOptions, shapes: Shapes | None = None) -> dict[str, Any]:
        """Every option this stage's key reads (the shapes for contract).

        Compile and load read the target and the flags it picks (fast math);
        compile's content key adds the compiler identity on the worker
        (:func:`accy.executable.compile.compile_key`)."""
        if self.name not in PREPARATION_NAMES:
            return {"target": str(options.target),
                    "fast_math": options.target_options.fast_math}
        opts = options.stage_key_fields(self.name)
        if self.reads_shapes:
            opts = dict(opts, shapes={f"arg{i}": list(s)
                                      for i, s in sorted((shapes or {}).items())})
        return opts

    def template(self, options: RunOptions, shapes: Shapes | None = None) -> dict[str, Any]:
        """The key's fields except its input: stage, version and the options it reads."""
        return {"stage": self.name, "version": self.version, "options": self.reads(options,
                                                                                 shapes)}

    def key(self, input_fingerprint: str, options: RunOptions,
            shapes: Shapes | None = None) -> StageKey:
        """The content key of running this stage on an input with ``input_fingerprint``."""
        return make_key(dict(self.template(options, shapes), input=input_fingerprint))

    def derived_key(self, after: str, options: RunOptions,
                    shapes: Shapes | None = None) -> StageKey:
        """The key of running this stage on whatever the run keyed ``after`` makes.

        A graph names a task before its input exists; the input is then known
        only by the key of the task that makes it. The field is ``after``,
        never ``input``, so a derived key can never equal a content key.
        """
        return make_key(dict(self.template(options, shapes), after=after))

    def passes(self, options: RunOptions, shapes: Shapes | None = None) -> tuple[Pass, ...]:
        """The stage's pipeline for these options (:mod:`accy.preparation.recipe`)."""
        return recipe.configure(self.name, options, shapes)

    def run(self, prev: Product, request: PreparationRequest,
            key: StageKey | None = None) -> StageResult:
        """Run the stage's pipeline on its input; raise ``PassFailedError`` on failure."""
        if not isinstance(prev, self.input):
            raise TypeError(f"the {self.name} stage takes a {self.input.__name__}, got "
                            f"{type(prev).__name__}")
        prev.verify()
        if key is None:
            key = self.key(prev.fingerprint(), request.options, request.shapes)
        module = prev.clone_module()
        pm = PassManager(self.name, self.passes(request.options, request.shapes),
                         limits=request.limits, record_bytes=request.record_bytes)
        t0 = time.perf_counter_ns()
        # the input product stays untouched: a reproducer replays from a clone of it
        result = pm.run(module, PassContext(), source=prev.clone_module)
        elapsed = time.perf_counter_ns() - t0
        product = self.product(module, {"source": request.source, "variant": request.variant})
        plan = plan_fingerprint(self.name, product) if self.plans else None
        return StageResult(self.name, key, product, elapsed, result.stats, result.pass_ns, plan)


@functools.cache
def _version(stage: Stage) -> str:
    roots = DRIVER + stage.dialects + stage.implementation
    if stage.name in PREPARATION_NAMES:
        roots += ("accy.preparation.recipe",) + function_imports("accy.preparation.recipe",
                                                                 stage.name)
    return f"{stage.manual}-{code_version(tuple(sorted(set(roots))))}"


PREPARATION: tuple[Stage, ...] = (
    Stage("contract", SemanticModule, ContractJob, ("accy.dialects.semantic",)),
    Stage("tensor", ContractJob, TensorJob, ("accy.dialects.semantic", "accy.dialects.prim")),
    Stage("dispatch", TensorJob, DispatchJob, ("accy.dialects.prim", "accy.dialects.dispatch"),
          plans=True),
    Stage("memory", DispatchJob, MemoryJob, ("accy.dialects.prim", "accy.dialects.dispatch"),
          plans=True),
    Stage("kernel", MemoryJob, KernelJob, ("accy.dialects.prim", "accy.dialects.dispatch",
                                           "accy.dialects.kernel"), plans=True),
    Stage("target", KernelJob, TargetJob, ("accy.dialects.prim", "accy.dialects.kernel")),
)
"""The six preparation stages, in order: the same for every target."""

PREPARATION_NAMES = tuple(s.name for s in PREPARATION)

TAIL: tuple[Stage, ...] = (
    Stage("compile", TargetJob, object, implementation=(
        "accy.executable.compile", "accy.target.backend", "accy.executable.device")),
    Stage("load", object, object, implementation=(
        "accy.executable.fragment", "accy.executable.device")),
)
"""What every backend appends (compile and load run through its compiler and loader)."""

_BY_NAME = {s.name: s for s in PREPARATION + TAIL}

STAGE_NAMES: tuple[str, ...] = tuple(_BY_NAME)
"""Every stage, in order: contract … target, compile, load (receipts, dashboard)."""


def preparation() -> tuple[Stage, ...]:
    """The six preparation stages."""
    return PREPARATION


def stages_for(options: RunOptions) -> tuple[Stage, ...]:
    """The whole table for a variant: preparation plus its backend's tail."""
    return PREPARATION + TAIL


def stage(name: str) -> Stage:
    """The stage called ``name``; an :class:`OptionError` naming the stages otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise OptionError(f"unknown stage '{name}' (stages: {', '.join(STAGE_NAMES)})") \
            from None


def after(name: str) -> Stage | None:
    """The preparation stage after ``name`` (None after target)."""
    i = PREPARATION_NAMES.index(name)
    return PREPARATION[i + 1] if i + 1 < len(PREPARATION) else None


def run_stage(name: str | Stage, prev: Product, request: PreparationRequest,
              key: StageKey | None = None) -> StageResult:
    """Run one preparation stage on its input product."""
    s = name if isinstance(name, Stage) else stage(name)
    return s.run(prev, request, key)


def prepare_through(start: Product, last: str, options: RunOptions, shapes: Shapes,
                    request: PreparationRequest | None = None) -> StageResult:
    """Run every stage after ``start``'s stage through ``last``; return the last result.

    ``start`` is a semantic module (contract is the first stage run) or any
    stage's product (``accy opt --from``: the stages after it run).
    """
    req = request or PreparationRequest(source=start.meta.get("source", "<program>"),
                                        options=options, shapes=dict(shapes))
    todo = PREPARATION[_first_after(start):PREPARATION_NAMES.index(stage(last).name) + 1]
    if not todo:
        raise OptionError(f"the {type(start).__name__} is already past the {last} stage")
    product = start
    result: StageResult | None = None
    for s in todo:
        result = s.run(product, req)
        product = result.product
    assert result is not None
    return result


def _first_after(product: Product) -> int:
    for i, s in enumerate(PREPARATION):
        if isinstance(product, s.input) and type(product) is s.input:
            return i
    raise OptionError(f"no stage takes a {type(product).__name__}")


def load_passes() -> None:
    """Import every stage's passes (explicitly, for replaying a reproducer)."""
    for s in PREPARATION:
        s.passes(RunOptions())


def replay(repro: Reproducer) -> None:
    """Replay a failing pass's reproducer; raises the same ``PassFailedError``."""
    load_passes()
    replay_pass(repro)


__all__ = ["Stage", "PREPARATION", "TAIL", "STAGE_NAMES", "preparation", "stages_for",
           "stage", "after", "run_stage", "prepare_through", "load_passes", "replay"]
