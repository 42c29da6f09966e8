"""Client side of the cache state: read it, publish to it with compare-and-swap.

The state lives in the scheduler's ``accy-cache`` plugin
(:mod:`accy.distributed.plugin`). A publish carries the version it was
computed against; when another refresh published in between, the scheduler
refuses it and :func:`publish_with_merge` re-reads the state and tries again.
A publish is a delta, so a retry never loses the other writer's entries: the
entries are the union, and for a variant published by both the last writer
wins.

Every function works with a synchronous client and, awaited, with an
asynchronous one.

Example
-------
>>> from distributed import Client, LocalCluster
>>> import accy.distributed as ad
>>> with LocalCluster(processes=False, n_workers=1, dashboard_address=":0",
...                   scheduler_kwargs={"preload": ["accy.distributed"]}) as cluster, \\
...         Client(cluster) as client:
...     reply = publish_with_merge(client, {"ab12": {"stage": "contract"}}, {}, [])
...     reply["ok"], fetch_state(client)["version"]
(True, 1)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from accy.errors import AccyError

if TYPE_CHECKING:
    from distributed import Client


Merge = Callable[[dict[str, Any], dict[str, dict[str, Any]], dict[str, dict[str, Any]]],
                 tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]]


class PublishConflict(AccyError):
    """Every retry of a publish lost the race to another writer."""


def fetch_state(client: Client) -> Any:
    """``{"version", "entries", "variants"}`` as the scheduler holds it now."""
    return client.sync(_call, client, "accy_state")


def publish(client: Client, expected_version: int, entries: dict[str, dict[str, Any]],
            variants: dict[str, dict[str, Any]], keys: list[Any]) -> Any:
    """One compare-and-swap: ``{"ok": True, "version": new, "pinned": [...]}``
    or ``{"ok": False, "version": current}``."""
    return client.sync(_publish, client, expected_version, entries, variants, keys)


def touch(client: Client, keys: list[Any]) -> Any:
    """Mark pinned task keys recently used (they are unpinned last)."""
    return client.sync(_call, client, "accy_touch", keys=_wire_keys(keys))


def unpin(client: Client, keys: list[Any] | None = None) -> Any:
    """Release pinned keys (all when None); their entries stay in the state."""
    return client.sync(_call, client, "accy_unpin",
                       keys=None if keys is None else _wire_keys(keys))


def publish_with_merge(client: Client, entries: dict[str, dict[str, Any]],
                       variants: dict[str, dict[str, Any]], keys: list[Any],
                       retries: int = 10, merge: Merge | None = None) -> Any:
    """Publish, re-reading the state and retrying while another writer wins.

    A publish is a delta, so by default it is sent again unchanged on top of
    the other writer's state (entries: union; variants: last writer wins).
    ``merge(state, entries, variants) -> (entries, variants)``, if given, sees
    the fresh state first and may rewrite the delta (or raise to give up).

    Returns the winning reply. Raises :class:`PublishConflict` after
    ``retries`` lost races.
    """
    return client.sync(_publish_with_merge, client, entries, variants, keys, retries, merge)


def inconsistencies(state: dict[str, Any]) -> dict[str, str]:
    """Published variants whose record is partial or not chained, with why: a record
    must name an entry for every preparation stage, in order, each published, of its
    stage, with a product fingerprint, and each computed from the previous stage's
    product (its key's ``input`` field). None is expected, whatever faults a batch met.

    >>> entry = lambda stage, fp, inp: {"stage": stage, "fingerprint": fp,
    ...                                 "fields": {"input": inp}}
    >>> from accy.pipeline import PREPARATION_NAMES as STAGES
    >>> keys = {s: f"k{i}" for i, s in enumerate(STAGES)}
    >>> entries = {f"k{i}": entry(s, f"f{i}", f"f{i - 1}") for i, s in enumerate(STAGES)}
    >>> inconsistencies({"variants": {"v": {"keys": keys}}, "entries": entries})
    {}
    >>> entries["k3"]["fields"]["input"] = "other"
    >>> inconsistencies({"variants": {"v": {"keys": keys}}, "entries": entries})
    {'v': 'memory was not computed from the dispatch product'}
    """
    from accy.pipeline import PREPARATION_NAMES as STAGES

    bad: dict[str, str] = {}
    entries = state["entries"]
    for vid, record in state["variants"].items():
        keys = record["keys"]
        if list(keys) != list(STAGES):
            bad[vid] = f"the record names stages {list(keys)}"
            continue
        previous: dict[str, Any] | None = None
        for stage, prior in zip(STAGES, (None, *STAGES)):
            entry = entries.get(keys[stage])
            if entry is None:
                bad[vid] = f"its {stage} entry {keys[stage]} is not published"
            elif entry["stage"] != stage or not entry["fingerprint"]:
                bad[vid] = f"its {stage} entry is of {entry['stage']!r} or has no fingerprint"
            elif previous is not None and entry["fields"]["input"] != previous["fingerprint"]:
                bad[vid] = f"{stage} was not computed from the {prior} product"
            if vid in bad:
                break
            previous = entry
    return bad


def _wire_keys(keys: list[Any]) -> list[Any]:
    from accy.distributed.plugin import to_wire_key

    return [to_wire_key(k) for k in keys]


async def _call(client: Client, handler: str, **kwargs: Any) -> Any:
    """Call a scheduler handler; the reply with lists where the comm made tuples."""
    from accy.files import jsonable

    return jsonable(await getattr(client.scheduler, handler)(**kwargs))


async def _publish(client: Client, expected_version: int, entries: dict[str, dict[str, Any]],
                   variants: dict[str, dict[str, Any]], keys: list[Any]) -> Any:
    from accy.distributed.plugin import pack_message

    return await _call(client, "accy_publish", expected_version=expected_version,
                       packed=pack_message([entries, variants, _wire_keys(keys)]))


async def _publish_with_merge(client: Client, entries: dict[str, dict[str, Any]],
                              variants: dict[str, dict[str, Any]], keys: list[Any],
                              retries: int, merge: Merge | None) -> Any:
    version = -1
    for _ in range(retries + 1):
        # Re-read the state: another writer may have published since we last looked.
        state = await _call(client, "accy_state", full=merge is not None)
        version = state["version"]
        if merge is not None:
            entries, variants = merge(state, entries, variants)
        reply = await _publish(client, version, entries, variants, keys)
        if reply["ok"]:
            return reply
    raise PublishConflict(f"publishing the cache state lost {retries + 1} races in a row "
                          f"(last version seen: {version})")
