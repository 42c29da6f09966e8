"""Types, attributes and locations of MLIR's syntax, as choir reads them.

Example
-------
>>> p = AttrParser("dense<[1.0, 2.5]> : tensor<2xf32>")
>>> p.parse_attribute().values
(1.0, 2.5)
"""

from __future__ import annotations

import re
import struct

import numpy as np

from accy.choir.attributes import (
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
    numpy_dtype,
)
from accy.choir.lexer import NUMBER as _NUMBER
from accy.choir.lexer import SUFFIX_ID as _SUFFIX_ID
from accy.choir.lexer import Lexer
from accy.choir.lexer import int_literal as _int
from accy.choir.location import UNKNOWN, Location

_LOC_DEF = re.compile(r"^#([A-Za-z0-9_$.\-]+)\s*=\s*loc\((.*)\)\s*$", re.M)
_FILE_LOC = re.compile(r'"((?:[^"\\]|\\.)*)":(\d+):(\d+)')


class AttrParser(Lexer):
    """Parses types, attributes (incl. ``dense<…>``) and ``loc(…)``."""

    def __init__(self, text: str, file: str = "<string>") -> None:
        super().__init__(text, file)
        self.loc_aliases: dict[str, Location] = {}
        self.alias_spans: list[tuple[int, int]] = []
        for m in _LOC_DEF.finditer(text):
            self.loc_aliases[m.group(1)] = self._loc_from_text(m.group(2))
            self.alias_spans.append((m.start(), m.end()))

    # -------------------------------------------------------------------- types
    def parse_type(self) -> Type:
        self.skip()
        pos = self.pos
        if self.accept("("):
            inputs: list[Type] = []
            if not self.accept(")"):
                while True:
                    inputs.append(self.parse_type())
                    if self.accept(")"):
                        break
                    self.expect(",", "',' or ')' in a type list")
            self.expect("->", "'->' in a function type")
            if self.accept("("):
                results: list[Type] = []
                if not self.accept(")"):
                    while True:
                        results.append(self.parse_type())
                        if self.accept(")"):
                            break
                        self.expect(",", "',' or ')' in a type list")
                return FunctionType(tuple(inputs), tuple(results))
            return FunctionType(tuple(inputs), (self.parse_type(),))
        if self.accept("!"):
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

    def tensor_body(self, pos: int) -> TensorType:
        if not self.text.startswith("<", self.pos):
            raise self.error("expected '<' after 'tensor'")
        end = self.text.find(">", self.pos)
        if end < 0:
            raise self.error("unterminated tensor type")
        body = self.text[self.pos + 1:end]
        parts = body.replace(" ", "").split("x")
        if "," in body:
            raise self.error("tensor encodings are not supported", pos)
        el = parts[-1]
        if el not in SCALAR_NAMES:
            raise self.error(f"unsupported tensor element type '{el}'", pos)
        dims: list[int | None] = []
        for d in parts[:-1]:
            if d == "?":
                dims.append(None)
            elif d.isdigit():
                dims.append(int(d))
            else:
                raise self.error(f"bad tensor dimension '{d}'", pos)
        self.pos = end + 1
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
        pos = self.pos
        if self.peek('"'):
            s = self.string()
            if self.accept(":"):
                self.parse_type()  # typed string: the type is dropped
            return StringAttr(s)
        if self.peek("["):
            self.pos += 1
            vals: list[Attribute] = []
            if not self.accept("]"):
                while True:
                    vals.append(self.parse_attribute())
                    if self.accept("]"):
                        break
                    self.expect(",", "',' or ']'")
            return ArrayAttr(tuple(vals))
        if self.peek("{"):
            return DictAttr(tuple(self.attr_dict().items()))
        if self.peek("@"):
            self.pos += 1
            if self.peek('"'):
                return SymbolRefAttr(self.string())
            return SymbolRefAttr(self.ident("symbol name"))
        if self.peek("(") or self.peek("!"):
            return TypeAttr(self.parse_type())
        m = _NUMBER.match(self.text, self.pos)
        if m:
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
            return IntegerAttr(_int(text))
        if t.is_float:
            return FloatAttr(self._float_value(text, t, pos), t)
        if is_float_text:
            raise self.error(f"integer type {t} given a float value {text}", pos)
        if t.name == "i1":
            return BoolAttr(bool(self._int_in_range(text, t, pos)))
        return IntegerAttr(self._int_in_range(text, t, pos), t)

    def _int_in_range(self, text: str, t: ScalarType, pos: int) -> int:
        """An integer literal that fits ``t`` (signed or unsigned, as MLIR accepts)."""
        value = _int(text)
        if not -(1 << (t.bits - 1)) <= value < (1 << t.bits):
            raise self.error(f"integer {text} does not fit in {t}", pos)
        return value

    def _float_value(self, text: str, t: ScalarType, pos: int) -> float:
        if text.lower().lstrip("-+").startswith("0x"):
            bits = int(text, 16)
            if text.startswith("-") or bits >= 1 << t.bits:
                raise self.error(f"hex float {text} is not a {t} bit pattern", pos)
            if t.name == "f64":
                return struct.unpack("<d", struct.pack("<Q", bits))[0]
            if t.name == "f32":
                return struct.unpack("<f", struct.pack("<I", bits))[0]
            if t.name == "f16":
                return float(np.array(bits, dtype=np.uint16).view(np.float16))
            if t.name == "bf16":
                return struct.unpack("<f", struct.pack("<I", bits << 16))[0]
            raise self.error(f"hex float for type {t}", pos)
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
        raw: object
        if self.peek('"'):
            raw = ("hex", self.string())
        elif self.peek(">"):
            raw = ("list", [])
        else:
            raw = ("list", self._dense_literal())
        self.expect(">", "'>' to end 'dense<…>'")
        self.expect(":", "':' and the type of the dense elements")
        self.skip()
        tpos = self.pos
        t = self.parse_type()
        if not isinstance(t, TensorType) or not t.is_static:
            raise self.error("dense elements need a static tensor type", tpos)
        el = t.element
        n = t.num_elements
        if raw[0] == "hex":
            blob = raw[1]
            if not blob.lower().startswith("0x"):
                raise self.error("expected a hex string '0x…' in dense elements", body_pos)
            try:
                data = bytes.fromhex(blob[2:])
            except ValueError:
                raise self.error("malformed hex in dense elements", body_pos) from None
            dtype = numpy_dtype(el) if el.name not in ("bf16", "i1") else None
            if el.name == "bf16":
                arr = (np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16).view(
                    np.float32)
            elif el.name == "i1":  # MLIR packs i1 eight to a byte, first value lowest
                bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
                arr = bits[:n].astype(bool) if bits.size >= n else bits[:1].astype(bool)
            else:
                if len(data) % dtype.itemsize:  # type: ignore[union-attr]
                    raise self.error(f"hex dense elements of {len(data)} bytes do not hold "
                                     f"whole {el} values", body_pos)
                arr = np.frombuffer(data, dtype=dtype)  # type: ignore[arg-type]
            if arr.size not in (1, n):
                raise self.error(f"hex dense elements hold {arr.size} values, type needs {n}",
                                 body_pos)
            return DenseElementsAttr(t, tuple(v.item() for v in arr), splat=arr.size == 1 and n != 1)
        flat, shape = self._flatten(raw[1], body_pos)
        if shape == () or (len(flat) == 1 and shape == ()):
            return DenseElementsAttr(t, tuple(self._dense_value(v, el, body_pos) for v in flat),
                                     splat=n != 1)
        if tuple(shape) != tuple(t.shape):
            raise self.error(f"dense literal has shape {list(shape)} but its type is {t}", start)
        return DenseElementsAttr(t, tuple(self._dense_value(v, el, body_pos) for v in flat))

    def _dense_literal(self) -> object:
        self.skip()
        if self.accept("["):
            items = []
            if not self.accept("]"):
                while True:
                    items.append(self._dense_literal())
                    if self.accept("]"):
                        break
                    self.expect(",", "',' or ']' in dense elements")
            return items
        name = self.peek_ident()
        if name in ("true", "false"):
            self.pos += len(name)
            return name == "true"
        return self.number()

    def _flatten(self, lit: object, pos: int) -> tuple[list[object], tuple[int, ...]]:
        if not isinstance(lit, list):
            return [lit], ()
        if not lit:
            return [], (0,)
        parts = [self._flatten(x, pos) for x in lit]
        shapes = {s for _, s in parts}
        if len(shapes) != 1:
            raise self.error("ragged dense literal", pos)
        flat = [v for f, _ in parts for v in f]
        return flat, (len(lit),) + parts[0][1]

    def _dense_value(self, v: object, el: ScalarType, pos: int) -> object:
        if isinstance(v, bool):
            return v
        text = str(v)
        if el.is_float:
            return self._float_value(text, el, pos)
        if "." in text or ("e" in text.lower() and not text.lower().startswith("0x")):
            raise self.error(f"float value {text} in an integer dense attribute", pos)
        value = self._int_in_range(text, el, pos)
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
