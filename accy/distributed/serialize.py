"""msgpack on the wire: Dask serializers for stage products and other accy types.

Every :class:`~accy.preparation.products.Product` subclass is registered with
Dask's built-in ``"dask"`` serializer family (``dask_serialize`` /
``dask_deserialize``), which distributed uses for worker↔worker transfer,
gather/scatter, spill to disk and literal task arguments. The frames are the
product's own msgpack wire form, so the IR is never pickled (products refuse to
pickle; see ``Product.__reduce_ex__``).

Each process counts what it (de)serialized per label (a product's stage, or the
label given to :func:`register_type`), so tests can prove a product crossed
workers as msgpack.

Example
-------
>>> from distributed.protocol import deserialize, serialize
>>> from accy.preparation.products import SemanticModule
>>> register()
>>> sm = SemanticModule.from_text('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<4xf32>):
...     "func.return"(%x) : (tensor<4xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> header, frames = serialize(sm, serializers=("dask",))
>>> header["serializer"], header["sub-header"]["accy-label"]
('dask', 'semantic')
>>> deserialize(header, frames).fingerprint() == sm.fingerprint()
True
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from distributed.protocol import dask_deserialize, dask_serialize

from accy.preparation.products import PRODUCTS, Product

T = TypeVar("T")

SERIALIZE_COUNTS: dict[str, int] = {}
"""Label (a product's stage) → how many objects this process serialized."""
DESERIALIZE_COUNTS: dict[str, int] = {}
"""Label (a product's stage) → how many objects this process deserialized."""

_LOCK = threading.Lock()
_REGISTERED: dict[type, str] = {}


def _count(table: dict[str, int], label: str) -> None:
    with _LOCK:
        table[label] = table.get(label, 0) + 1


def register_type(cls: type[T], to_bytes: Callable[[T], bytes],
                  from_bytes: Callable[[bytes], T], label: str | None = None) -> None:
    """Make Dask move ``cls`` as the bytes ``to_bytes`` gives (one frame).

    ``from_bytes`` gets a ``bytes`` object back. ``label`` names the counter
    (default: the class's ``stage`` attribute, else its name). Registering the
    same class again replaces its functions.

    Example
    -------
    >>> class Descriptor:
    ...     def __init__(self, text): self.text = text
    >>> register_type(Descriptor, lambda d: d.text.encode(),
    ...               lambda b: Descriptor(b.decode()), label="descriptor")
    >>> from distributed.protocol import deserialize, serialize
    >>> deserialize(*serialize(Descriptor("hi"), serializers=("dask",))).text
    'hi'
    """
    name = label or getattr(cls, "stage", "") or cls.__name__

    def _serialize(obj: T) -> tuple[dict[str, Any], list[bytes]]:
        data = to_bytes(obj)
        _count(SERIALIZE_COUNTS, name)
        return {"accy-label": name}, [data]

    def _deserialize(header: dict[str, Any], frames: list[Any]) -> T:
        data = b"".join(bytes(f) for f in frames) if len(frames) != 1 else bytes(frames[0])
        obj = from_bytes(data)
        _count(DESERIALIZE_COUNTS, name)
        return obj

    dask_serialize.register(cls)(_serialize)
    dask_deserialize.register(cls)(_deserialize)
    _REGISTERED[cls] = name


def register() -> None:
    """Register every ``Product`` subclass, stage and chain results and compiled fragments
    (idempotent)."""
    from accy.distributed.graph import ChainGroup, ChainResult
    from accy.executable.compile import CompiledFragment
    from accy.preparation.stages import StageResult

    for stage, cls in PRODUCTS.items():
        if _REGISTERED.get(cls) != stage:
            register_type(cls, Product.to_wire, Product.from_wire, label=stage)
    if StageResult not in _REGISTERED:
        register_type(StageResult, StageResult.to_wire, StageResult.from_wire, label="result")
    if ChainResult not in _REGISTERED:
        register_type(ChainResult, ChainResult.to_wire, ChainResult.from_wire, label="chain")
    if ChainGroup not in _REGISTERED:
        register_type(ChainGroup, ChainGroup.to_wire, ChainGroup.from_wire, label="chains")
    if CompiledFragment not in _REGISTERED:
        register_type(CompiledFragment, CompiledFragment.to_wire, CompiledFragment.from_wire,
                      label="fragment")


def registered() -> dict[str, str]:
    """Qualified class name → counter label of every type registered in this process."""
    return {f"{c.__module__}.{c.__qualname__}": n for c, n in _REGISTERED.items()}


def counts() -> dict[str, dict[str, int]]:
    """A copy of this process's counters: ``{"serialize": {...}, "deserialize": {...}}``.

    Example
    -------
    >>> sorted(counts())
    ['deserialize', 'serialize']
    """
    with _LOCK:
        return {"serialize": dict(SERIALIZE_COUNTS), "deserialize": dict(DESERIALIZE_COUNTS)}


def reset_counts() -> None:
    """Zero this process's counters."""
    with _LOCK:
        SERIALIZE_COUNTS.clear()
        DESERIALIZE_COUNTS.clear()
