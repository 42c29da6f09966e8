"""The ``accy-cache`` scheduler plugin: the versioned cache state.

The scheduler holds one cache state for the whole cluster:

- ``version`` — bumped by one on every successful publish;
- ``entries`` — stage key (hex) → a small JSON-able record (stage, Dask task
  key, product fingerprint, plan fingerprint, elapsed ns, ``stored``, and the
  plugin's own ``pinned`` and ``version`` fields);
- ``variants`` — variant id → the receipts / stage keys of its last successful
  refresh and its fragment descriptor; a record published without ``fields``
  gets each stage's key fields from that stage's entry (a publish need not
  send them twice).

A refresh publishes with compare-and-swap through the ``accy_publish``
handler, which is synchronous (no ``await``), so nothing else runs on the
scheduler between the version check and the update: of two publishes from the
same version exactly one wins. The winner's task keys are *pinned*: the
plugin desires them as the pseudo-client ``"accy-cache"``, so their results
stay in worker memory after the refreshing client lets go. At most
``max_pinned`` keys are pinned; past that the least recently published or
touched are released (their entries stay, marked ``pinned: False``: the
artifact store keeps the data).

Handlers (call them with ``client.scheduler.accy_state()`` etc., or through
:mod:`accy.distributed.state`):

``accy_state(full=True)``
    ``{"version", "entries", "variants"}`` (just ``{"version"}`` with ``full=False``).
``accy_publish(expected_version, entries, variants, keys)``
    ``{"ok": True, "version": new, "pinned": [...]}`` or
    ``{"ok": False, "version": current}``.
``accy_touch(keys)``
    Mark pinned keys recently used.
``accy_unpin(keys=None)``
    Release pinned keys (all when None), e.g. before a local cluster closes.

The stage-timing dashboard is a plugin of its own
(:class:`accy.dashboard.plugin.StageDashboardPlugin`, installed next to this
one); it reads :attr:`AccyCachePlugin.stats` and :attr:`AccyCachePlugin.pinned_keys`,
and this module imports nothing of it.

Example
-------
>>> plugin = AccyCachePlugin(max_pinned=10)
>>> plugin.name, plugin.version
('accy-cache', 0)
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from time import time
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

from accy.files import jsonable

if TYPE_CHECKING:
    from distributed import Scheduler

logger = logging.getLogger("accy.distributed")

PLUGIN_NAME = "accy-cache"
PINNING_CLIENT = "accy-cache"
HANDLERS = ("accy_resolve", "accy_state", "accy_publish", "accy_touch", "accy_unpin")
METADATA_KEY = "accy-cache"
"""Scheduler metadata key the plugin sets once its handlers are installed."""
DEFAULT_MAX_PINNED = 1000
DEFAULT_MAX_ENTRIES = 200_000
DEFAULT_MAX_VARIANTS = 50_000
"""The published state is metadata over the artifact store: past these bounds the
least recently published entries and variant records are forgotten (a later
refresh reads their products back from the store by key, or runs them again)."""


def to_dask_key(key: Any) -> Any:
    """A task key as the scheduler spells it: lists (as msgpack sends tuples) become tuples.

    Example
    -------
    >>> to_dask_key(["accy_contract", "ab12"])
    ('accy_contract', 'ab12')
    """
    if isinstance(key, (list, tuple)):
        return tuple(to_dask_key(k) for k in key)
    return key


def pack_message(message: Any) -> bytes:
    """A handler's message (its arguments, or its answer) as one msgpack blob: Dask then
    moves bytes, where a nested message costs it a ``sizeof`` walk before it is sent
    (``distributed.comm.utils.to_frames``) — on the 2-core machine 32 µs of the client's
    event loop a published variant, most of what sending a publish cost it (RESULTS.md,
    batch, thirtieth session).

    >>> unpack_message(pack_message([{"k": {"fields": {"options": {"b": 1}}}}, {}, [("t", "k")]]))
    ({'k': {'fields': {'options': {'b': 1}}}}, {}, (('t', 'k'),))
    """
    import msgpack

    return msgpack.packb(message, use_bin_type=True)


def unpack_message(data: bytes) -> Any:
    """:func:`pack_message`'s message, decoded as Dask decodes one (arrays as tuples)."""
    import msgpack

    return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=False)


def to_wire_key(key: Any) -> Any:
    """A task key in its JSON-able form (tuples become lists)."""
    if isinstance(key, (list, tuple)):
        return [to_wire_key(k) for k in key]
    return key


def _max_pinned_from_config() -> int:
    import dask.config

    return int(dask.config.get("accy.max-pinned", DEFAULT_MAX_PINNED))


def _bound_from_config(name: str, default: int) -> int:
    import dask.config

    return int(dask.config.get(f"accy.{name}", default))


class AccyCachePlugin(SchedulerPlugin):
    """Owns the cluster's versioned cache state and the pinned result keys.

    Parameters
    ----------
    max_pinned
        How many task keys stay pinned in worker memory; None: Dask config
        ``accy.max-pinned`` (default 1000).
    max_entries, max_variants
        How many entries and variant records the state keeps; None: Dask config
        ``accy.max-entries`` / ``accy.max-variants`` (200,000 / 50,000).
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, max_pinned: int | None = None, max_entries: int | None = None,
                 max_variants: int | None = None) -> None:
        self.max_pinned = max_pinned if max_pinned is not None else _max_pinned_from_config()
        self.max_entries = max_entries if max_entries is not None else \
            _bound_from_config("max-entries", DEFAULT_MAX_ENTRIES)
        self.max_variants = max_variants if max_variants is not None else \
            _bound_from_config("max-variants", DEFAULT_MAX_VARIANTS)
        if self.max_pinned < 0:
            raise ValueError(f"max_pinned must be >= 0, got {self.max_pinned}")
        self.version = 0
        self.entries: dict[str, dict[str, Any]] = {}
        self.variants: dict[str, dict[str, Any]] = {}
        self.scheduler: Scheduler | None = None
        # Pinned task keys, least recently published/touched first.
        self._pinned: OrderedDict[Any, None] = OrderedDict()
        # Task key -> stage keys of the entries that name it.
        self._entries_of: dict[Any, set[str]] = {}
        # (program, target) -> the last variant published for it (resolution's "nearest").
        self._latest: dict[tuple[str, str], str] = {}
        self.stats = {"publishes": 0, "conflicts": 0, "unpinned": 0}

    # -- lifecycle
    async def start(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        scheduler.handlers["accy_state"] = self.state
        scheduler.handlers["accy_publish"] = self.publish
        scheduler.handlers["accy_touch"] = self.touch
        scheduler.handlers["accy_unpin"] = self.unpin
        scheduler.handlers["accy_resolve"] = self.resolve
        scheduler.set_metadata(keys=[METADATA_KEY], value={"handlers": list(HANDLERS)})

    async def close(self) -> None:
        if self.scheduler is not None:
            for name in HANDLERS:
                self.scheduler.handlers.pop(name, None)
            self.scheduler.task_metadata.pop(METADATA_KEY, None)

    def resolve(self, comm: Any = None, requests: list[Any] | None = None,
                templates: list[Any] | None = None,
                packed: bytes | None = None) -> dict[str, Any]:
        """Each request's published prefix, compile entry and variant record (one round trip).

        See :mod:`accy.distributed.resolve`; synchronous, so it reads one
        consistent version of the state. O(requests): the nearest published
        relative of a new variant comes from an index, not a scan. With
        ``templates`` (requests naming their key templates by index) the answer
        is compact: each entry and record once. With ``packed`` (:func:`pack_message`
        ``[requests, templates]``, as a batch asks) the answer is packed as well:
        ``{"packed": bytes}``.
        """
        from accy.distributed.resolve import resolve

        if packed is not None:
            requests, templates = unpack_message(packed)
            return {"packed": pack_message(self.resolve(requests=list(requests),
                                                         templates=templates))}

        workers = self.scheduler.workers if self.scheduler is not None else {}
        gpus = [(ws.resources or {}).get("GPU", 0) > 0 for ws in workers.values()]
        out = resolve(self.entries, self.variants, workers, requests or [], any(gpus),
                      latest=self._latest, templates=templates,
                      compact=templates is not None)
        out["version"] = self.version
        out["all_gpu"] = bool(gpus) and all(gpus)
        # where the batch spreads its readers: each worker and whether it has a GPU (the
        # client asked the scheduler's identity for it, a round trip a chunk)
        out["workers"] = {addr: gpu for addr, gpu in zip(workers, gpus)}
        return out if templates is not None else jsonable(out)

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish == "forgotten" and key in self._pinned:
            # The scheduler dropped it (restart, or a client cancelled it by force).
            del self._pinned[key]
            self._mark(key, pinned=False)

    # -- handlers (synchronous on purpose: each runs without interleaving)
    def state(self, comm: Any = None, full: bool = True) -> dict[str, Any]:
        """A JSON-able snapshot of the cache state (only ``version`` unless ``full``)."""
        if not full:
            return {"version": self.version}
        return {
            "version": self.version,
            "entries": jsonable(self.entries),
            "variants": jsonable(self.variants),
        }

    def publish(self, comm: Any = None, expected_version: int = -1,
                entries: dict[str, dict[str, Any]] | None = None,
                variants: dict[str, dict[str, Any]] | None = None,
                keys: list[Any] | None = None, packed: bytes | None = None) -> dict[str, Any]:
        """Compare-and-swap: apply the update only if the state is still ``expected_version``.

        ``packed``: the update as :func:`pack_message` ``[entries, variants, keys]``, as a
        batch sends it.
        """
        if packed is not None:
            entries, variants, keys = unpack_message(packed)
        if expected_version != self.version:
            self.stats["conflicts"] += 1
            return {"ok": False, "version": self.version}
        self.version += 1
        self.stats["publishes"] += 1
        for stage_key, record in (entries or {}).items():
            # kept as it arrived (msgpack's tuples): JSON-able where it leaves, not here
            record = dict(record)
            record["version"] = self.version
            record["pinned"] = False
            old = self.entries.pop(stage_key, None)
            if "task_key" not in record and old is not None and old.get("pinned") \
                    and old.get("task_key"):
                # run again inside a fused chain: the old holder still pins its product
                record["task_key"] = old["task_key"]
                if "pick" in old:  # as its chain's entry of a group task's value
                    record["pick"] = old["pick"]
            if "task_key" in record:
                task = to_dask_key(record["task_key"])
                self._entries_of.setdefault(task, set()).add(stage_key)
                record["pinned"] = task in self._pinned
            self.entries[stage_key] = record  # (re)inserted last: most recently published
        for variant_id, record in (variants or {}).items():
            self.variants.pop(variant_id, None)
            record = self.variants[variant_id] = dict(record)
            if "fields" not in record and "keys" in record:  # from the entries it names
                found = ((stage, self.entries.get(k)) for stage, k in
                         (record.get("keys") or {}).items())
                record["fields"] = {stage: e.get("fields") for stage, e in found
                                    if e is not None}
            self._latest[(str(record.get("program")), str(record.get("target")))] = variant_id
        self._enforce_state_bound()
        pinned = self._pin([to_dask_key(k) for k in keys or []])
        return {"ok": True, "version": self.version, "pinned": [to_wire_key(k) for k in pinned]}

    def touch(self, comm: Any = None, keys: list[Any] | None = None) -> dict[str, Any]:
        """Mark pinned keys as just used; returns how many were pinned."""
        n = 0
        for key in map(to_dask_key, keys or []):
            if key in self._pinned:
                self._pinned.move_to_end(key)
                n += 1
        return {"touched": n}

    def unpin(self, comm: Any = None, keys: list[Any] | None = None) -> dict[str, Any]:
        """Release pinned keys (all of them when ``keys`` is None), e.g. before a
        local cluster shuts down; their entries stay, marked ``pinned: False``."""
        victims = list(self._pinned) if keys is None else \
            [k for k in map(to_dask_key, keys) if k in self._pinned]
        self._release(victims)
        return {"unpinned": len(victims)}

    def _enforce_state_bound(self) -> None:
        """Forget the least recently published entries / variant records past the bounds."""
        while len(self.entries) > self.max_entries:
            stage_key = next(iter(self.entries))
            record = self.entries.pop(stage_key)
            if record.get("task_key"):
                task = to_dask_key(record["task_key"])
                names = self._entries_of.get(task)
                if names is not None:
                    names.discard(stage_key)
                    if not names:
                        del self._entries_of[task]
        while len(self.variants) > self.max_variants:
            vid = next(iter(self.variants))
            record = self.variants.pop(vid)
            where = (str(record.get("program")), str(record.get("target")))
            if self._latest.get(where) == vid:
                del self._latest[where]

    # -- pinning
    @property
    def pinned_keys(self) -> list[Any]:
        """Pinned task keys, least recently used first."""
        return list(self._pinned)

    def _pin(self, keys: list[Any]) -> list[Any]:
        assert self.scheduler is not None, "the plugin has not started"
        tasks = self.scheduler.tasks
        fresh = [k for k in dict.fromkeys(keys) if k in tasks and k not in self._pinned]
        if fresh:
            self.scheduler.client_desires_keys(keys=fresh, client=PINNING_CLIENT)
        pinned = []
        for key in dict.fromkeys(keys):
            if key in tasks:
                self._pinned[key] = None
                self._pinned.move_to_end(key)
                self._mark(key, pinned=True)
                pinned.append(key)
        self._enforce_bound()
        return [k for k in pinned if k in self._pinned]

    def _enforce_bound(self) -> None:
        if len(self._pinned) <= self.max_pinned:
            return
        excess = len(self._pinned) - self.max_pinned
        self._release(list(self._pinned)[:excess])

    def _release(self, keys: list[Any]) -> None:
        if not keys:
            return
        for key in keys:
            del self._pinned[key]
            self._mark(key, pinned=False)
        self.stats["unpinned"] += len(keys)
        logger.debug("accy-cache unpins %d key(s), e.g. %r", len(keys), keys[0])
        assert self.scheduler is not None
        self.scheduler.client_releases_keys(keys=keys, client=PINNING_CLIENT,
                                            stimulus_id=f"accy-cache-unpin-{time()}")

    def _mark(self, key: Any, *, pinned: bool) -> None:
        for stage_key in self._entries_of.get(key, ()):
            record = self.entries.get(stage_key)
            if record is not None:
                record["pinned"] = pinned


def get_plugin(scheduler: Scheduler) -> AccyCachePlugin | None:
    """The scheduler's ``accy-cache`` plugin, or None if it has none.

    Example
    -------
    >>> class FakeScheduler:
    ...     plugins = {}
    >>> get_plugin(FakeScheduler()) is None
    True
    """
    plugin = scheduler.plugins.get(PLUGIN_NAME)
    return plugin if isinstance(plugin, AccyCachePlugin) else None
