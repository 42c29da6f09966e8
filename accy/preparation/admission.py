"""The per-stage reuse decision, shared by the local caches and the Dask tasks.

Whoever holds a candidate product for a key — a cache's memory, the artifact
store, a worker's held result — asks the same questions before reusing it:

1. Was it made **for this key**? (The entry states its key and stage; an
   intact entry copied over another key's path is a miss, not a reuse.)
2. Does it still **verify**? (A stage product must verify; a compiled fragment
   must carry the key and plan it was compiled under.)

A store is only a cache tier: an unreadable, foreign or broken entry is a
miss with a reason (never an error), and a failed write is a warning on the
receipt (never a failed refresh). :func:`read_back` and :func:`write` are the
only code that reads or writes stage products and fragments in a store.

Example
-------
>>> class Store(dict):
...     def get(self, key, kind=None): return dict.get(self, key)
...     def put(self, key, data, kind=""): self[key] = data
...     def delete(self, key): self.pop(key, None)
>>> s = Store()
>>> read_back(s, "ab" * 16, "kernel", lambda b: b, lambda v: None)
(None, 'not stored')
>>> write(s, "ab" * 16, b"x", "kernel"), read_back(s, "ab" * 16, "kernel", lambda b: b,
...                                                 lambda v: None)
(None, (b'x', None))
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from accy.errors import AccyError
from accy.preparation.keys import StageKey
from accy.preparation.stages import StageResult

logger = logging.getLogger("accy.store")

T = TypeVar("T")


class Wire(Protocol):
    """What the store takes besides bytes: a value that encodes itself (a stage result,
    a compiled fragment)."""

    def to_wire(self) -> bytes: ...


def check_stage_result(result: StageResult, key: StageKey) -> str | None:
    """Why ``result`` may not be reused under ``key`` (None: it may). A deferred
    product is verified when it is first used (see :func:`read_stage_result`)."""
    if result.key.hex != key.hex:
        return f"entry was made for key {result.key.hex[:12]}, not {key.hex[:12]}"
    if result.stage != key.fields.get("stage"):
        return f"entry holds a {result.stage} result, not {key.fields.get('stage')}"
    if result.product.deferred:
        return None
    try:
        result.product.verify()
    except AccyError as e:
        return f"product does not verify: {e}"
    return None


def read_back(store: Any, key_hex: str, kind: str, decode: Callable[[bytes], T],
              check: Callable[[Any], str | None]) -> tuple[T | None, str | None]:
    """The store's entry under ``key_hex``, decoded and checked: ``(value, None)``, or
    ``(None, why)`` on a miss. A broken or foreign entry is removed; no store error
    escapes (the store is a cache tier)."""
    if store is None:
        return None, "no store"
    try:
        data = store.get(key_hex, kind=kind)
    except Exception as e:  # an unreachable or unreadable tier is a miss
        logger.warning("accy: store read of %s failed: %s", key_hex[:12], e)
        return None, f"store unreadable ({type(e).__name__})"
    if data is None:
        return None, "not stored"
    try:
        value = decode(data)
    except AccyError as e:
        _drop(store, key_hex)
        return None, f"store entry unreadable: {e}"
    why = check(value)
    if why is not None:
        _drop(store, key_hex)
        return None, f"store entry rejected: {why}"
    return value, None


def read_stage_result(store: Any, key: StageKey, deferred: bool = False) \
        -> tuple[StageResult | None, str | None]:
    """A stage result from the store, admitted for ``key`` (its origin set to ``store``).

    ``deferred``: the product's module is decoded and verified only when something
    uses it (a chain that reads several stages back in a row keys each next stage by
    the stored fingerprint alone); if it then fails, the entry is dropped and
    :class:`~accy.preparation.products.StoredProductBroken` raised — the caller
    treats it as a lost input and recomputes.
    """
    def check(r: StageResult) -> str | None:
        return check_stage_result(r, key)

    def decode(data: bytes) -> StageResult:
        return StageResult.from_wire(data, (lambda: _drop(store, key.hex)) if deferred
                                     else None)

    result, why = read_back(store, key.hex, str(key.fields.get("stage")), decode, check)
    if result is not None:
        result.origin = "store"
    return result, why


def write(store: Any, key_hex: str, data: bytes | Wire, kind: str) -> str | None:
    """Put an entry; a failure is returned as a warning (never raised). A value that
    encodes itself is encoded only when there is a store to hold it (without one,
    every stage result used to be wire-encoded for nobody)."""
    if store is None:
        return None
    try:
        ok = store.put(key_hex, _payload(data), kind=kind)
    except Exception as e:  # a full or read-only store must not fail the refresh
        logger.warning("accy: store write of %s failed: %s", key_hex[:12], e)
        return f"store write failed ({type(e).__name__}: {e})"
    if ok is False:
        return "store write failed"
    return None


def _payload(data: bytes | Wire) -> bytes:
    return data if isinstance(data, bytes) else data.to_wire()


class WriteBehind:
    """Store writes that overlap the compile after them.

    :meth:`write` encodes the value in the calling thread (that is Python work, which
    holds the GIL anyway) and holds the put; :meth:`start` hands the puts held so far
    — creating a temporary, writing, renaming, touching: system calls — to this
    process's writer thread as one job, and :meth:`flush` starts what is left and
    waits for every put, returning their warnings. A chain group task starts its puts
    when its stages are done, so they run beside the compile (NVRTC and cc run
    outside the GIL), not beside the stages, whose GIL they contend for (H200, 480
    distinct variants on 15 workers, same visit: 941 against 882 variants/s, medians
    of six passes whose ranges overlap; a thread-CPU profile there puts the store's
    puts at 0.24 s of the 5.1–5.6 s of group tasks; RESULTS.md,
    batch, fifteenth session). It flushes before it returns, so by the time its result
    is reported every entry it wrote is in the store.

    >>> class Store(dict):
    ...     def put(self, key, data, kind=""): self[key] = data
    >>> s = Store()
    >>> w = WriteBehind(s)
    >>> w.write("ab" * 16, b"x", "kernel")
    >>> w.flush(), s
    ([], {'abababababababababababababababab': b'x'})
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self._held: list[tuple[str, bytes, str]] = []
        self._pending: list[Future[list[str]]] = []

    def write(self, key_hex: str, data: bytes | Wire, kind: str) -> None:
        """Encode ``data`` now (when there is a store); put it once :meth:`start` runs."""
        if self.store is not None:  # encoded here: write() gets the bytes
            self._held.append((key_hex, _payload(data), kind))

    def start(self) -> None:
        """Hand the puts held so far to the writer thread (one job, in order)."""
        held, self._held = self._held, []
        if held:
            self._pending.append(_writer().submit(_put_all, self.store, held))

    def flush(self) -> list[str]:
        """Start what is held, wait for every put; their warnings (a failed put is never
        raised)."""
        self.start()
        pending, self._pending = self._pending, []
        return [w for f in pending for w in f.result()]


def _put_all(store: Any, held: list[tuple[str, bytes, str]]) -> list[str]:
    return [w for w in (write(store, k, d, kind) for k, d, kind in held) if w is not None]


_WRITER: list[tuple[int, ThreadPoolExecutor | None]] = [(0, None)]
_WRITER_LOCK = threading.Lock()


def _writer() -> ThreadPoolExecutor:
    """This process's one store-writer thread (made again in a forked child, which has
    the parent's executor object but not its thread)."""
    with _WRITER_LOCK:
        pid, pool = _WRITER[0]
        if pool is None or pid != os.getpid():
            pool = ThreadPoolExecutor(1, thread_name_prefix="accy-store-write")
            _WRITER[0] = (os.getpid(), pool)
        return pool


def _drop(store: Any, key_hex: str) -> None:
    try:
        store.delete(key_hex)
    except Exception:  # best effort: the entry is a miss either way
        pass


__all__ = ["WriteBehind", "check_stage_result", "read_back", "read_stage_result", "write"]
