"""Keys: content hashes of what a stage run reads, and hermetic code versions.

A key is what decides reuse, locally and on the cluster (it names the Dask
task), so two different computations must never share one. The stage table
(:mod:`accy.pipeline`) says what each stage's key holds — H(stage, version,
input, every option it reads); this module hashes it (:func:`make_key`), says
which part of a key changed (:func:`explain`), and computes the **version** of
a stage from its code: the source of every module its implementation can
import (:func:`import_closure`), so an edit anywhere a stage's code reaches
invalidates that stage's stored products, and an edit elsewhere does not.

Example
-------
>>> a = make_key({"stage": "kernel", "version": "1", "input": "00", "options": {"block_size": 128}})
>>> b = make_key({"stage": "kernel", "version": "1", "input": "00", "options": {"block_size": 256}})
>>> a.hex != b.hex, explain(b, a.fields)
(True, 'option block_size: 128 -> 256')
"""

from __future__ import annotations

import ast
import bisect
import functools
import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accy.files import jsonable

REGISTRIES = frozenset({"accy.dialects"})
"""Packages imported only to register what they define (the parser's and the wire
decoder's ``import accy.dialects``): their own source counts, but their imports
are not followed — a stage depends on the dialect modules it imports itself and
on those its table entry declares, not on every dialect."""

DISPATCHERS = frozenset({"accy.preparation.recipe", "accy.pipeline"})
"""Modules that dispatch to every stage's code from inside functions (the recipe
has one function per stage; the table names each stage's implementation): only
their top-level imports are followed. Each stage adds the imports of its own
recipe function (:func:`function_imports`), so the kernel stage's version does
not follow the contract passes the contract recipe imports."""

_ACCY_ROOT = Path(__file__).resolve().parent.parent


def _module_path(name: str) -> Path | None:
    """The file of module ``accy.…`` (a package's ``__init__.py``), found without importing."""
    parts = name.split(".")
    if parts[0] != "accy":
        return None
    base = _ACCY_ROOT.joinpath(*parts[1:])
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _import_time_nodes(nodes: list[ast.stmt]) -> list[ast.AST]:
    """The nodes that run when a module is imported: not function bodies."""
    out: list[ast.AST] = []
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.ClassDef):
            out.extend(_import_time_nodes(node.body))
            continue
        out.extend(_statements([node]))
    return out


@functools.cache
def _imports(name: str, path: Path, top_level_only: bool = False) -> frozenset[str]:
    """Every ``accy`` module that ``name``'s source imports, with their parent packages:
    anywhere in the file (deferred imports inside functions included), or only what
    runs at import time."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    nodes = _import_time_nodes(tree.body) if top_level_only else _statements(tree.body)
    return frozenset(_imported_modules(name, path, nodes))


def _statements(body: list[ast.stmt]) -> list[ast.AST]:
    """Every statement in ``body`` and the statement blocks nested in it (an import is
    a statement: expressions need not be walked)."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(reversed(body))
    while todo:
        node = todo.pop()
        out.append(node)
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            child = getattr(node, field, None)
            if isinstance(child, list):
                todo.extend(reversed([c for c in child if isinstance(c, ast.AST)]))
    return out


def function_imports(module: str, function: str) -> tuple[str, ...]:
    """The ``accy`` modules imported inside ``module.function`` (a recipe entry).

    >>> "accy.preparation.passes.kernel" in function_imports("accy.preparation.recipe",
    ...                                                      "kernel")
    True
    """
    with _SCAN_LOCK:
        return _function_imports(module, function)


@functools.cache
def _function_imports(module: str, function: str) -> tuple[str, ...]:
    path = _module_path(module)
    if path is None:
        raise ValueError(f"no such accy module: {module}")
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return tuple(sorted(_imported_modules(module, path, _statements([node]))))
    raise ValueError(f"{module} has no function {function!r}")


def _imported_modules(name: str, path: Path, nodes: list[ast.AST]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)  # ``from pkg import module``
    out: set[str] = set()
    for mod in found:
        parts = mod.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
            candidate = ".".join(parts[:i])
            if _module_path(candidate) is not None:
                out.add(candidate)
    return out


def import_closure(roots: tuple[str, ...]) -> tuple[str, ...]:
    """The ``accy`` modules that importing ``roots`` can run, sorted.

    Follows every import statement of every module reached (not the imports of
    :data:`REGISTRIES`). This is what a stage's version hashes, so editing any
    module a stage's code can reach changes that stage's key.

    >>> "accy.choir.builtin" in import_closure(("accy.preparation.passes.memory",))
    True
    >>> "accy.dialects.kernel" in import_closure(("accy.preparation.passes.memory",))
    False
    """
    seen: set[str] = set()
    todo = [r for r in roots if _module_path(r) is not None]
    missing = [r for r in roots if _module_path(r) is None]
    if missing:
        raise ValueError(f"no such accy module: {', '.join(missing)}")
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_path(name)
        assert path is not None
        if name in REGISTRIES:
            continue
        todo.extend(_imports(name, path, top_level_only=name in DISPATCHERS) - seen)
    return tuple(sorted(seen))


_SCAN_LOCK = threading.Lock()
"""``ast.parse`` is not safe to run from several threads at once in CPython 3.11
(``SystemError: AST constructor recursion depth mismatch``): versions are computed
under one lock, once per process."""


def code_version(roots: tuple[str, ...]) -> str:
    """A short hash of the source of every module in ``import_closure(roots)``."""
    with _SCAN_LOCK:
        return _code_version(roots)


@functools.cache
def _code_version(roots: tuple[str, ...]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for name in import_closure(roots):
        path = _module_path(name)
        assert path is not None
        h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class StageKey:
    """A stage key and the fields it hashes (kept to explain a miss)."""

    hex: str
    fields: dict[str, Any]


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)
"""What ``json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)`` builds
for every call (its options are not the defaults), made once: a batch's client keys
every stage of every variant, and building the encoder was a fifth of its planning
(480 shared variants planned in 0.15 s under cProfile on the 2-core machine, 0.033 s of
it in ``JSONEncoder.__init__``; RESULTS.md, batch, twenty-ninth session). ``encode``
keeps no state between calls."""


def _canonical(obj: Any) -> str:
    """Canonical JSON: sorted keys, no spaces, anything else as its ``str``.

    >>> _canonical({"b": (1, 2), "a": 1.5}) == json.dumps({"b": (1, 2), "a": 1.5},
    ...     sort_keys=True, separators=(",", ":"), default=str)
    True
    """
    return _CANONICAL.encode(obj)


def make_key(fields: dict[str, Any]) -> StageKey:
    digest = hashlib.blake2b(_canonical(fields).encode(), digest_size=16).hexdigest()
    return StageKey(digest, fields)


_TEMPLATE_PARTS: dict[int, tuple[Mapping[str, Any], list[str], list[str]]] = {}
_TEMPLATE_PARTS_MAX = 4096


def keyed(template: Mapping[str, Any], name: str, value: str) -> StageKey:
    """``make_key(dict(template, name=value))`` — the same key — with the template's
    canonical JSON made once: a batch's client keys every stage of every variant from
    a few shared templates (one dict each, never changed); serializing the whole
    template again for each key took 17.5 µs a key, this 7.9 (2-core machine; RESULTS.md,
    batch, fifteenth session).
    JSON is compositional, so the text is the template's members with ``name``'s spliced
    in at its sorted place.

    >>> t = {"stage": "kernel", "version": "1", "options": {"block_size": 128}}
    >>> keyed(t, "after", "ab" * 16) == make_key(dict(t, after="ab" * 16))
    True
    """
    hit = _TEMPLATE_PARTS.get(id(template))
    if hit is None or hit[0] is not template:  # held, so its id is not reused meanwhile
        if len(_TEMPLATE_PARTS) >= _TEMPLATE_PARTS_MAX:
            _TEMPLATE_PARTS.clear()
        names = sorted(template)
        hit = (template, names, [f"{_canonical(k)}:{_canonical(template[k])}" for k in names])
        _TEMPLATE_PARTS[id(template)] = hit
    _, names, parts = hit
    fields = dict(template)
    fields[name] = value
    if name in template:
        return make_key(fields)
    at = bisect.bisect(names, name)
    text = "{" + ",".join([*parts[:at], f"{_canonical(name)}:{_canonical(value)}",
                           *parts[at:]]) + "}"
    return StageKey(hashlib.blake2b(text.encode(), digest_size=16).hexdigest(), fields)


def explain(new: StageKey, old_fields: Mapping[str, Any] | None) -> str:
    """Which part of a stage key changed since ``old_fields`` (a published key's fields).

    Fields that crossed the wire come back with tuples as lists, so values are
    compared as JSON; the whole fields only when no part differs (a batch explains
    every stage of every variant on its client: the whole-field comparison first was
    most of the client's time per variant).

    >>> new = StageKey("k", {"stage": "kernel", "version": "v2", "input": "a" * 32,
    ...                      "options": {"block_size": 128, "shapes": {"arg0": (8, 4)}}})
    >>> explain(new, {"stage": "kernel", "version": "v2", "input": "b" * 32,
    ...               "options": {"block_size": 256, "shapes": {"arg0": [8, 4]}}})
    'input fingerprint bbbbbbbbbbbb -> aaaaaaaaaaaa; option block_size: 256 -> 128'
    >>> explain(new, jsonable(new.fields))
    'same key'
    """
    if old_fields is None:
        return "no published entry for this variant"
    parts = []
    if old_fields.get("version") != new.fields["version"]:
        parts.append(f"stage version {old_fields.get('version')} -> {new.fields['version']}")
    if old_fields.get("input") != new.fields["input"]:
        parts.append(f"input fingerprint {str(old_fields.get('input'))[:12]} -> "
                     f"{new.fields['input'][:12]}")
    old_opts = old_fields.get("options") or {}
    new_opts = new.fields["options"]
    for name in sorted(set(old_opts) | set(new_opts)):
        a, b = old_opts.get(name), new_opts.get(name)
        if a == b:  # most options of a miss: no copy made to compare them
            continue
        a, b = jsonable(a), jsonable(b)
        if a != b:
            parts.append(f"option {name}: {a!r} -> {b!r}")
    if parts:
        return "; ".join(parts)
    return "same key" if old_fields == new.fields \
        or jsonable(dict(old_fields)) == jsonable(new.fields) else "key fields differ"
