"""Resolve a variant's reusable prefix against the published cache state.

A refresh request names the program's semantic fingerprint and, per stage,
the key fields that do not depend on the input (stage, version, options).
Walking the stages, each key is ``make_key(fields + input)`` and its published
entry records the product's fingerprint, which is the next stage's input.
The scheduler plugin runs this next to the state (``accy_resolve``), so a
client learns everything a refresh needs — and a fully reused refresh
everything it is — in one round trip, whatever the size of the state.

The cost is O(requests × stages): a new variant's nearest published relative
(to explain its misses) comes from an index of the last variant published per
program and target (:func:`latest_index`, kept by the plugin), never from a
scan of the published variants; keys computed once per call are memoized (a
batch of variants sharing a prefix asks for the same keys).

With ``compact=True`` the answer names each entry and variant record once
(``"entries"``, ``"records"``) and each result refers to them by key: a
batch of 10,000 variants sharing prefixes does not send the same entry
10,000 times.

Example
-------
>>> resolve({}, {}, set(), [{"semantic": "00" * 16, "stages": [], "variant": "v",
...                          "target": "host"}])["results"][0]["resolved"]
[]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from accy.preparation.keys import keyed


def latest_index(variants: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """(program, target) → the id of the last variant published for it."""
    out: dict[tuple[str, str], str] = {}
    for vid, rec in variants.items():
        out[(rec.get("program"), rec.get("target"))] = vid
    return out


def resolve(entries: Mapping[str, Any], variants: Mapping[str, Any], workers: Iterable[str],
            requests: Iterable[Mapping[str, Any]], gpu_workers: bool = False, *,
            latest: Mapping[tuple[str, str], str] | None = None,
            templates: Sequence[Mapping[str, Any]] | None = None,
            compact: bool = False) -> dict[str, Any]:
    """For each request: the published prefix, the compile entry, the variant's record.

    A request's ``stages`` and ``compile`` are key templates, or indices into
    ``templates``. ``latest`` is :func:`latest_index` of ``variants`` (built
    here, once, when not given).
    """
    alive = set(workers)
    if latest is None:
        latest = latest_index(variants)
    memo: dict[tuple[int | str, str, str], str] = {}

    def key_of(tmpl: Any, field: str, value: str) -> str:
        """The hex key of template ``tmpl`` (an index or a dict) with ``field=value``."""
        ident = tmpl if isinstance(tmpl, int) else id(tmpl)
        k = (ident, field, value)
        hit = memo.get(k)
        if hit is None:
            # the template's canonical JSON made once (keyed), not each key's whole fields:
            # make_key here was 15 % of the scheduler's samples in a 2-worker shared
            # sweep (RESULTS.md, batch, thirtieth session)
            t = templates[tmpl] if isinstance(tmpl, int) and templates is not None else tmpl
            hit = memo[k] = keyed(t, field, value).hex
        return hit

    results = []
    used: dict[str, Any] = {}
    records: dict[str, Any] = {}
    for req in requests:
        fp = req["semantic"]
        resolved = []
        stages = req["stages"]
        for tmpl in stages:
            key = key_of(tmpl, "input", fp)
            entry = entries.get(key)
            if entry is None or not entry.get("fingerprint"):
                break
            resolved.append((key, entry))
            fp = entry["fingerprint"]
        compile_key, compile_entry = None, None
        if stages and len(resolved) == len(stages) and req.get("compile") is not None:
            # the compile entry of the target product: the compile stage's derived key
            compile_key = key_of(req["compile"], "after", resolved[-1][0])
            compile_entry = entries.get(compile_key)
        vid = req["variant"]
        record = variants.get(vid)
        nearest_id = vid if record is not None else None
        if record is None and req.get("program"):
            # a new variant: explain its misses against the last one published
            # for the same program and target (an option or a shape changed)
            nearest_id = latest.get((req["program"], req["target"]))
        nearest = variants.get(nearest_id) if nearest_id is not None else None
        worker = ((record or {}).get("fragment") or {}).get("worker")
        alive_ = bool(worker and worker in alive)
        if compact:
            for k, e in resolved:
                used[k] = e
            if compile_entry is not None:
                used[compile_key] = compile_entry  # type: ignore[index]
            if record is not None:
                records[vid] = record
            if nearest is not None:
                records[nearest_id] = nearest  # type: ignore[index]
            results.append({"resolved": [k for k, _ in resolved],
                            "compile": compile_key if compile_entry is not None else None,
                            "variant": vid if record is not None else None,
                            "nearest": nearest_id if nearest is not None else None,
                            "worker_alive": alive_})
        else:
            results.append({"resolved": [{"stage": e["stage"], "key": k, "entry": e}
                                         for k, e in resolved],
                            "compile": compile_entry, "variant": record,
                            "nearest": nearest, "worker_alive": alive_})
    out: dict[str, Any] = {"results": results, "gpu_workers": gpu_workers}
    if compact:
        out["entries"] = used
        out["records"] = records
    return out
