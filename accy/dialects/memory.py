"""The memory stage's plan, declared: one :class:`BufferSpec` per global buffer.

The memory stage writes the buffer plan on the entry function as
``memory.buffers`` (an array of dictionaries, one per buffer) and
``memory.arena_bytes``; the kernel stage, the target stage and the loader
read it back through :func:`buffer_plan` / :meth:`BufferSpec.from_plain`, so a
missing field, a field of the wrong type or a misspelled one is a
``VerifyError``, never a silent default.

Example
-------
>>> b = BufferSpec(id=0, kind="arg", bytes=64, dtype="f32", shape=(4, 4), strides=(4, 1),
...                index=0)
>>> BufferSpec.from_attr(b.to_attr()) == b
True
>>> BufferSpec.from_plain({**b.to_plain(), "ofset": 0})
Traceback (most recent call last):
...
accy.errors.VerifyError: buffer plan entry has no field 'ofset' (fields: id, kind, bytes, dtype, shape, strides, index, offset, alignment, alias_of, inplace_of)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accy.choir.attributes import (
    ArrayAttr,
    Attribute,
    DenseArrayAttr,
    DictAttr,
    IntegerAttr,
    StringAttr,
)
from accy.choir.ir import Operation
from accy.errors import VerifyError

BUFFER_KINDS = ("arg", "result", "arena", "alias")


@dataclass(frozen=True)
class BufferSpec:
    """One global buffer of the plan."""

    id: int
    kind: str
    """``arg`` (the index-th argument), ``result`` (the index-th result), ``arena``
    (a slice of the workspace at ``offset``) or ``alias`` (a view of ``alias_of``)."""
    bytes: int
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    index: int = -1
    """Argument or result position (``arg``/``result``)."""
    offset: int = -1
    alignment: int = -1
    """Byte offset in the arena and its alignment (``arena``)."""
    alias_of: int = -1
    """The buffer this one is a reshaped view of."""
    inplace_of: int = -1
    """The dying input this result is written over."""

    def __post_init__(self) -> None:
        if self.kind not in BUFFER_KINDS:
            raise VerifyError(f"buffer {self.id} has kind '{self.kind}' (expected one of "
                              f"{', '.join(BUFFER_KINDS)})")
        if self.kind in ("arg", "result") and self.index < 0:
            raise VerifyError(f"{self.kind} buffer {self.id} needs an index")
        if self.kind == "arena" and self.offset < 0:
            raise VerifyError(f"arena buffer {self.id} needs an offset")
        if self.kind == "alias" and self.alias_of < 0:
            raise VerifyError(f"alias buffer {self.id} needs alias_of")

    def to_plain(self) -> dict[str, Any]:
        """The fields that are set, as plain values (the launch table's spelling)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.default is dataclasses.MISSING or v != f.default:
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    def to_attr(self) -> DictAttr:
        entries: list[tuple[str, Attribute]] = []
        for name, v in self.to_plain().items():
            entries.append((name, StringAttr(v) if isinstance(v, str) else
                            DenseArrayAttr(tuple(v)) if isinstance(v, list) else
                            IntegerAttr(int(v))))
        return DictAttr(tuple(entries))

    @staticmethod
    def from_plain(entry: Mapping[str, Any]) -> BufferSpec:
        """A buffer from its plain fields (a ``VerifyError`` for an unknown, missing or
        mistyped field)."""
        fields = {f.name: f for f in dataclasses.fields(BufferSpec)}
        values: dict[str, Any] = {}
        for key, v in entry.items():
            f = fields.get(key)
            if f is None:
                raise VerifyError(f"buffer plan entry has no field '{key}' (fields: "
                                  f"{', '.join(fields)})")
            want = str(f.type)
            ok = (isinstance(v, str) if want == "str" else
                  isinstance(v, int) and not isinstance(v, bool) if want == "int" else
                  isinstance(v, (list, tuple)) and all(isinstance(x, int) for x in v))
            if not ok:
                raise VerifyError(f"buffer plan field '{key}' has the wrong type ({v!r})")
            values[key] = tuple(v) if isinstance(v, (list, tuple)) else v
        missing = [n for n, f in fields.items()
                   if f.default is dataclasses.MISSING and n not in values]
        if missing:
            raise VerifyError(f"buffer plan entry lacks {', '.join(missing)}")
        return BufferSpec(**values)

    @staticmethod
    def from_attr(attr: Attribute) -> BufferSpec:
        if not isinstance(attr, DictAttr):
            raise VerifyError("a buffer plan entry must be a dictionary")
        plain: dict[str, Any] = {}
        for key, v in attr.entries:
            plain[key] = v.value if isinstance(v, (IntegerAttr, StringAttr)) else \
                tuple(v.values) if isinstance(v, DenseArrayAttr) else v
        return BufferSpec.from_plain(plain)


def buffer_plan(func: Operation) -> list[BufferSpec]:
    """The buffer plan the memory stage wrote on ``func`` (empty before it ran)."""
    plan = func.attr("memory.buffers")
    if plan is None:
        return []
    if not isinstance(plan, ArrayAttr):
        raise VerifyError("'memory.buffers' must be an array of buffer entries", func.loc)
    try:
        return [BufferSpec.from_attr(a) for a in plan.values]
    except VerifyError as e:
        raise VerifyError(e.message, func.loc) from None


def plan_attr(buffers: list[BufferSpec]) -> ArrayAttr:
    """The ``memory.buffers`` attribute of a plan."""
    return ArrayAttr(tuple(b.to_attr() for b in buffers))


__all__ = ["BufferSpec", "BUFFER_KINDS", "buffer_plan", "plan_attr"]
