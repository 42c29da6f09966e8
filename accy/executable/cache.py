"""``FragmentCompilerCache``: one program's preparation cache plus its loaded fragment.

As in the seed's ``compiler.zig``: a refresh forks the preparation cache,
prepares on the fork, compiles the target product (a compile whose key is
already known — in memory or in the store — is reused), loads the fragment
(a process reuses its own loaded fragment while the compile key is
unchanged), and only then swaps the fork and the new fragment in. A failure
anywhere — a pass, the compiler, the loader — leaves the previous
preparation and fragment current.

Example
-------
>>> from accy.preparation.products import SemanticModule
>>> from accy.preparation.stages import PreparationRequest
>>> cache = FragmentCompilerCache()
>>> # update = cache.refresh_from_semantic_module(SemanticModule.from_file("graphs/softmax.mlir"),
>>> #                                             PreparationRequest(shapes={0: (8, 4096)}))
>>> # update.fragment(x)[0]
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

from accy.executable.compile import (
    CompiledFragment,
    check_fragment,
    compile_fragment,
    compile_key,
)
from accy.executable.fragment import LoadedFragment, load_fragment
from accy.preparation.admission import read_back, write
from accy.preparation.cache import BackendPreparationCache, PreparationUpdate
from accy.preparation.products import Revision, SemanticModule, TargetJob
from accy.preparation.report import PreparationReport, Receipt
from accy.preparation.stages import PreparationRequest
from accy.target.backend import backend_of


@dataclass
class FragmentCompilerCacheUpdate:
    """What a successful refresh produced."""

    preparation: PreparationUpdate
    compiled: CompiledFragment
    fragment: LoadedFragment | None
    """The loaded fragment (None when the load was skipped: a CUDA fragment, no GPU)."""
    report: PreparationReport


def _gpu_available() -> bool:
    from accy.executable.device import gpu_available

    return gpu_available()


class FragmentCompilerCache:
    """Recompile and reload one program cheaply as it changes.

    Parameters
    ----------
    store
        Optional persistent store shared by stage products and compiled
        fragments (``accy compile --cache DIR``).
    workspace
        Where sources, binaries and reproducers are written (default: builds in
        this process's private directory, reproducers in the user's folder; see
        :mod:`accy.paths`).
    load
        Load the fragment after compiling (a compile-only refresh reports the
        load as skipped).
    """

    def __init__(self, store: Any | None = None, workspace: str | None = None,
                 load: bool = True) -> None:
        self.store = store
        self.workspace = workspace  # None: accy.paths decides (private builds, user reproducers)
        self.load = load
        self.preparation_cache = BackendPreparationCache(store=store)
        self.loaded: LoadedFragment | None = None
        self.compiled: CompiledFragment | None = None
        self._compiled: dict[str, CompiledFragment] = {}

    def current_prepared(self) -> TargetJob | None:
        return self.preparation_cache.current_prepared()

    def current_fragment(self) -> LoadedFragment | None:
        return self.loaded

    def refresh_from_semantic_module(self, module: SemanticModule,
                                     request: PreparationRequest) -> FragmentCompilerCacheUpdate:
        return self._refresh(module, request)

    def refresh_from_semantic_revision(self, revision: Revision,
                                       request: PreparationRequest) -> FragmentCompilerCacheUpdate:
        return self._refresh(revision, request)

    def _refresh(self, source: SemanticModule | Revision,
                 request: PreparationRequest) -> FragmentCompilerCacheUpdate:
        staged = self.preparation_cache.fork()
        update = staged.refresh(source, request, self.workspace)
        report = update.report
        compiled = self._compile(update.prepared, report)
        loaded = self._load(compiled, report)
        # everything succeeded: swap both in
        self.preparation_cache = staged
        self.compiled = compiled
        self.loaded = loaded
        return FragmentCompilerCacheUpdate(update, compiled, loaded, report)

    def _compile(self, job: TargetJob, report: PreparationReport) -> CompiledFragment:
        t0 = time.perf_counter_ns()
        key = compile_key(job)
        compiled = self._compiled.get(key.hex)
        source = "memory"
        if compiled is None:
            compiled, _ = read_back(self.store, key.hex, "fragment", CompiledFragment.from_wire,
                                    functools.partial(check_fragment, key=key))
            source = "store"
        if compiled is not None:
            report.add(Receipt("compile", key.hex, True, time.perf_counter_ns() - t0,
                               source=source))
        else:
            compiled = compile_fragment(job, self.workspace, key, self.store)
            reused = int(compiled.meta.get("binary") == "reused")
            report.add(Receipt("compile", key.hex, False, compiled.elapsed_ns,
                               pass_stats={"compile": {"binary_bytes": len(compiled.binary),
                                                       "binary_reused": reused}},
                               warning=write(self.store, key.hex, compiled, "fragment")))
        self._compiled[key.hex] = compiled
        return compiled

    def _load(self, compiled: CompiledFragment, report: PreparationReport) \
            -> LoadedFragment | None:
        if not self.load:
            report.add(Receipt("load", compiled.key.hex, False, 0, skipped="not requested"))
            return None
        if backend_of(compiled.plan.target).needs_gpu and not _gpu_available():
            report.add(Receipt("load", compiled.key.hex, False, 0, skipped="no GPU"))
            return None
        t0 = time.perf_counter_ns()
        loaded, reused = load_fragment(compiled, self.workspace)
        report.add(Receipt("load", compiled.key.hex, reused, time.perf_counter_ns() - t0))
        return loaded
