"""Resolve a variant's reusable prefix against the published cache state.

A refresh request names the program's semantic fingerprint and, per stage,
the key fields that do not depend on the input (stage, version, options).
Walking the stages, each key is ``make_key(fields + input)`` and its published
entry records the product's fingerprint, which is the next stage's input.
The scheduler plugin runs this next to the state (``accy_resolve``), so a
client learns everything a refresh needs — and a fully reused refresh
everything it is — in one round trip, whatever the size of the state.

Example
-------
>>> resolve({}, {}, set(), [{"semantic": "00" * 16, "stages": [], "variant": "v",
...                          "target": "host"}])["results"][0]["resolved"]
[]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from accy.preparation.keys import make_key


def resolve(entries: Mapping[str, Any], variants: Mapping[str, Any], workers: Iterable[str],
            requests: Iterable[Mapping[str, Any]], gpu_workers: bool = False) \
        -> dict[str, Any]:
    """For each request: the published prefix, the compile entry, the variant's record."""
    alive = set(workers)
    results = []
    for req in requests:
        fp = req["semantic"]
        resolved = []
        for tmpl in req["stages"]:
            fields = dict(tmpl)
            fields["input"] = fp
            key = make_key(fields)
            entry = entries.get(key.hex)
            if entry is None or not entry.get("fingerprint"):
                break
            resolved.append({"stage": tmpl["stage"], "key": key.hex, "entry": entry})
            fp = entry["fingerprint"]
        compile_entry = None
        if req["stages"] and len(resolved) == len(req["stages"]) and req.get("compile"):
            # the compile entry of the target product: the compile stage's derived key
            after = make_key(dict(req["compile"], after=resolved[-1]["key"]))
            compile_entry = entries.get(after.hex)
        record = variants.get(req["variant"])
        nearest = record
        if nearest is None and req.get("program"):
            # a new variant: explain its misses against the last one published
            # for the same program and target (an option or a shape changed)
            for rec in reversed(list(variants.values())):
                if rec.get("program") == req["program"] and rec.get("target") == req["target"]:
                    nearest = rec
                    break
        worker = ((record or {}).get("fragment") or {}).get("worker")
        results.append({"resolved": resolved, "compile": compile_entry, "variant": record,
                        "nearest": nearest, "worker_alive": bool(worker and worker in alive)})
    return {"results": results, "gpu_workers": gpu_workers}
