"""Compile a fragment: the target product's source → a cubin (NVRTC) or a shared object (cc).

A compiled fragment is an artifact, keyed and reused like a stage product:
its key hashes the target product's fingerprint, the compiler's identity and
version, the flags and the arch (DESIGN.md §1). It carries the binary bytes
and the :class:`FragmentPlan` (launch table and buffer plan), so it can be
stored, shipped to another process and loaded there.

Example
-------
>>> # from accy.pipeline import prepare_through
>>> # job = prepare_through(sm, "target", RunOptions(), {0: (8, 4096)}).product
>>> # compiled = compile_fragment(job, "/tmp/ws"); len(compiled.binary) > 0
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from accy.choir.attributes import (
    ArrayAttr,
    Attribute,
    BoolAttr,
    DenseArrayAttr,
    DictAttr,
    IntegerAttr,
    StringAttr,
    TensorType,
)
from accy.dialects.memory import BufferSpec
from accy.errors import AccyError, FragmentCompileError, VerifyError, WireFormatError
from accy.paths import private_subdir
from accy.pipeline import stage
from accy.preparation.admission import read_back, write
from accy.preparation.keys import StageKey, make_key
from accy.preparation.products import TargetJob
from accy.target.backend import Backend, backend_of


def _plain(a: Attribute) -> Any:
    if isinstance(a, (IntegerAttr, StringAttr, BoolAttr)):
        return a.value
    if isinstance(a, DenseArrayAttr):
        return list(a.values)
    if isinstance(a, ArrayAttr):
        return [_plain(v) for v in a.values]
    if isinstance(a, DictAttr):
        return {k: _plain(v) for k, v in a.entries}
    raise TypeError(f"unexpected plan attribute {a!r}")


@dataclass(frozen=True)
class Launch:
    """One row of the launch table: which kernel, its geometry, the buffers it reads
    and writes (ids in the buffer plan)."""

    kernel: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    shared_bytes: int
    buffers: tuple[int, ...]
    dynamic_shared: int = 0
    """Dynamic shared memory passed at launch (the kernel's limit raised to it first)."""
    tensor_maps: tuple[tuple[int, ...], ...] = ()
    """TMA tensor maps the loader encodes and passes after the buffers: (position in
    ``buffers``, rows, cols, box rows, box cols) of a 2-d row-major operand."""
    scalars: tuple[int, ...] = ()
    """64-bit values passed last (``accy.target.cuda.launch_scalars``: the extents a
    kernel takes as parameters, so its source does not depend on them)."""

    def to_plain(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "grid": list(self.grid), "block": list(self.block),
                "shared_bytes": self.shared_bytes, "dynamic_shared": self.dynamic_shared,
                "buffers": list(self.buffers),
                "tensor_maps": [list(t) for t in self.tensor_maps],
                "scalars": list(self.scalars)}

    @staticmethod
    def from_plain(d: Mapping[str, Any]) -> Launch:
        """A launch from its plain fields; a ``WireFormatError`` if any is missing,
        unknown or of the wrong type."""
        if set(d) != _LAUNCH_FIELDS:
            raise WireFormatError(f"launch table entry has fields {sorted(d)}, expected "
                                  f"{sorted(_LAUNCH_FIELDS)}")
        try:
            launch = Launch(str(d["kernel"]), tuple(int(x) for x in d["grid"]),
                            tuple(int(x) for x in d["block"]), int(d["shared_bytes"]),
                            tuple(int(x) for x in d["buffers"]), int(d["dynamic_shared"]),
                            tuple(tuple(int(x) for x in t) for t in d["tensor_maps"]),
                            tuple(int(x) for x in d["scalars"]))
        except (TypeError, ValueError):
            raise WireFormatError("malformed launch table entry") from None
        if len(launch.grid) != 3 or len(launch.block) != 3:
            raise WireFormatError("a launch needs a 3-d grid and block")
        if any(len(t) != 5 or not 0 <= t[0] < len(launch.buffers) for t in launch.tensor_maps):
            raise WireFormatError("malformed tensor map in a launch")
        return launch


_LAUNCH_FIELDS = frozenset({"kernel", "grid", "block", "shared_bytes", "dynamic_shared",
                            "buffers", "tensor_maps", "scalars"})


def _buffers(entries: list[Any]) -> list[BufferSpec]:
    try:
        return [BufferSpec.from_plain(e) for e in entries]
    except VerifyError as e:
        raise WireFormatError(f"malformed buffer plan: {e.message}") from None


@dataclass
class FragmentPlan:
    """What a loader needs besides the binary: launches, buffers, signature."""

    target: str
    language: str
    launches: list[Launch]
    buffers: list[BufferSpec]
    arena_bytes: int
    args: list[tuple[list[int], str]]
    results: list[tuple[list[int], str]]
    fast_math: bool = False

    @staticmethod
    def of(job: TargetJob) -> FragmentPlan:
        attrs = job.module.attributes
        entry = job.entry()
        ftype = entry.function_type

        def sig(types: tuple[Any, ...]) -> list[tuple[list[int], str]]:
            out = []
            for t in types:
                assert isinstance(t, TensorType)
                out.append(([int(d) for d in t.shape], t.element.name))  # type: ignore[arg-type]
            return out

        fm = attrs.get("target.fast_math")
        return FragmentPlan(
            target=_plain(attrs["target.target"]), language=_plain(attrs["target.language"]),
            launches=[Launch.from_plain(d) for d in _plain(attrs["target.launches"])],
            buffers=_buffers(_plain(attrs["target.buffers"])),
            arena_bytes=_plain(attrs["target.arena_bytes"]), args=sig(ftype.inputs),
            results=sig(ftype.results), fast_math=bool(fm.value) if isinstance(fm, BoolAttr)
            else False)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "language": self.language,
                "launches": [launch.to_plain() for launch in self.launches],
                "buffers": [b.to_plain() for b in self.buffers], "arena_bytes": self.arena_bytes,
                "args": [list(a) for a in self.args], "results": [list(r) for r in self.results],
                "fast_math": self.fast_math}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> FragmentPlan:
        return FragmentPlan(d["target"], d["language"],
                            [Launch.from_plain(launch) for launch in d["launches"]],
                            _buffers(d["buffers"]),
                            d["arena_bytes"], [(list(a[0]), a[1]) for a in d["args"]],
                            [(list(r[0]), r[1]) for r in d["results"]], d.get("fast_math", False))


@dataclass
class CompiledFragment:
    """A compiled artifact: binary bytes + plan, under its compile key."""

    key: StageKey
    plan: FragmentPlan
    binary: bytes
    source: str
    elapsed_ns: int = 0
    source_path: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> bytes:
        return msgpack.packb([b"accy-fragment", self.key.hex, self.key.fields,
                              self.plan.to_dict(), self.binary, self.source, self.elapsed_ns],
                             use_bin_type=True)

    @staticmethod
    def from_wire(data: bytes) -> CompiledFragment:
        try:
            tag, hexkey, fields, plan, binary, source, elapsed = msgpack.unpackb(
                bytes(data), raw=False, strict_map_key=True)
            if tag != b"accy-fragment" or not isinstance(binary, bytes):
                raise ValueError("tag")
            return CompiledFragment(StageKey(hexkey, fields), FragmentPlan.from_dict(plan),
                                    binary, source, int(elapsed))
        except Exception as e:
            raise WireFormatError(f"malformed compiled fragment: {type(e).__name__}") from None

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError("CompiledFragment never pickles: it travels as msgpack")


def fragment_backend(job: TargetJob) -> Backend:
    """The backend a target product was emitted for (its ``target.target`` attribute)."""
    target = job.module.attributes.get("target.target")
    if not isinstance(target, StringAttr):
        raise FragmentCompileError("the target product names no target")
    return backend_of(target.value)


def compile_key(job: TargetJob) -> StageKey:
    """H(target product fingerprint, compiler identity and version, flags, arch).

    The one compile key: the local cache and the cluster's compile tasks both
    read back and store fragments under it.
    """
    backend = fragment_backend(job)
    fm = job.module.attributes.get("target.fast_math")
    fast = bool(fm.value) if isinstance(fm, BoolAttr) else False
    return make_key({"stage": "compile", "version": stage("compile").version,
                     "input": job.fingerprint(), "compiler": backend.compiler_identity(),
                     "flags": list(backend.flags(fast)), "arch": backend.arch})


def check_fragment(compiled: CompiledFragment, key: StageKey) -> str | None:
    """Why ``compiled`` may not be loaded for ``key`` (None: it may)."""
    if compiled.key.hex != key.hex:
        return f"entry was made for compile key {compiled.key.hex[:12]}, not {key.hex[:12]}"
    if compiled.key.fields.get("input") != key.fields.get("input"):
        return "entry was compiled from another target product"
    if not compiled.binary:
        return "entry holds no binary"
    return None


def binary_key(backend: Backend, source: str, flags: Sequence[str]) -> str:
    """H(compiler identity and version, arch, flags, the unit's source): everything a
    compiler run's binary depends on. Fragments whose target products differ only in
    what the loader passes (grid, buffer sizes, launch scalars) share it, so one
    compile serves every row count of a program (:func:`accy.target.cuda.launch_scalars`)."""
    h = hashlib.blake2b(digest_size=20)
    for part in (backend.compiler_identity(), backend.arch, "\0".join(flags), source):
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()


Reused = tuple[bytes, int | None]
"""A compiler run's binary and the unit that holds a source's kernels in it: None
compiled alone (their own names), ``i`` the ``i``-th unit of a shared program
(renamed with ``GROUP_PREFIX.format(i)``)."""


class BinaryMemo:
    """The binaries this process compiled, by :func:`binary_key` (:data:`Reused`).
    Bounded (least recently used out), and safe across a worker's threads. A cache tier
    like the store, below it: a source compiled before in this process is not compiled
    again."""

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self._entries: collections.OrderedDict[str, Reused] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Reused | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
            return hit

    def put(self, key: str, binary: bytes, unit: int | None) -> None:
        with self._lock:
            self._entries[key] = (binary, unit)
            self._entries.move_to_end(key)
            while len(self._entries) > self.limit:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


BINARIES = BinaryMemo()
"""This process's :class:`BinaryMemo` (``BINARIES.clear()`` makes the next compile cold)."""


def _stored_binary(store: Any, key: str) -> Reused | None:
    def decode(data: bytes) -> Reused:
        try:
            tag, binary, unit = msgpack.unpackb(bytes(data), raw=False)
            if tag != b"accy-binary" or not isinstance(binary, bytes) or not binary or \
                    not (unit is None or isinstance(unit, int)):
                raise ValueError("tag")
        except Exception as e:
            raise WireFormatError(f"malformed binary entry: {type(e).__name__}") from None
        return binary, unit

    hit, _ = read_back(store, key, "binary", decode, lambda _: None)
    return hit


def reused_binary(key: str, store: Any = None) -> Reused | None:
    """The binary compiled before for binary key ``key``: from this process's memo, or
    from ``store`` (then remembered)."""
    hit = BINARIES.get(key)
    if hit is None and store is not None:
        hit = _stored_binary(store, key)
        if hit is not None:
            BINARIES.put(key, *hit)
    return hit


def remember_binary(key: str, binary: bytes, unit: int | None, store: Any = None) -> None:
    """Keep a compiler run's binary for ``key`` in the memo and, given one, the store."""
    BINARIES.put(key, binary, unit)
    if store is not None:
        write(store, key, msgpack.packb([b"accy-binary", binary, unit], use_bin_type=True),
              "binary")


def _unit(source: str, plan: FragmentPlan, unit: int | None) -> str:
    """A fragment's own source as its kernels are named in a binary (unit ``unit``)."""
    if unit is None:
        return source
    return grouped_unit(source, [launch.kernel for launch in plan.launches], unit)


def _renamed(plan: FragmentPlan, unit: int | None) -> FragmentPlan:
    """``plan`` with its launches naming their kernels as unit ``unit`` of a program."""
    if unit is not None:
        prefix = GROUP_PREFIX.format(unit)
        plan.launches = [dataclasses.replace(launch, kernel=prefix + launch.kernel)
                         for launch in plan.launches]
    return plan


def compile_fragment(job: TargetJob, workspace: str | None = None,
                     key: StageKey | None = None, store: Any = None) -> CompiledFragment:
    """Compile a target product; errors are ``FragmentCompileError`` with the log. A
    source this process (or ``store``) compiled before reuses that binary
    (``meta["binary"] == "reused"``)."""
    backend = fragment_backend(job)
    plan = FragmentPlan.of(job)
    source = job.source
    key = key or compile_key(job)
    flags = backend.flags(plan.fast_math)
    t0 = time.perf_counter_ns()
    bkey = binary_key(backend, source, flags)
    hit = reused_binary(bkey, store)
    if hit is not None:
        got, at = hit
        return CompiledFragment(key, _renamed(plan, at), got, _unit(source, plan, at),
                                time.perf_counter_ns() - t0, None, {"binary": "reused"})
    ws = os.path.join(workspace, key.hex[:16]) if workspace else \
        private_subdir(f"fragment-{key.hex[:16]}-")
    os.makedirs(ws, exist_ok=True)
    binary, src_path = backend.compile(source, ws, flags, split=True)
    elapsed = time.perf_counter_ns() - t0
    if not binary:
        raise FragmentCompileError("the compiler produced no binary", source_path=src_path)
    remember_binary(bkey, binary, None, store)
    return CompiledFragment(key, plan, binary, source, elapsed, src_path)


GROUP_SOURCES_ENV = "ACCY_GROUP_SOURCES"
"""``0``: a compile group gives each distinct CUDA source an NVRTC program of its own
(:func:`group_sources`); anything else, or unset: one program for all of them."""


def group_sources() -> bool:
    """Whether :func:`compile_fragments` compiles a group's distinct CUDA sources as one
    NVRTC program (the default) or each as its own (``ACCY_GROUP_SOURCES=0``, read at
    each call: a cluster's workers inherit it from the process that starts them).

    One program pays NVRTC's per-program cost once: a 480-variant shared sweep on the
    2-core machine spent 4.6–6.1 s in NVRTC for 17–18 programs of ~100 kernels, each
    source apart 7.3–8.0 s for 109 programs. A source's own program is the text a plain
    ``compile_fragment`` (or a process pool) compiles, so where NVRTC keeps what it built
    in the driver's compute cache (the GPU hosts) a source any process compiled before
    is served from it, while a group's program is a new text whenever the group holds a
    new mix of sources. On an H100 host the first repeat of a shared sweep then ran
    faster apart, but the later ones, whose group programs the cache served, slower
    (twice the programs): grouped stays the default (RESULTS.md, batch, thirtieth
    session).

    >>> import os; os.environ.pop(GROUP_SOURCES_ENV, None); group_sources()
    True
    """
    return os.environ.get(GROUP_SOURCES_ENV, "1").strip() != "0"


def shared_program(backend: Backend, fast_math: bool) -> tuple[str, tuple[str, ...]] | None:
    """What fragments must have in common to compile in one program: their backend and
    flags (CUDA: one NVRTC program); None where each compiles alone (the host's C). A
    batch groups the chains that share one in a task (whatever :func:`group_sources`
    says: a task compiles its chains' sources once each either way)."""
    return (backend.name, backend.flags(fast_math)) if backend.language == "cuda" else None


GROUP_PREFIX = "accy_g{}_"
"""How :func:`compile_fragments` renames fragment ``i``'s kernels in a shared program."""


def grouped_unit(source: str, kernels: Sequence[str], i: int) -> str:
    """Fragment ``i``'s translation unit as a part of a shared program: its kernels
    renamed ``accy_g<i>_<name>`` (``extern "C"`` names share one scope) and the rest —
    helpers, tables — in a namespace of its own. It still compiles alone.

    >>> print(grouped_unit('extern "C" __global__ void k0_rows() {}', ["k0_rows"], 2))
    #define k0_rows accy_g2_k0_rows
    namespace accy_g2 {
    extern "C" __global__ void k0_rows() {}
    }
    #undef k0_rows
    <BLANKLINE>
    """
    names = sorted(set(kernels))
    prefix = GROUP_PREFIX.format(i)
    return ("".join(f"#define {n} {prefix}{n}\n" for n in names)
            + f"namespace {prefix.rstrip('_')} {{\n{source}\n}}\n"
            + "".join(f"#undef {n}\n" for n in names))


def compile_fragments(jobs: Sequence[TargetJob], keys: Sequence[StageKey],
                      store: Any = None) -> list[CompiledFragment | AccyError]:
    """Compile several target products, CUDA ones of one arch and flags in one compiler
    run: one NVRTC program holding each distinct source once (:func:`grouped_unit`), its
    kernels renamed in the launch tables of the fragments that render it, the cubin
    shared (with ``ACCY_GROUP_SOURCES=0``, :func:`group_sources`, each distinct source
    in a program of its own instead, still once a process). NVRTC's cost is largely per
    program and per source, so a batch's compile tasks pay it once per group and once
    per source: fragments that differ only in
    what the loader passes (row counts) compile once. A source this process or
    ``store`` compiled before is not compiled at all (:func:`reused_binary`). A
    fragment's source is its own part (it compiles alone to the same kernels), its
    ``elapsed_ns`` its share of the run and ``meta["grain"]`` the group's size.

    If the shared run fails, each fragment of that group compiles alone, so an error
    belongs to the fragment that has it; host fragments always compile alone. Returns,
    in order, each compiled fragment or the error of its compile.
    """
    out: list[CompiledFragment | AccyError | None] = [None] * len(jobs)
    groups: dict[Any, list[int]] = {}
    apart = not group_sources()
    for i, job in enumerate(jobs):
        program = shared_program(fragment_backend(job), FragmentPlan.of(job).fast_math)
        groups.setdefault(("alone", i) if apart or program is None else program,
                          []).append(i)
    for members in groups.values():
        shared = _compile_shared([jobs[i] for i in members], [keys[i] for i in members],
                                 store) if len(members) > 1 else None
        if shared is not None:
            for i, compiled in zip(members, shared):
                out[i] = compiled
            continue
        for i in members:
            try:
                out[i] = compile_fragment(jobs[i], None, keys[i], store)
            except AccyError as e:
                out[i] = e
    return [c for c in out if c is not None]


def _compile_shared(jobs: Sequence[TargetJob], keys: Sequence[StageKey], store: Any = None) \
        -> list[CompiledFragment] | None:
    """One compiler run for the distinct sources of ``jobs`` (same backend and flags)
    that no earlier run made; None if it failed."""
    backend = fragment_backend(jobs[0])
    plans = [FragmentPlan.of(job) for job in jobs]
    flags = backend.flags(plans[0].fast_math)
    sources = [job.source
               for job in jobs]
    t0 = time.perf_counter_ns()
    bkeys = [binary_key(backend, source, flags) for source in sources]
    found: dict[str, Reused] = {}
    for bkey in bkeys:
        if bkey not in found:
            hit = reused_binary(bkey, store)
            if hit is not None:
                found[bkey] = hit
    unit: dict[str, int] = {}  # binary key → its unit in the new program
    parts: list[str] = []
    for bkey, source, plan in zip(bkeys, sources, plans):
        if bkey not in found and bkey not in unit:
            unit[bkey] = len(parts)
            parts.append(grouped_unit(source, [launch.kernel for launch in plan.launches],
                                      len(parts)))
    binary, src_path = b"", None
    if parts:
        ws = private_subdir(f"fragments-{keys[0].hex[:12]}-x{len(parts)}-")
        try:
            binary, src_path = backend.compile("".join(parts), ws, flags)
        except AccyError:
            return None
        for bkey, i in unit.items():
            remember_binary(bkey, binary, i, store)
    share = (time.perf_counter_ns() - t0) // len(jobs)
    out = []
    for bkey, source, plan, key in zip(bkeys, sources, plans, keys):
        if bkey in found:
            got, at = found[bkey]
            text = _unit(source, plan, at)
            out.append(CompiledFragment(key, _renamed(plan, at), got, text, share, None,
                                        {"grain": len(jobs), "binary": "reused"}))
            continue
        i = unit[bkey]
        out.append(CompiledFragment(key, _renamed(plan, i), binary, parts[i], share, src_path,
                                    {"grain": len(jobs), "units": len(parts)}))
    return out
