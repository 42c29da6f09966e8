"""The per-program preparation cache (the seed's ``BackendPreparationCache``).

A :class:`BackendPreparationCache` holds the stage results of one program by
key and the *current chain*: the key of each stage of the last refresh that
succeeded. A refresh walks the six stages in order. For each it computes the
stage key from the input's fingerprint and the options the stage reads, and
the **admission check** reuses a cached result only if its key matches and
its product still verifies (one that does not is dropped and the stage runs
again). **Early cutoff** falls out of the keys: when a stage runs again but
produces the same output fingerprint, the next stage's key is unchanged and
it is reused.

Forking and swapping. A refresh never changes the current chain until every
stage has succeeded, but it does add the results it made to the cache it runs
on. The caller therefore refreshes a :meth:`~BackendPreparationCache.fork` (a
cheap copy: products are immutable and shared) and swaps the fork in only
when everything downstream (compile, load) also succeeded — exactly what the
fragment compiler cache does::

    staged = cache.fork()
    update = staged.refresh_from_semantic_module(module, request)   # may raise
    ... compile and load update.prepared ...                        # may raise
    cache = staged                                                  # swap

A failing stage raises :class:`PreparationFailed`, carrying the
:class:`~accy.preparation.report.BackendPreparationFailure` (its reproducer
already written) and the receipts of the stages before it.

Example
-------
>>> from accy.preparation.products import SemanticModule
>>> from accy.preparation.stages import PreparationRequest
>>> sm = SemanticModule.from_file("graphs/softmax.mlir")  # doctest: +SKIP
>>> cache = BackendPreparationCache()
>>> req = PreparationRequest(shapes={0: (8, 4096)})
>>> cache.refresh_from_semantic_module(sm, req).report.ran()  # doctest: +SKIP
6
>>> cache.refresh_from_semantic_module(sm, req).report.reused()  # doctest: +SKIP
6
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from accy.errors import AccyError, PassFailedError
from accy.pipeline import preparation
from accy.preparation import keys
from accy.preparation.admission import check_stage_result, read_stage_result, write
from accy.preparation.keys import StageKey
from accy.preparation.products import Product, Revision, SemanticModule, TargetJob
from accy.preparation.report import BackendPreparationFailure, PreparationReport, Receipt
from accy.preparation.stages import PreparationRequest, StageResult

DEFAULT_CAPACITY = 256
"""Stage results a cache keeps (least recently used beyond it are dropped)."""


class PreparationFailed(AccyError):
    """A stage of a refresh failed; the cache's current chain is unchanged.

    Attributes
    ----------
    failure
        The pipeline, failing pass, message and reproducer path.
    report
        The receipts of the stages that completed before the failure.
    error
        The :class:`~accy.errors.PassFailedError` the stage raised.
    """

    def __init__(self, failure: BackendPreparationFailure, report: PreparationReport,
                 error: PassFailedError | None = None) -> None:
        where = f" (reproducer: {failure.reproducer_path})" if failure.reproducer_path else ""
        message = error.message if error is not None else \
            f"pipeline '{failure.pipeline}', pass '{failure.pass_name}': {failure.message}"
        super().__init__(f"the {failure.stage} stage failed: {message}{where}",
                         getattr(error, "loc", None))
        self.failure = failure
        self.report = report
        self.error = error

    @property
    def stage(self) -> str:
        return self.failure.stage


@dataclass
class PreparationUpdate:
    """What a refresh made: the prepared target job, every stage's result, the receipts."""

    prepared: TargetJob
    results: dict[str, StageResult]
    """Stage → its result (reused or new), contract … target."""
    report: PreparationReport

    @property
    def keys(self) -> dict[str, str]:
        """Stage → key hex of this refresh's chain."""
        return {s: r.key.hex for s, r in self.results.items()}


class BackendPreparationCache:
    """One program's stage results by key, and the chain of its last successful refresh.

    Parameters
    ----------
    capacity
        How many stage results to keep; the least recently used beyond it are
        dropped (the current chain is never dropped).
    store
        An optional persistent store (``get(key) -> bytes | None``,
        ``put(key, bytes, kind)``): a memory miss looks there (receipt source
        ``store``) and every stage run is written there.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY, store: Any | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"a preparation cache needs a capacity of at least 1, not {capacity}")
        self.capacity = capacity
        self.store = store
        self._entries: OrderedDict[str, StageResult] = OrderedDict()
        self.current: dict[str, str] = {}
        """Stage → key hex of the last successful refresh."""
        self._published: dict[str, dict[str, Any]] = {}
        """Stage → the fields of the current key (to explain a miss)."""
        self._rejected: dict[str, str] = {}
        """Key hex → why its entry failed the admission check (until the next miss reads it)."""

    # -- copies
    def fork(self) -> BackendPreparationCache:
        """A copy to refresh; the original sees nothing the fork does afterwards.

        Products are immutable, so the stage results are shared; only the
        indexes are copied.
        """
        other = BackendPreparationCache(self.capacity, self.store)
        other._entries = OrderedDict(self._entries)
        other.current = dict(self.current)
        other._published = {s: dict(f) for s, f in self._published.items()}
        return other

    # -- reading
    def current_result(self, stage: str) -> StageResult | None:
        """The result of ``stage`` in the current chain, if there is one."""
        key = self.current.get(stage)
        return self._entries.get(key) if key is not None else None

    def current_prepared(self) -> TargetJob | None:
        """The target job of the last successful refresh, if any."""
        result = self.current_result("target")
        if result is None:
            return None
        assert isinstance(result.product, TargetJob)
        return result.product

    def published_fields(self, stage: str) -> dict[str, Any] | None:
        """The key fields of ``stage`` in the current chain (for :func:`keys.explain`)."""
        fields = self._published.get(stage)
        return dict(fields) if fields is not None else None

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        hex_ = key.hex if isinstance(key, StageKey) else key
        return hex_ in self._entries

    # -- the admission check and its bookkeeping
    def admit(self, key: StageKey) -> StageResult | None:
        """The cached result for ``key`` if it passes the admission check, else None.

        A result is admitted only when it was stored under this key, is a
        result of the key's stage, and its product verifies. A result that
        fails is dropped (why is kept for :meth:`miss_reason`).
        """
        result = self._entries.get(key.hex)
        if result is None:
            return None
        why = check_stage_result(result, key)
        if why is not None:  # a broken entry never blocks a refresh: run the stage again
            del self._entries[key.hex]
            self._rejected[key.hex] = why
            return None
        self._entries.move_to_end(key.hex)
        return result

    def admit_from_store(self, key: StageKey) -> StageResult | None:
        """The persistent store's result for ``key``, admitted like a memory entry."""
        if self.store is None:
            return None
        result, why = read_stage_result(self.store, key)
        if result is None:
            if why not in ("not stored", "no store"):
                self._rejected[key.hex] = str(why)
            return None
        self.put(result)
        return result

    def miss_reason(self, key: StageKey, stage: str) -> str:
        """Why ``stage`` must run under ``key``: the changed key fields, or a dropped entry."""
        reason = keys.explain(key, self._published.get(stage))
        rejected = self._rejected.pop(key.hex, None)
        if rejected is not None:
            return f"{reason}; cached product failed the admission check ({rejected})"
        if reason == "same key":
            return "same key; the cached product was evicted"
        return reason

    def put(self, result: StageResult) -> None:
        """Keep ``result`` under its key (most recently used)."""
        self._entries[result.key.hex] = result
        self._entries.move_to_end(result.key.hex)

    def publish(self, results: Mapping[str, StageResult]) -> None:
        """Make ``results`` the current chain, then trim to the capacity."""
        for r in results.values():
            self.put(r)
        self.current = {s: r.key.hex for s, r in results.items()}
        self._published = {s: dict(r.key.fields) for s, r in results.items()}
        self._evict()

    def _evict(self) -> None:
        pinned = set(self.current.values())
        for hex_ in list(self._entries):
            if len(self._entries) <= self.capacity:
                break
            if hex_ not in pinned:
                del self._entries[hex_]

    # -- refreshing
    def refresh_from_semantic_module(self, module: SemanticModule, request: PreparationRequest,
                                     artifact_dir: str | None = None) -> PreparationUpdate:
        """Prepare ``module`` for ``request``, reusing every stage whose key is cached.

        Parameters
        ----------
        module
            The program (a draft: it is only read).
        request
            Options, shape bindings, limits and names of this variant.
        artifact_dir
            Where a failing stage writes its reproducer (a temp dir by default).

        Raises
        ------
        PreparationFailed
            A stage failed; the current chain is unchanged.
        """
        return self._refresh(module.fingerprint(), lambda: module, request, artifact_dir)

    def refresh_from_semantic_revision(self, revision: Revision, request: PreparationRequest,
                                       artifact_dir: str | None = None) -> PreparationUpdate:
        """Like :meth:`refresh_from_semantic_module`, from a retained revision.

        The revision is decoded only if the contract stage has to run.
        """
        return self._refresh(revision.fingerprint, revision.module, request, artifact_dir)

    def refresh(self, source: SemanticModule | Revision, request: PreparationRequest,
                artifact_dir: str | None = None) -> PreparationUpdate:
        """Refresh from a semantic module or a revision."""
        if isinstance(source, Revision):
            return self.refresh_from_semantic_revision(source, request, artifact_dir)
        return self.refresh_from_semantic_module(source, request, artifact_dir)

    def _refresh(self, semantic_fingerprint: str, semantic: Callable[[], SemanticModule],
                 request: PreparationRequest, artifact_dir: str | None) -> PreparationUpdate:
        report = PreparationReport()
        results: dict[str, StageResult] = {}
        fingerprint = semantic_fingerprint
        prev: Product | None = None
        for stage in preparation():
            t0 = time.perf_counter_ns()
            key = stage.key(fingerprint, request.options, request.shapes)
            cached = self.admit(key)
            source = "memory"
            if cached is None:
                cached = self.admit_from_store(key)
                source = "store"
            if cached is not None:
                result = cached
                report.add(Receipt.reuse(result, time.perf_counter_ns() - t0, source))
            else:
                why = self.miss_reason(key, stage.name)
                if prev is None:
                    prev = semantic()
                try:
                    result = stage.run(prev, request, key)
                except PassFailedError as e:
                    failure = BackendPreparationFailure.from_error(e, stage.name, artifact_dir,
                                                                   key.hex)
                    raise PreparationFailed(failure, report, e) from e
                self.put(result)
                receipt = Receipt.ran(result, why)
                receipt.warning = write(self.store, key.hex, result, stage.name)
                report.add(receipt)
            results[stage.name] = result
            prev = result.product
            fingerprint = prev.fingerprint()
        self.publish(results)
        prepared = results["target"].product
        assert isinstance(prepared, TargetJob)
        return PreparationUpdate(prepared, results, report)


__all__ = ["BackendPreparationCache", "PreparationUpdate", "PreparationFailed",
           "DEFAULT_CAPACITY"]
