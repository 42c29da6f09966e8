"""Print choir in MLIR's generic operation syntax.

The output reads in upstream ``mlir-opt --allow-unregistered-dialect`` and in
:mod:`accy.choir.parser`; print → parse → print is a fixed point. Values are
numbered ``%0, %1, …`` and block arguments ``%arg0, …`` per function, as
``mlir-opt`` does; attributes print sorted by name.

Example
-------
>>> from accy.choir.attributes import IntegerAttr, FloatAttr, DenseArrayAttr, F32
>>> print_attribute(IntegerAttr(3)), print_attribute(FloatAttr(1e-5, F32))
('3 : i64', '1.0e-05 : f32')
>>> print_attribute(DenseArrayAttr((1, 0)))
'array<i64: 1, 0>'
"""

from __future__ import annotations

import math

import numpy as np

from accy.choir.attributes import (
    ArrayAttr,
    Attribute,
    BoolAttr,
    DenseArrayAttr,
    DenseElementsAttr,
    DictAttr,
    FloatAttr,
    IntegerAttr,
    ScalarType,
    StringAttr,
    SymbolRefAttr,
    Type,
    TypeAttr,
    UnitAttr,
    float_bits,
)
from accy.choir.ir import Block, Operation, Value
from accy.choir.location import Location


def format_float(value: float, type: ScalarType) -> str:
    """Shortest text that reads back to the same ``type`` value (always with a dot).

    Infinities and NaNs print as MLIR's hex bit pattern (``0x7FC00001``), payload kept.
    """
    if not math.isfinite(value):
        width = 16 if type.name == "f64" else 8 if type.name == "f32" else 4
        return "0x%0*X" % (width, float_bits(value, type))
    if type.name == "f64":
        text = np.format_float_scientific(np.float64(value), unique=True, trim="0")
    elif type.name == "f16":
        text = np.format_float_scientific(np.float16(value), unique=True, trim="0")
    else:
        text = np.format_float_scientific(np.float32(value), unique=True, trim="0")
    return text


def quote(text: str) -> str:
    """An MLIR string literal that reads back to ``text`` exactly.

    Printable characters (non-ASCII included, as UTF-8) print as themselves;
    ``\\n``, ``\\t``, ``\\"`` and ``\\\\`` as escapes; any other character as the
    ``\\XX`` escapes of its UTF-8 bytes (MLIR's escapes are bytes).
    """
    out = []
    for ch in text:
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append("".join("\\%02X" % b for b in ch.encode("utf-8", "surrogatepass")))
    return '"' + "".join(out) + '"'


def print_type(t: Type) -> str:
    return str(t)


def _dense_scalar(v: object, el: ScalarType) -> str:
    if el.is_float:
        return format_float(float(v), el)  # type: ignore[arg-type]
    if el.name == "i1":
        return "true" if v else "false"
    return str(int(v))  # type: ignore[call-overload]


def _dense_texts(attr: DenseElementsAttr) -> list[str]:
    """Each stored value's text; non-finite floats from their storage bits (NaN payloads)."""
    el, data = attr.type.element, attr.data
    if not el.is_float:
        return [_dense_scalar(v, el) for v in data.tolist()]
    texts = [_dense_scalar(v, el) for v in data.tolist()]
    bad = np.flatnonzero(~np.isfinite(data))
    if bad.size:
        width = 16 if el.name == "f64" else 8 if el.name == "f32" else 4
        words = data.view(np.dtype(f"u{data.dtype.itemsize}"))
        for i in bad.tolist():
            bits = int(words[i]) >> (16 if el.name == "bf16" else 0)
            texts[i] = "0x%0*X" % (width, bits)
    return texts


def _dense_body(attr: DenseElementsAttr) -> str:
    shape = attr.type.shape
    if attr.splat or not shape:
        return _dense_texts(attr)[0] if attr.data.size else ""
    if attr.data.size == 0 and (shape.index(0) < len(shape) - 1
                                or math.prod(shape[:-1]) > (1 << 16)):  # type: ignore[arg-type]
        return ""  # MLIR's ``dense<>``: nested ``[]`` cannot spell 0x3, or would be huge
    items = _dense_texts(attr)
    for level in range(len(shape) - 1, -1, -1):  # innermost first: no recursion on the rank
        n = shape[level]
        assert n is not None
        groups = math.prod(shape[:level])  # type: ignore[arg-type]
        items = ["[" + ", ".join(items[g * n:(g + 1) * n]) + "]" for g in range(groups)]
    return items[0]


def print_attribute(a: Attribute) -> str:
    """The MLIR text of one attribute."""
    if isinstance(a, BoolAttr):
        return "true" if a.value else "false"
    if isinstance(a, IntegerAttr):
        if a.type.name == "i1":
            return "true" if a.value else "false"
        return f"{a.value} : {a.type}"
    if isinstance(a, FloatAttr):
        return f"{format_float(a.value, a.type)} : {a.type}"
    if isinstance(a, StringAttr):
        return quote(a.value)
    if isinstance(a, UnitAttr):
        return "unit"
    if isinstance(a, TypeAttr):
        return print_type(a.type)
    if isinstance(a, DenseArrayAttr):
        if not a.values:
            return f"array<{a.element}>"
        return f"array<{a.element}: {', '.join(map(str, a.values))}>"
    if isinstance(a, DenseElementsAttr):
        return f"dense<{_dense_body(a)}> : {a.type}"
    if isinstance(a, ArrayAttr):
        return "[" + ", ".join(print_attribute(v) for v in a.values) + "]"
    if isinstance(a, DictAttr):
        return print_attr_dict(dict(a.entries))
    if isinstance(a, SymbolRefAttr):
        return "@" + (a.name if _bare_ident(a.name) else quote(a.name))
    raise TypeError(f"cannot print attribute {a!r}")


def _bare_ident(name: str) -> bool:
    return bool(name) and (name[0].isalpha() or name[0] == "_") and all(
        c.isalnum() or c in "_$." for c in name)


def print_attr_dict(attrs: dict[str, Attribute]) -> str:
    parts = []
    for k in sorted(attrs):
        key = k if _bare_ident(k) else quote(k)
        v = attrs[k]
        parts.append(key if isinstance(v, UnitAttr) else f"{key} = {print_attribute(v)}")
    return "{" + ", ".join(parts) + "}"


def _print_loc(loc: Location) -> str:
    if not loc.known:
        return "loc(unknown)"
    return f"loc({quote(loc.file)}:{loc.line}:{loc.col})"


class Printer:
    """Prints ops with per-function value numbering."""

    def __init__(self, debuginfo: bool = False) -> None:
        self.debuginfo = debuginfo
        self.lines: list[str] = []
        self.names: dict[Value, str] = {}
        self.counters: list[list[int]] = [[0, 0]]

    def _name_results(self, op: Operation) -> str:
        if not op.results:
            return ""
        n = self.counters[-1][0]
        self.counters[-1][0] += 1
        if len(op.results) == 1:
            self.names[op.results[0]] = f"%{n}"
            return f"%{n} = "
        for i, r in enumerate(op.results):
            self.names[r] = f"%{n}#{i}"
        return f"%{n}:{len(op.results)} = "

    def name(self, v: Value) -> str:
        return self.names.get(v, "%<<UNKNOWN>>")

    def print_op(self, op: Operation, indent: int) -> None:
        pad = "  " * indent
        head = self._name_results(op)
        operands = ", ".join(self.name(v) for v in op.operands)
        text = f'{pad}{head}"{op.op_name}"({operands})'
        if op.properties:
            text += " <" + print_attr_dict(op.properties) + ">"
        if op.regions:
            isolated = op.op_name in ("func.func", "builtin.module")
            if isolated:
                self.counters.append([0, 0])
            for i, region in enumerate(op.regions):
                self.lines.append(text + " ({" if i == 0 else pad + "}, {")
                for bi, block in enumerate(region.blocks):
                    self.print_block(block, indent, bi, show_label=bi > 0 or bool(block.args))
            if isolated:
                self.counters.pop()
            text = pad + "})"
        if op.attributes:
            text += " " + print_attr_dict(op.attributes)
        ins = ", ".join(print_type(v.type) for v in op.operands)
        outs = [print_type(t) for t in op.result_types]
        if len(outs) == 1 and not outs[0].startswith("("):
            out = outs[0]
        else:
            out = "(" + ", ".join(outs) + ")"
        text += f" : ({ins}) -> {out}"
        if self.debuginfo:
            text += " " + _print_loc(op.loc)
        self.lines.append(text)

    def print_block(self, block: Block, indent: int, index: int, show_label: bool) -> None:
        if show_label:
            args = []
            for a in block.args:
                n = self.counters[-1][1]
                self.counters[-1][1] += 1
                self.names[a] = f"%arg{n}"
                text = f"%arg{n}: {print_type(a.type)}"
                if self.debuginfo:
                    text += " " + _print_loc(a.loc)
                args.append(text)
            label = f"^bb{index}" + (f"({', '.join(args)})" if args else "") + ":"
            self.lines.append("  " * indent + label)
        for op in block.ops:
            self.print_op(op, indent + 1)


def print_op(op: Operation, debuginfo: bool = False) -> str:
    """The generic-form text of ``op`` (usually a ``builtin.module``), newline-terminated.

    Example
    -------
    >>> from accy.choir.builtin import ModuleOp
    >>> print_op(ModuleOp.build())
    '"builtin.module"() ({\\n}) : () -> ()\\n'
    """
    p = Printer(debuginfo)
    p.print_op(op, 0)
    return "\n".join(p.lines) + "\n"
