"""Parse MLIR's generic operation syntax into choir.

Reads what accy's printer writes and what ``mlir-opt -mlir-print-op-generic``
writes for accy's programs: properties ``<{…}>``, ``loc(…)`` (inline and
``#loc`` aliases), ``%argN`` names, ``%0:2`` / ``%0#1`` multi-results, MLIR's
float spellings (``9.99999974E-6``, hex bit patterns) and dense elements in
nested-list, splat and hex-blob forms. Every error is a ``ParseError`` with
``file:line:col``.

Example
-------
>>> m = parse_module('"builtin.module"() ({\\n}) : () -> ()', "x.mlir")
>>> m.op_name
'builtin.module'
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
from accy.choir.builtin import ModuleOp
from accy.choir.ir import Block, Operation, Region, Value
from accy.choir.location import UNKNOWN, Location
from accy.errors import ParseError

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_$.\-]*")
_SUFFIX_ID = re.compile(r"[A-Za-z0-9_$.\-]+")
_NUMBER = re.compile(r"[-+]?(0x[0-9A-Fa-f]+|[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?)")
_LOC_DEF = re.compile(r"^#([A-Za-z0-9_$.\-]+)\s*=\s*loc\((.*)\)\s*$", re.M)
_FILE_LOC = re.compile(r'"((?:[^"\\]|\\.)*)":(\d+):(\d+)')
MAX_DEPTH = 200


def _int(text: str) -> int:
    """An integer literal: decimal (leading zeros allowed, as in MLIR) or ``0x`` hex."""
    return int(text, 16) if text.lower().lstrip("-+").startswith("0x") else int(text, 10)


class Parser:
    """A character-level recursive-descent parser over one source text."""

    def __init__(self, text: str, file: str = "<string>") -> None:
        import accy.dialects  # noqa: F401  (registers the declared op classes)

        self.text = text
        self.file = file
        self.pos = 0
        self.scopes: list[dict[str, list[Value]]] = [{}]
        self.depth = 0
        self.loc_aliases: dict[str, Location] = {}
        self.alias_spans: list[tuple[int, int]] = []
        for m in _LOC_DEF.finditer(text):
            self.loc_aliases[m.group(1)] = self._loc_from_text(m.group(2))
            self.alias_spans.append((m.start(), m.end()))

    # ------------------------------------------------------------------ lexing
    def location(self, pos: int | None = None) -> Location:
        pos = self.pos if pos is None else pos
        line = self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return Location(self.file, line, col)

    def error(self, message: str, pos: int | None = None) -> ParseError:
        return ParseError(message, self.location(pos))

    def skip(self) -> None:
        text, n = self.text, len(self.text)
        while self.pos < n:
            c = text[self.pos]
            if c in " \t\r\n":
                self.pos += 1
            elif text.startswith("//", self.pos):
                nl = text.find("\n", self.pos)
                self.pos = n if nl < 0 else nl + 1
            else:
                break

    def peek(self, s: str) -> bool:
        self.skip()
        return self.text.startswith(s, self.pos)

    def accept(self, s: str) -> bool:
        if self.peek(s):
            self.pos += len(s)
            return True
        return False

    def expect(self, s: str, what: str | None = None) -> None:
        if not self.accept(s):
            found = self._found()
            raise self.error(f"expected {what or repr(s)}, found {found}")

    def _found(self) -> str:
        self.skip()
        if self.pos >= len(self.text):
            return "end of file"
        m = _IDENT.match(self.text, self.pos) or _NUMBER.match(self.text, self.pos)
        return repr(m.group(0)) if m else repr(self.text[self.pos])

    def ident(self, what: str = "identifier") -> str:
        self.skip()
        m = _IDENT.match(self.text, self.pos)
        if not m:
            raise self.error(f"expected {what}, found {self._found()}")
        self.pos = m.end()
        return m.group(0)

    def peek_ident(self) -> str | None:
        self.skip()
        m = _IDENT.match(self.text, self.pos)
        return m.group(0) if m else None

    def string(self) -> str:
        self.skip()
        start = self.pos
        if not self.text.startswith('"', self.pos):
            raise self.error(f"expected string literal, found {self._found()}")
        self.pos += 1
        out = []
        while True:
            if self.pos >= len(self.text) or self.text[self.pos] == "\n":
                raise self.error("unterminated string literal", start)
            c = self.text[self.pos]
            if c == '"':
                self.pos += 1
                return "".join(out)
            if c == "\\":
                nxt = self.text[self.pos + 1:self.pos + 2]
                if nxt in ('"', "\\"):
                    out.append(nxt)
                    self.pos += 2
                elif nxt == "n":
                    out.append("\n")
                    self.pos += 2
                elif nxt == "t":
                    out.append("\t")
                    self.pos += 2
                elif re.fullmatch(r"[0-9A-Fa-f]{2}", self.text[self.pos + 1:self.pos + 3]):
                    out.append(chr(int(self.text[self.pos + 1:self.pos + 3], 16)))
                    self.pos += 3
                else:
                    raise self.error("unknown escape in string literal")
            else:
                out.append(c)
                self.pos += 1

    def number(self) -> str:
        self.skip()
        m = _NUMBER.match(self.text, self.pos)
        if not m:
            raise self.error(f"expected a number, found {self._found()}")
        self.pos = m.end()
        return m.group(0)

    def integer(self, what: str = "integer") -> int:
        start = self.pos
        text = self.number()
        if "." in text or ("e" in text.lower() and not text.lower().startswith(("0x", "-0x"))):
            raise self.error(f"expected {what}, found {text!r}", start)
        return _int(text)

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error("nesting too deep")

    # ---------------------------------------------------------------- toplevel
    def parse_toplevel(self) -> ModuleOp:
        ops: list[Operation] = []
        while True:
            self.skip()
            if self.pos >= len(self.text):
                break
            span = next((s for s in self.alias_spans if s[0] == self.pos), None)
            if span is not None:
                self.pos = span[1]
                continue
            if self.peek("#"):
                raise self.error("unsupported attribute alias definition")
            ops.append(self.parse_op())
        if not ops:
            raise ParseError("empty file: expected a 'builtin.module'", Location(self.file, 1, 1))
        if len(ops) == 1 and isinstance(ops[0], ModuleOp):
            return ops[0]
        if any(isinstance(op, ModuleOp) for op in ops):
            raise ParseError("expected exactly one top-level 'builtin.module'", ops[1].loc)
        module = ModuleOp.build(Location(self.file, 1, 1))
        for op in ops:
            module.body.append(op)
        return module

    # --------------------------------------------------------------- operations
    def parse_op(self) -> Operation:
        self._enter()
        self.skip()
        start = self.pos
        results: list[tuple[str, int, int]] = []  # (name, count, pos)
        if self.peek("%"):
            while True:
                self.skip()
                rpos = self.pos
                name = self.value_name()
                count = 1
                if self.accept(":"):
                    count = self.integer("result count")
                results.append((name, count, rpos))
                if not self.accept(","):
                    break
            self.expect("=")
        self.skip()
        if not self.peek('"'):
            raise self.error(f"expected an operation in generic form (\"dialect.op\"), "
                             f"found {self._found()}")
        name_pos = self.pos
        op_name = self.string()
        if "." not in op_name:
            raise self.error(f"operation name '{op_name}' needs a dialect prefix", name_pos)
        self.expect("(")
        operands: list[Value] = []
        operand_pos: list[int] = []
        if not self.accept(")"):
            while True:
                self.skip()
                operand_pos.append(self.pos)
                operands.append(self.value_use())
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')'")
        if self.peek("["):
            raise self.error("block successors are not supported")
        properties: dict[str, Attribute] = {}
        if self.accept("<"):
            self.skip()
            if not self.peek("{"):
                raise self.error("expected '{' to start properties")
            properties = self.attr_dict()
            self.expect(">", "'>' to end properties")
        regions: list[Region] = []
        if self.accept("("):
            while True:
                self.scopes.append({})
                regions.append(self.parse_region())
                self.scopes.pop()
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' after region")
        attributes: dict[str, Attribute] = {}
        if self.peek("{"):
            attributes = self.attr_dict()
        self.expect(":", "':' and the operation's function type")
        self.skip()
        type_pos = self.pos
        ftype = self.parse_type()
        if not isinstance(ftype, FunctionType):
            raise self.error("expected a function type '(…) -> …' for the operation", type_pos)
        loc = self.location(start)
        if self.peek("loc("):
            loc = self.parse_loc() or loc
        if len(ftype.inputs) != len(operands):
            raise self.error(f"'{op_name}' has {len(operands)} operands but its type lists "
                             f"{len(ftype.inputs)}", type_pos)
        for i, (v, t) in enumerate(zip(operands, ftype.inputs)):
            if v.type != t:
                raise self.error(f"operand {i} of '{op_name}' has type {v.type} but the "
                                 f"operation's type says {t}", operand_pos[i])
        n_results = sum(c for _, c, _ in results)
        if n_results != len(ftype.results):
            raise self.error(f"'{op_name}' defines {n_results} results but its type lists "
                             f"{len(ftype.results)}", start)
        op = Operation.create(op_name, operands, ftype.results, attributes, properties, regions,
                              loc)
        if isinstance(op, ModuleOp) and len(regions) == 1 and not regions[0].blocks:
            regions[0].add_block(Block())  # a module always has its (implicit) block, as in MLIR
        k = 0
        for name, count, rpos in results:
            if name in self.scopes[-1]:
                raise self.error(f"redefinition of SSA value '%{name}'", rpos)
            self.scopes[-1][name] = op.results[k:k + count]
            k += count
        self.depth -= 1
        return op

    def value_name(self) -> str:
        self.skip()
        if not self.accept("%"):
            raise self.error(f"expected an SSA value, found {self._found()}")
        m = _SUFFIX_ID.match(self.text, self.pos)
        if not m:
            raise self.error("expected an SSA value name after '%'")
        self.pos = m.end()
        return m.group(0)

    def value_use(self) -> Value:
        pos = self.pos
        name = self.value_name()
        index = 0
        if self.text.startswith("#", self.pos):
            self.pos += 1
            index = self.integer("result number")
        for scope in reversed(self.scopes):
            if name in scope:
                group = scope[name]
                if index >= len(group):
                    raise self.error(f"'%{name}' has only {len(group)} results", pos)
                return group[index]
        raise self.error(f"use of undefined value '%{name}'", pos)

    def parse_region(self) -> Region:
        self.expect("{", "'{' to start a region")
        region = Region()
        first = True
        while not self.accept("}"):
            self.skip()
            if self.pos >= len(self.text):
                raise self.error("unexpected end of file: expected '}' to close a region")
            block = Block()
            if self.peek("^"):
                self.pos += 1
                m = _SUFFIX_ID.match(self.text, self.pos)
                if not m:
                    raise self.error("expected a block label after '^'")
                self.pos = m.end()
                if self.accept("("):
                    if not self.accept(")"):
                        while True:
                            self.skip()
                            apos = self.pos
                            name = self.value_name()
                            self.expect(":", "':' and the argument's type")
                            t = self.parse_type()
                            loc = self.location(apos)
                            if self.peek("loc("):
                                loc = self.parse_loc() or loc
                            if name in self.scopes[-1]:
                                raise self.error(f"redefinition of SSA value '%{name}'", apos)
                            self.scopes[-1][name] = [block.add_arg(t, loc)]
                            if self.accept(")"):
                                break
                            self.expect(",", "',' or ')'")
                self.expect(":", "':' after the block label")
            elif not first:
                raise self.error("expected a block label '^bbN' or '}'")
            region.add_block(block)
            first = False
            while not (self.peek("}") or self.peek("^")):
                self.skip()
                if self.pos >= len(self.text):
                    raise self.error("unexpected end of file: expected '}' to close a region")
                block.append(self.parse_op())
        return region

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

    def _balanced_end(self, pos: int, open_: str, close: str) -> int:
        depth = 0
        i = pos
        while i < len(self.text):
            c = self.text[i]
            if c == '"':
                j = i + 1
                while j < len(self.text) and self.text[j] != '"':
                    j += 2 if self.text[j] == "\\" else 1
                i = j
            elif c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        raise self.error(f"unbalanced '{open_}'", pos)

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


def parse_module(text: str, file: str = "<string>") -> ModuleOp:
    """Parse one program (a ``builtin.module``, or top-level ops wrapped in one)."""
    return Parser(text, file).parse_toplevel()


def parse_file(path: str) -> ModuleOp:
    """Read and parse ``path``; unreadable files are a ``ParseError`` too."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ParseError(f"cannot read file: {e}", Location(path, 1, 1)) from None
    return parse_module(text, path)
