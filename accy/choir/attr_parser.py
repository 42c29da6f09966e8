"""Types, attributes and locations of MLIR's syntax, as choir reads them.

Example
-------
>>> p = AttrParser("dense<[1.0, 2.5]> : tensor<2xf32>")
>>> p.parse_attribute().values
(1.0, 2.5)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from accy.choir.attributes import (
    I64,
    SCALAR_NAMES,
    ArrayAttr,
    Attribute,
    BoolAttr,
    DenseArrayAttr,
    DenseElementsAttr,
    DictAttr,
    FloatAttr,
    FunctionType,
    IntegerAttr,
    NoneType,
    OpaqueType,
    ScalarType,
    StringAttr,
    SymbolRefAttr,
    TensorType,
    Type,
    TypeAttr,
    UnitAttr,
    dense_limit,
    float_from_bits,
    numpy_dtype,
)
from accy.choir.lexer import MAX_DEPTH, Lexer, int_literal, shorten
from accy.choir.lexer import NUMBER as _NUMBER
from accy.choir.lexer import SUFFIX_ID as _SUFFIX_ID
from accy.choir.location import UNKNOWN, Location
from accy.errors import ParseError

_DIM = re.compile(r" *(\?|[0-9]+) *x")
_ELEMENT = re.compile(r" *([A-Za-z_][A-Za-z0-9_]*) *([,>]?)")
_BAD_DIM = re.compile(r"[^x>]*")
MAX_DIM = (1 << 63) - 1
"""Largest tensor dimension (and element count) choir accepts: int64, as in MLIR."""
_LOC_DEF = re.compile(r"^#([A-Za-z0-9_$.\-]+)\s*=\s*loc\((.*)\)\s*$", re.M)
_FILE_LOC = re.compile(r'"((?:[^"\\]|\\.)*)":([0-9]{1,18}):([0-9]{1,18})')


@dataclass
class _DenseShape:
    """The shape of a nested dense literal, checked as its lists open and close."""

    lexer: Lexer
    start: int
    """Where the literal starts: the location of every 'ragged' error."""
    dims: dict[int, int] = field(default_factory=dict)
    """The length of the lists at each level, fixed by the first one closed there."""
    counts: list[int] = field(default_factory=list)
    """Items so far in each open list."""
    leaf_level: int | None = None
    """The level the values sit at, fixed by the first value."""
    deepest: int = 0
    """The deepest level a list was opened at."""

    def ragged(self) -> ParseError:
        """The error of a literal whose lists differ in length or depth."""
        return self.lexer.error("ragged dense literal", self.start)

    def open(self) -> None:
        """A ``[``: one level deeper, which must be above the level of the values."""
        self.deepest = max(self.deepest, len(self.counts))
        if len(self.counts) >= MAX_DEPTH:
            raise self.lexer.error("nesting too deep")
        if self.leaf_level is not None and len(self.counts) >= self.leaf_level:
            raise self.ragged()
        self.counts.append(0)

    def close(self) -> bool:
        """Close the innermost list; True once the outermost one is closed."""
        n, level = self.counts.pop(), len(self.counts)
        if self.dims.setdefault(level, n) != n:
            raise self.ragged()
        if self.counts:
            self.counts[-1] += 1
        return not self.counts

    def value(self) -> None:
        """A value in the innermost list: all values sit at one level, below every list."""
        level = len(self.counts)
        if self.leaf_level is None:
            if self.deepest >= level:  # a list was opened at this level
                raise self.ragged()
            self.leaf_level = level
        elif level != self.leaf_level:
            raise self.ragged()
        self.counts[-1] += 1

    def shape(self) -> tuple[int, ...]:
        """The literal's shape, once its outermost list is closed."""
        if self.leaf_level is not None and self.leaf_level != len(self.dims):
            raise self.ragged()
        return tuple(self.dims[i] for i in range(len(self.dims)))


class AttrParser(Lexer):
    """Parses types, attributes (incl. ``dense<…>``) and ``loc(…)``."""

    def __init__(self, text: str, file: str = "<string>") -> None:
        super().__init__(text, file)
        self.loc_aliases: dict[str, Location] = {}
        self.alias_ends: dict[int, int] = {}
        """Start -> end of each ``#name = loc(…)`` definition line."""
        for m in _LOC_DEF.finditer(text):
            self.loc_aliases[m.group(1)] = self._loc_from_text(m.group(2)) or UNKNOWN
            self.alias_ends[m.start()] = m.end()

    # -------------------------------------------------------------------- types
    def parse_type(self) -> Type:
        self._enter()
        try:
            return self._parse_type()
        finally:
            self.depth -= 1

    def _parse_type(self) -> Type:
        self.skip()
        pos = self.pos
        if self.accept("("):
            return self._function_type()
        if self.accept("!"):
            return self._opaque_type()
        name = self.peek_ident()
        if name is None:
            raise self.error(f"expected a type, found {self._found()}")
        if name == "tensor":
            self.pos += len(name)
            return self.tensor_body(pos)
        if name in SCALAR_NAMES:
            self.pos += len(name)
            return ScalarType(name)
        if name == "none":
            self.pos += len(name)
            return NoneType()
        raise self.error(f"unsupported type '{name}'", pos)

    def _function_type(self) -> FunctionType:
        """``(…) -> …`` after its ``(``: results in parentheses, or one bare result type."""
        inputs = self._type_list()
        self.expect("->", "'->' in a function type")
        if self.accept("("):
            return FunctionType(tuple(inputs), tuple(self._type_list()))
        return FunctionType(tuple(inputs), (self.parse_type(),))

    def _type_list(self) -> list[Type]:
        """The comma-separated types of a ``(…)`` list, after its ``(``, through its ``)``."""
        types: list[Type] = []
        if not self.accept(")"):
            while True:
                types.append(self.parse_type())
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' in a type list")
        return types

    def _opaque_type(self) -> OpaqueType:
        """A dialect type ``!name`` or ``!name<…>`` after its ``!``, kept as its text."""
        m = _SUFFIX_ID.match(self.text, self.pos)
        if not m:
            raise self.error("expected a dialect type name after '!'")
        self.pos = m.end()
        body = m.group(0)
        if self.text.startswith("<", self.pos):
            end = self._balanced_end(self.pos, "<", ">")
            body += self.text[self.pos:end]
            self.pos = end
        return OpaqueType(body)

    def tensor_body(self, pos: int) -> TensorType:
        """``<D0xD1x…xT>`` after ``tensor``: ASCII-digit or ``?`` dims that fit int64."""
        text = self.text
        if not text.startswith("<", self.pos):
            raise self.error("expected '<' after 'tensor'")
        i = self.pos + 1
        dims: list[int | None] = []
        while True:
            m = _DIM.match(text, i)
            if m is None:
                break
            d = m.group(1)
            if d == "?":
                dims.append(None)
            else:
                digits = d.lstrip("0")
                if len(digits) > 19 or int(d) > MAX_DIM:
                    raise self.error(f"tensor dimension {d} does not fit in int64", pos)
                dims.append(int(d))
            i = m.end()
        m = _ELEMENT.match(text, i)
        if m is None or not m.group(1):
            bad = _BAD_DIM.match(text, i)
            if text.find(">", i) < 0:
                raise self.error("unterminated tensor type")
            found = shorten(bad.group(0).strip()) if bad else ""
            raise self.error(f"bad tensor dimension '{found}'", pos)
        el = m.group(1)
        if m.group(2) == ",":
            raise self.error("tensor encodings are not supported", pos)
        if el not in SCALAR_NAMES:
            raise self.error(f"unsupported tensor element type '{el}'", pos)
        if m.group(2) != ">":
            if text.find(">", i) < 0:
                raise self.error("unterminated tensor type")
            raise self.error(f"expected '>' to end the tensor type, found "
                             f"{text[m.end(1):m.end(1) + 1]!r}", m.end(1))
        count = 1
        for d in dims if None not in dims else ():  # stops at the first overflow
            count *= d  # type: ignore[operator]
            if count > MAX_DIM:
                raise self.error("tensor type has more elements than fit in int64", pos)
        self.pos = m.end()
        return TensorType(tuple(dims), ScalarType(el))

    # --------------------------------------------------------------- attributes
    def attr_dict(self) -> dict[str, Attribute]:
        self.expect("{")
        out: dict[str, Attribute] = {}
        if self.accept("}"):
            return out
        while True:
            self.skip()
            kpos = self.pos
            key = self.string() if self.peek('"') else self.ident("attribute name")
            if key in out:
                raise self.error(f"duplicate attribute '{key}'", kpos)
            out[key] = self.parse_attribute() if self.accept("=") else UnitAttr()
            if self.accept("}"):
                return out
            self.expect(",", "',' or '}' in an attribute dictionary")

    def parse_attribute(self) -> Attribute:
        self._enter()
        try:
            return self._parse_attribute()
        finally:
            self.depth -= 1

    def _parse_attribute(self) -> Attribute:
        self.skip()
        parse = self._ATTRIBUTE_BY_LEAD.get(self.text[self.pos:self.pos + 1])
        if parse is not None:
            return parse(self)
        if _NUMBER.match(self.text, self.pos):
            return self._number_attribute()
        return self._keyword_attribute()

    def _string_attr(self) -> StringAttr:
        """``"…"``, with an optional ``: type`` that is read and dropped."""
        s = self.string()
        if self.accept(":"):
            self.parse_type()  # typed string: the type is dropped
        return StringAttr(s)

    def _array_attr(self) -> ArrayAttr:
        """``[a, b, …]``: a list of attributes."""
        self.pos += 1
        vals: list[Attribute] = []
        if not self.accept("]"):
            while True:
                vals.append(self.parse_attribute())
                if self.accept("]"):
                    break
                self.expect(",", "',' or ']'")
        return ArrayAttr(tuple(vals))

    def _dict_attr(self) -> DictAttr:
        """``{k = v, …}`` as an attribute value."""
        return DictAttr(tuple(self.attr_dict().items()))

    def _symbol_ref_attr(self) -> SymbolRefAttr:
        """``@name`` or ``@"name"``."""
        self.pos += 1
        if self.peek('"'):
            return SymbolRefAttr(self.string())
        return SymbolRefAttr(self.ident("symbol name"))

    def _type_attr(self) -> TypeAttr:
        """A type used as an attribute value."""
        return TypeAttr(self.parse_type())

    _ATTRIBUTE_BY_LEAD: ClassVar[dict[str, Callable[[AttrParser], Attribute]]] = {
        '"': _string_attr, "[": _array_attr, "{": _dict_attr, "@": _symbol_ref_attr,
        "(": _type_attr, "!": _type_attr,
    }
    """The attribute family each leading character starts (numbers and keywords aside)."""

    def _number_attribute(self) -> Attribute:
        """A number literal with an optional ``: type``, which must be a scalar type."""
        pos = self.pos
        text = self.number()
        t: ScalarType | None = None
        if self.accept(":"):
            self.skip()
            tpos = self.pos
            ty = self.parse_type()
            if not isinstance(ty, ScalarType):
                raise self.error("a number attribute needs a scalar type", tpos)
            t = ty
        return self._number_attr(text, t, pos)

    def _keyword_attribute(self) -> Attribute:
        """``true``/``false``, ``unit``, ``array<…>``, ``dense<…>`` or a named type."""
        name = self.peek_ident()
        if name in ("true", "false"):
            self.pos += len(name)
            if self.accept(":"):
                self.parse_type()
            return BoolAttr(name == "true")
        if name == "unit":
            self.pos += len(name)
            return UnitAttr()
        if name == "array":
            return self.dense_array()
        if name == "dense":
            return self.dense_elements()
        if name in ("tensor", "none") or name in SCALAR_NAMES:
            return TypeAttr(self.parse_type())
        raise self.error(f"expected an attribute value, found {self._found()}")

    def _number_attr(self, text: str, t: ScalarType | None, pos: int) -> Attribute:
        is_hex = text.lower().lstrip("-+").startswith("0x")
        is_float_text = not is_hex and ("." in text or "e" in text.lower())
        if t is None:
            if is_float_text:
                return FloatAttr(float(text), ScalarType("f64"))
            return IntegerAttr(self._int_in_range(text, I64, pos))
        if t.is_float:
            return FloatAttr(self._float_value(text, t, pos), t)
        if is_float_text:
            raise self.error(f"integer type {t} given a float value {shorten(text)}", pos)
        if t.name == "i1":
            return BoolAttr(bool(self._int_in_range(text, t, pos)))
        return IntegerAttr(self._int_in_range(text, t, pos), t)

    def _int_in_range(self, text: str, t: ScalarType, pos: int) -> int:
        """An integer literal that fits ``t`` (signed or unsigned, as MLIR accepts)."""
        value = int_literal(text)
        if value is None or not -(1 << (t.bits - 1)) <= value < (1 << t.bits):
            raise self.error(f"integer {shorten(text)} does not fit in {t}", pos)
        return value

    def _float_value(self, text: str, t: ScalarType, pos: int) -> float:
        if text.lower().lstrip("-+").startswith("0x"):
            bits = int_literal(text.lstrip("+"))
            if text.startswith("-") or bits is None or bits >= 1 << t.bits:
                raise self.error(f"hex float {shorten(text)} is not a {t} bit pattern", pos)
            return float_from_bits(bits, t)  # NaN payloads kept
        return float(text)

    def dense_array(self) -> DenseArrayAttr:
        self.ident()
        self.expect("<", "'<' after 'array'")
        self.skip()
        tpos = self.pos
        el = self.parse_type()
        if not isinstance(el, ScalarType) or not el.is_int:
            raise self.error("only integer 'array<…>' attributes are supported", tpos)
        vals: list[int] = []
        if self.accept(":"):
            while True:
                self.skip()
                vpos = self.pos
                vals.append(self._int_in_range(str(self.integer()), el, vpos))
                if not self.accept(","):
                    break
        self.expect(">", "'>' to end 'array<…>'")
        return DenseArrayAttr(tuple(vals), el)

    def dense_elements(self) -> DenseElementsAttr:
        start = self.pos
        self.ident()
        self.expect("<", "'<' after 'dense'")
        self.skip()
        body_pos = self.pos
        hex_blob: str | None = None
        flat: list[object] = []
        shape: tuple[int, ...] = (0,)
        if self.peek('"'):
            hex_blob = self.string()
        elif not self.peek(">"):
            flat, shape = self._dense_literal()
        self.expect(">", "'>' to end 'dense<…>'")
        self.expect(":", "':' and the type of the dense elements")
        self.skip()
        tpos = self.pos
        t = self.parse_type()
        if not isinstance(t, TensorType) or not t.is_static:
            raise self.error("dense elements need a static tensor type", tpos)
        el = t.element
        n = t.num_elements
        if hex_blob is not None:
            arr = self._dense_hex(hex_blob, el, n, body_pos)
            self._check_count(n, arr.size == 1 and n != 1, start)
            return DenseElementsAttr(t, arr, splat=arr.size == 1 and n != 1)
        if not flat and n == 0:  # ``dense<>`` / ``[]`` / ``[[], []]`` of an empty tensor
            return DenseElementsAttr(t, np.zeros(0, numpy_dtype(el)))
        if shape == ():
            self._check_count(n, n != 1, start)
            return DenseElementsAttr(t, [self._dense_value(v, el, body_pos) for v in flat],
                                     splat=n != 1)
        if tuple(shape) != tuple(t.shape):
            raise self.error(f"dense literal has shape {list(shape)} but its type is {t}", start)
        return DenseElementsAttr(t, [self._dense_value(v, el, body_pos) for v in flat])

    def _check_count(self, n: int, splat: bool, pos: int) -> None:
        """Reject a constant past its element limit, before anything is allocated."""
        limit = dense_limit(splat)
        if n > limit:
            kind = "a splat" if splat else "a non-splat constant"
            raise self.error(f"dense elements of {n} values exceed the limit of {limit} for "
                             f"{kind}", pos)

    def _dense_hex(self, blob: str, el: ScalarType, n: int, pos: int) -> np.ndarray:
        """The values of a ``"0x…"`` blob: one (a splat) or ``n``, little-endian."""
        if not blob.lower().startswith("0x"):
            raise self.error("expected a hex string '0x…' in dense elements", pos)
        try:
            data = bytes.fromhex(blob[2:])
        except ValueError:
            raise self.error("malformed hex in dense elements", pos) from None
        if el.name == "i1":  # MLIR packs i1 eight to a byte, first value lowest
            if len(data) not in (1, (n + 7) // 8):
                raise self.error(f"hex dense elements of {len(data)} bytes do not hold {n} "
                                 f"i1 values", pos)
            bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
            return bits[:n].astype(bool) if len(data) > 1 or n <= 8 else bits[:1].astype(bool)
        size = 2 if el.name == "bf16" else numpy_dtype(el).itemsize
        if len(data) % size:
            raise self.error(f"hex dense elements of {len(data)} bytes do not hold whole {el} "
                             f"values", pos)
        if len(data) // size not in (1, n):
            raise self.error(f"hex dense elements hold {len(data) // size} values, type needs "
                             f"{n}", pos)
        if el.name == "bf16":
            return (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        return np.frombuffer(data, dtype=numpy_dtype(el).newbyteorder("<"))

    def _dense_literal(self) -> tuple[list[object], tuple[int, ...]]:
        """A scalar or nested list, read iteratively: (flat tokens, shape; ``()`` for a scalar)."""
        self.skip()
        if not self.peek("["):
            return [self._dense_token()], ()
        shape = _DenseShape(self, self.pos)
        flat: list[object] = []
        self.expect("[")
        shape.open()
        while True:
            if shape.counts[-1] == 0 and self.accept("]"):  # an empty list
                if shape.close():
                    break
            elif self.accept("["):
                shape.open()
                continue
            else:
                shape.value()
                flat.append(self._dense_token())
            if self._dense_item_end(shape):
                break
        return flat, shape.shape()

    def _dense_item_end(self, shape: _DenseShape) -> bool:
        """After an item, a ``,`` or ``]``s that close lists; True once the outermost is closed."""
        while not self.accept(","):
            self.expect("]", "',' or ']' in dense elements")
            if shape.close():
                return True
        return False

    def _dense_token(self) -> object:
        name = self.peek_ident()
        if name in ("true", "false"):
            self.pos += len(name)
            return name == "true"
        return self.number()

    def _dense_value(self, v: object, el: ScalarType, pos: int) -> object:
        if isinstance(v, bool):
            return v
        text = str(v)
        if el.is_float:
            return self._float_value(text, el, pos)
        if "." in text or ("e" in text.lower() and not text.lower().startswith("0x")):
            raise self.error(f"float value {shorten(text)} in an integer dense attribute", pos)
        value = self._int_in_range(text, el, pos)
        if el.is_unsigned:
            return value % (1 << el.bits)  # -1 : ui8 is 255
        if el.bits > 1 and value >= 1 << (el.bits - 1):  # stored as bits: 255 : i8 is -1
            value -= 1 << el.bits
        return value

    # ---------------------------------------------------------------- locations
    def parse_loc(self) -> Location | None:
        self.skip()
        start = self.pos
        self.pos += 3
        end = self._balanced_end(self.pos, "(", ")")
        inner = self.text[self.pos + 1:end - 1]
        self.pos = end
        loc = self._loc_from_text(inner)
        if loc is None:
            raise self.error("malformed location", start)
        return loc

    def _loc_from_text(self, inner: str) -> Location | None:
        inner = inner.strip()
        if inner.startswith("#"):
            return self.loc_aliases.get(inner[1:], UNKNOWN)
        m = _FILE_LOC.search(inner)
        if m:
            return Location(m.group(1), int(m.group(2)), int(m.group(3)))
        m = re.search(r"#([A-Za-z0-9_$.\-]+)", inner)
        if m and m.group(1) in self.loc_aliases:
            return self.loc_aliases[m.group(1)]
        return UNKNOWN
