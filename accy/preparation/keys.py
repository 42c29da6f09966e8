"""Stage keys: H(stage, stage version, input fingerprint, every option the stage reads).

A key is what decides reuse, locally and on the cluster (it names the Dask
task), so two different computations must never share one. The stage
version hashes the source of every module that implements the stage (its
passes, the dialects it produces, the products) plus a manual number, so a
change to the compiler invalidates persistent entries. :func:`explain`
says which part of a key changed.

Example
-------
>>> from accy.preparation.options import RunOptions
>>> a = stage_key("kernel", "00" * 16, RunOptions.parse("host", ["kernel.block_size=128"]))
>>> b = stage_key("kernel", "00" * 16, RunOptions.parse("host", ["kernel.block_size=256"]))
>>> a.hex != b.hex, a.fields["options"]["block_size"]
(True, 128)
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accy.preparation.options import RunOptions

MANUAL_VERSION = {"contract": 1, "tensor": 1, "dispatch": 1, "memory": 1, "kernel": 1,
                  "target": 1, "compile": 1}

# Modules whose source defines each stage's output.
_COMMON = ("accy.choir.ir", "accy.choir.attributes", "accy.choir.wire",
           "accy.preparation.products", "accy.dialects.semantic", "accy.dialects.shapes",
           "accy.preparation.passes.rewrite")
STAGE_MODULES: dict[str, tuple[str, ...]] = {
    "contract": ("accy.preparation.passes.contract", "accy.reference", "accy.numerics"),
    "tensor": ("accy.preparation.passes.tensor", "accy.preparation.passes.contract",
               "accy.dialects.prim"),
    "dispatch": ("accy.preparation.passes.dispatch", "accy.dialects.dispatch"),
    "memory": ("accy.preparation.passes.memory",),
    "kernel": ("accy.preparation.passes.kernel", "accy.dialects.kernel"),
    "target": ("accy.preparation.passes.target", "accy.target.cuda", "accy.target.host",
               "accy.target.common"),
    "compile": ("accy.executable.compile", "accy.executable.device"),
}


def _module_source(name: str) -> str:
    import importlib

    try:
        mod = sys.modules.get(name) or importlib.import_module(name)
    except ImportError:
        return ""
    try:
        if hasattr(mod, "__path__"):  # a package: every module file in it
            import pkgutil

            parts = [inspect.getsource(mod)]
            for info in sorted(pkgutil.iter_modules(mod.__path__), key=lambda i: i.name):
                parts.append(_module_source(f"{name}.{info.name}"))
            return "\n".join(parts)
        return inspect.getsource(mod)
    except (OSError, TypeError):
        return ""


@functools.cache
def stage_version(stage: str) -> str:
    """A short hash of the manual version and the source of the stage's modules."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{stage}:{MANUAL_VERSION[stage]}".encode())
    for name in _COMMON + STAGE_MODULES[stage]:
        h.update(name.encode())
        h.update(_module_source(name).encode())
    return f"{MANUAL_VERSION[stage]}-{h.hexdigest()}"


@dataclass(frozen=True)
class StageKey:
    """A stage key and the fields it hashes (kept to explain a miss)."""

    hex: str
    fields: dict[str, Any]


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def make_key(fields: dict[str, Any]) -> StageKey:
    digest = hashlib.blake2b(_canonical(fields).encode(), digest_size=16).hexdigest()
    return StageKey(digest, fields)


def key_template(stage: str, options: RunOptions,
                 shapes: Mapping[int, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """A stage key's fields except its input: stage, version and the options it reads."""
    opts = options.stage_key_fields(stage)
    if stage == "contract":
        opts = dict(opts, shapes={f"arg{i}": list(s) for i, s in sorted((shapes or {}).items())})
    return {"stage": stage, "version": stage_version(stage), "options": opts}


def stage_key(stage: str, input_fingerprint: str, options: RunOptions,
              shapes: Mapping[int, tuple[int, ...]] | None = None) -> StageKey:
    """The key of running ``stage`` on an input with ``input_fingerprint``.

    Only the contract stage reads the shape bindings (it specializes shapes);
    later stages see them through their input's fingerprint.
    """
    return make_key(dict(key_template(stage, options, shapes), input=input_fingerprint))


def explain(new: StageKey, old_fields: Mapping[str, Any] | None) -> str:
    """Which part of a stage key changed since ``old_fields`` (a published key's fields)."""
    if old_fields is None:
        return "no published entry for this variant"
    if dict(old_fields) == new.fields:
        return "same key"
    parts = []
    if old_fields.get("version") != new.fields["version"]:
        parts.append(f"stage version {old_fields.get('version')} -> {new.fields['version']}")
    if old_fields.get("input") != new.fields["input"]:
        parts.append(f"input fingerprint {str(old_fields.get('input'))[:12]} -> "
                     f"{new.fields['input'][:12]}")
    old_opts = old_fields.get("options") or {}
    for name in sorted(set(old_opts) | set(new.fields["options"])):
        a, b = old_opts.get(name), new.fields["options"].get(name)
        if a != b:
            parts.append(f"option {name}: {a!r} -> {b!r}")
    return "; ".join(parts) or "key fields differ"
