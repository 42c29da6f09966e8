"""The wire form of choir: msgpack with a magic and version header, and fingerprints.

``encode(op)`` writes a module (locations kept, so errors still point at
source lines after the IR has moved between processes); ``decode(data)``
reads it back (format 2, and format 1 as earlier versions wrote it), strictly
and within bounds: any malformed, truncated, oversized or too deeply nested
input raises :class:`~accy.errors.WireFormatError`. There is no pickle on
this path.

Dense constants travel as their raw little-endian values: a splat as its one
value (never its full shape), anything else decoded by NumPy as a view of the
payload (no per-element Python objects). The limits — ``MAX_BYTES`` of input,
``MAX_DEPTH`` of nesting, ``MAX_OPS`` operations, ``MAX_DENSE_ELEMENTS``
values in a non-splat constant and ``MAX_SPLAT_ELEMENTS`` in a splat's shape,
int64 dims, integers that fit their type — are checked before anything is
allocated for them.

``fingerprint(op)`` is a 128-bit BLAKE2b of the *canonical* form: the same
encoding with values numbered by definition order (so SSA names do not
matter), attributes sorted, and locations left out.

Format 2 (what ``encode`` writes) is two msgpack objects back to back: the
header ``[magic, 2, files, locations]``, then the canonical body (every
location in it ``nil``); ``locations`` lists them in the order the decoder
meets them (an op's before its regions, a block's arguments before its ops).
The canonical form is then a fixed header plus the body's bytes, so a stage
product written to the store gets its wire bytes and its fingerprint from one
walk and one ``packb`` (format 1, ``[magic, 1, files, body]`` with the
locations inline, needed a second walk that dropped them and a second
``packb``: in a 15-worker batch the walk was 12.5 % of a worker's samples in
group tasks and ``packb`` 13.8 %). The body is decoded from a view of the
input, so a dense payload is still never copied.

Example
-------
>>> from accy.choir.builtin import ModuleOp
>>> m = ModuleOp.build()
>>> decode(encode(m)).op_name
'builtin.module'
>>> len(fingerprint(m))
32
"""

from __future__ import annotations

import hashlib
import io
from typing import Any

import msgpack
import numpy as np

from accy.choir.attributes import (
    MAX_DENSE_ELEMENTS,
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
    numpy_dtype,
)
from accy.choir.ir import Block, Operation, Region, Value
from accy.choir.location import UNKNOWN, Location
from accy.errors import WireFormatError

MAGIC = b"choir"
WIRE_VERSION = 2
"""The format ``encode`` writes: the canonical body's bytes, the locations beside them."""
INLINE_VERSION = 1
"""The format earlier versions wrote (locations inline in the body); still read."""
MAX_BYTES = 1 << 30
MAX_DEPTH = 64
MAX_OPS = 1_000_000
MAX_ELEMENTS = MAX_DENSE_ELEMENTS
"""Most values of a non-splat dense constant (see ``attributes.MAX_DENSE_ELEMENTS``)."""
MAX_DIM = (1 << 63) - 1


# ---------------------------------------------------------------------- encoding


class _Encoder:
    """Builds the canonical body's lists; with ``located``, also the location table
    (format 2): one entry per op and block argument, in pre-order."""

    def __init__(self, located: bool) -> None:
        self.located = located
        self.ids: dict[Value, int] = {}
        self.files: dict[str, int] = {}
        self.locs: list[Any] = []

    def loc(self, loc: Location) -> None:
        if self.located:
            if loc.known:
                idx = self.files.setdefault(loc.file, len(self.files))
                self.locs.append([idx, loc.line, loc.col])
            else:
                self.locs.append(None)

    def type(self, t: Type) -> Any:
        if isinstance(t, ScalarType):
            return t.name
        if isinstance(t, TensorType):
            return [0, [-1 if d is None else d for d in t.shape], t.element.name]
        if isinstance(t, FunctionType):
            return [1, [self.type(x) for x in t.inputs], [self.type(x) for x in t.results]]
        if isinstance(t, NoneType):
            return [2]
        if isinstance(t, OpaqueType):
            return [3, t.text]
        raise TypeError(f"cannot encode type {t!r}")

    def attr(self, a: Attribute) -> Any:
        # the commonest kinds first (dense arrays, strings, integers: most of a product's)
        if isinstance(a, DenseArrayAttr):
            return [6, a.element.name, list(a.values)]
        if isinstance(a, StringAttr):
            return [2, a.value]
        if isinstance(a, IntegerAttr):
            return [0, a.value, a.type.name]
        if isinstance(a, FloatAttr):
            return [1, a.value, a.type.name]
        if isinstance(a, BoolAttr):
            return [3, a.value]
        if isinstance(a, UnitAttr):
            return [4]
        if isinstance(a, TypeAttr):
            return [5, self.type(a.type)]
        if isinstance(a, DenseElementsAttr):  # a splat's one value, never its full shape
            arr = a.data.astype(np.uint8) if a.type.element.name == "i1" else a.data
            return [7, self.type(a.type), a.splat,
                    arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()]
        if isinstance(a, ArrayAttr):
            return [8, [self.attr(v) for v in a.values]]
        if isinstance(a, DictAttr):
            return [9, [[k, self.attr(v)] for k, v in a.entries]]
        if isinstance(a, SymbolRefAttr):
            return [10, a.name]
        raise TypeError(f"cannot encode attribute {a!r}")

    def attrs(self, d: dict[str, Attribute]) -> Any:
        if not d:  # most ops have no attributes or no properties
            return []
        return [[k, self.attr(d[k])] for k in sorted(d)]

    def op(self, op: Operation) -> Any:
        if self.located:  # before its regions: the decoder creates the op first
            self.loc(op.loc)
        ids = self.ids
        try:
            operands = [ids[v] for v in op.operands]
        except KeyError:
            raise WireFormatError("operand refers to a value not defined before its use") \
                from None
        for r in op.results:
            self.ids[r] = len(self.ids)
        return [op.op_name, operands, [self.type(r.type) for r in op.results],
                self.attrs(op.attributes), self.attrs(op.properties),
                [self.region(r) for r in op.regions], None]

    def region(self, region: Region) -> Any:
        blocks = []
        for block in region.blocks:
            for a in block.args:
                self.ids[a] = len(self.ids)
                self.loc(a.loc)
            blocks.append([[self.type(a.type) for a in block.args],
                           [None] * len(block.args),
                           [self.op(o) for o in block.ops]])
        return blocks


_CANONICAL_HEAD = msgpack.packb([MAGIC, INLINE_VERSION, [], None], use_bin_type=True)[:-1]
"""The canonical form's header: ``[magic, 1, [], body]`` without its body (msgpack
writes a list as its header and then each element, so the form is this plus the
body's bytes). Unchanged from format 1: fingerprints carry over."""


def _encoded(op: Operation, located: bool) -> tuple[bytes, _Encoder]:
    enc = _Encoder(located)
    return msgpack.packb(enc.op(op), use_bin_type=True), enc


def _wire(body: bytes, enc: _Encoder) -> bytes:
    files = sorted(enc.files, key=enc.files.__getitem__)
    return msgpack.packb([MAGIC, WIRE_VERSION, files, enc.locs], use_bin_type=True) + body


def encode(op: Operation) -> bytes:
    """The wire bytes of ``op`` (with locations)."""
    return _wire(*_encoded(op, located=True))


def canonical_bytes(op: Operation) -> bytes:
    """The canonical encoding: no locations, values by definition order."""
    return _CANONICAL_HEAD + _encoded(op, located=False)[0]


def fingerprint(op: Operation) -> str:
    """128-bit hex fingerprint of ``op``'s canonical content."""
    return hashlib.blake2b(canonical_bytes(op), digest_size=16).hexdigest()


def encode_and_fingerprint(op: Operation) -> tuple[bytes, str]:
    """``(encode(op), fingerprint(op))`` from one walk and one ``packb``: the wire bytes
    carry the canonical body's bytes (a stage product written to the store needs both).

    >>> from accy.choir.parser import parse_module
    >>> m = parse_module('"builtin.module"() ({}) : () -> ()')
    >>> encode_and_fingerprint(m) == (encode(m), fingerprint(m))
    True
    """
    body, enc = _encoded(op, located=True)
    digest = hashlib.blake2b(_CANONICAL_HEAD, digest_size=16)
    digest.update(body)
    return _wire(body, enc), digest.hexdigest()


# ---------------------------------------------------------------------- decoding


def _fits(v: int, t: ScalarType) -> bool:
    """``v`` fits the integer type ``t``, signed or unsigned (as MLIR accepts)."""
    return -(1 << (t.bits - 1)) <= v < (1 << t.bits)


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise WireFormatError(f"malformed choir wire data: {what}")


class _Decoder:
    def __init__(self, files: list[str], locs: list[Any] | None = None) -> None:
        self.files = files
        self.values: list[Value] = []
        self.ops = 0
        self.locs = locs
        """Format 2's location table (None: format 1, locations inline)."""
        self.next_loc = 0

    def loc(self, x: Any) -> Location:
        if self.locs is not None:  # format 2: the body's slot is nil, the table has it
            _need(x is None, "inline location in a format 2 body")
            _need(self.next_loc < len(self.locs), "location table too short")
            x = self.locs[self.next_loc]
            self.next_loc += 1
        if x is None:
            return UNKNOWN
        _need(isinstance(x, list) and len(x) == 3 and all(isinstance(i, int) for i in x),
              "location")
        _need(0 <= x[0] < len(self.files), "location file index")
        return Location(self.files[x[0]], x[1], x[2])

    def scalar(self, x: Any) -> ScalarType:
        _need(isinstance(x, str) and x in SCALAR_NAMES, "element type")
        return ScalarType(x)

    def type(self, x: Any, depth: int) -> Type:
        _need(depth < MAX_DEPTH, "type nested too deeply")
        if isinstance(x, str):
            return self.scalar(x)
        _need(isinstance(x, list) and bool(x) and isinstance(x[0], int), "type")
        tag = x[0]
        if tag == 0:
            _need(len(x) == 3 and isinstance(x[1], list), "tensor type")
            dims = []
            for d in x[1]:
                _need(isinstance(d, int) and -1 <= d <= MAX_DIM, "tensor dimension")
                dims.append(None if d == -1 else d)
            return TensorType(tuple(dims), self.scalar(x[2]))
        if tag == 1:
            _need(len(x) == 3 and isinstance(x[1], list) and isinstance(x[2], list),
                  "function type")
            return FunctionType(tuple(self.type(t, depth + 1) for t in x[1]),
                                tuple(self.type(t, depth + 1) for t in x[2]))
        if tag == 2:
            return NoneType()
        if tag == 3:
            _need(len(x) == 2 and isinstance(x[1], str), "opaque type")
            return OpaqueType(x[1])
        raise WireFormatError(f"malformed choir wire data: unknown type tag {tag}")

    def attr(self, x: Any, depth: int) -> Attribute:
        _need(depth < MAX_DEPTH, "attribute nested too deeply")
        _need(isinstance(x, list) and bool(x) and isinstance(x[0], int), "attribute")
        tag, n = x[0], len(x)
        t: Type
        if tag == 0:
            _need(n == 3 and isinstance(x[1], int) and not isinstance(x[1], bool), "integer")
            t = self.scalar(x[2])
            _need(t.is_int and _fits(x[1], t), "integer out of range of its type")
            return IntegerAttr(x[1], t)
        if tag == 1:
            _need(n == 3 and isinstance(x[1], float), "float")
            t = self.scalar(x[2])
            _need(t.is_float, "float type")
            return FloatAttr(x[1], t)
        if tag == 2:
            _need(n == 2 and isinstance(x[1], str), "string")
            return StringAttr(x[1])
        if tag == 3:
            _need(n == 2 and isinstance(x[1], bool), "bool")
            return BoolAttr(x[1])
        if tag == 4:
            return UnitAttr()
        if tag == 5:
            _need(n == 2, "type attribute")
            return TypeAttr(self.type(x[1], depth + 1))
        if tag == 6:
            _need(n == 3 and isinstance(x[2], list), "dense array")
            t = self.scalar(x[1])
            _need(t.is_int and all(isinstance(v, int) and not isinstance(v, bool) and _fits(v, t)
                                   for v in x[2]), "dense array")
            return DenseArrayAttr(tuple(x[2]), t)
        if tag == 7:
            _need(n == 4 and isinstance(x[2], bool) and isinstance(x[3], bytes), "dense elements")
            t = self.type(x[1], depth + 1)
            _need(isinstance(t, TensorType) and t.is_static, "dense elements type")
            assert isinstance(t, TensorType)
            limit = dense_limit(x[2])
            _need(t.num_elements <= limit, f"dense elements too large (more than {limit})")
            count = 1 if x[2] else t.num_elements
            el = t.element
            dtype = np.dtype(np.uint8) if el.name == "i1" else numpy_dtype(el).newbyteorder("<")
            _need(len(x[3]) == count * dtype.itemsize, "dense elements size")
            arr = np.frombuffer(x[3], dtype=dtype)  # a view of the payload, not a copy
            if el.name == "i1":
                arr = arr != 0
            return DenseElementsAttr(t, arr, splat=x[2])
        if tag == 8:
            _need(n == 2 and isinstance(x[1], list), "array attribute")
            return ArrayAttr(tuple(self.attr(v, depth + 1) for v in x[1]))
        if tag == 9:
            _need(n == 2 and isinstance(x[1], list), "dictionary attribute")
            return DictAttr(tuple(self.named(e, depth + 1) for e in x[1]))
        if tag == 10:
            _need(n == 2 and isinstance(x[1], str), "symbol reference")
            return SymbolRefAttr(x[1])
        raise WireFormatError(f"malformed choir wire data: unknown attribute tag {tag}")

    def named(self, e: Any, depth: int) -> tuple[str, Attribute]:
        _need(isinstance(e, list) and len(e) == 2 and isinstance(e[0], str), "named attribute")
        return e[0], self.attr(e[1], depth)

    def attrs(self, x: Any, depth: int) -> dict[str, Attribute]:
        _need(isinstance(x, list), "attribute list")
        out = dict(self.named(e, depth) for e in x)
        _need(len(out) == len(x), "duplicate attribute name")
        return out

    def op(self, x: Any, depth: int) -> Operation:
        _need(depth < MAX_DEPTH, "operations nested too deeply")
        self.ops += 1
        _need(self.ops <= MAX_OPS, "too many operations")
        _need(isinstance(x, list) and len(x) == 7, "operation")
        name, operands, rtypes, attrs, props, regions, loc = x
        _need(isinstance(name, str) and "." in name, "operation name")
        _need(isinstance(operands, list) and isinstance(rtypes, list)
              and isinstance(regions, list), "operation fields")
        vals = []
        for i in operands:
            _need(isinstance(i, int) and 0 <= i < len(self.values), "operand reference")
            vals.append(self.values[i])
        types = [self.type(t, depth + 1) for t in rtypes]
        attributes = self.attrs(attrs, depth + 1)
        properties = self.attrs(props, depth + 1)
        location = self.loc(loc)
        op = Operation.create(name, vals, types, attributes, properties, (), location)
        self.values.extend(op.results)
        for r in regions:
            op.add_region(self.region(r, depth + 1))
        return op

    def region(self, x: Any, depth: int) -> Region:
        _need(isinstance(x, list), "region")
        region = Region()
        for b in x:
            _need(isinstance(b, list) and len(b) == 3 and isinstance(b[0], list)
                  and isinstance(b[1], list) and isinstance(b[2], list)
                  and len(b[0]) == len(b[1]), "block")
            block = Block([self.type(t, depth + 1) for t in b[0]], [self.loc(lc) for lc in b[1]])
            self.values.extend(block.args)
            region.add_block(block)
            for o in b[2]:
                block.append(self.op(o, depth + 1))
        return region


def decode(data: bytes) -> Operation:
    """Read wire bytes back into an op; anything malformed is a ``WireFormatError``."""
    import accy.dialects  # noqa: F401  (registers the declared op classes)

    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireFormatError("choir wire data must be bytes")
    if len(data) > MAX_BYTES:
        raise WireFormatError("choir wire data too large")
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    try:
        head = msgpack.Unpacker(io.BytesIO(view), raw=False, use_list=True,
                                strict_map_key=True, max_buffer_size=MAX_BYTES)
        obj = head.unpack()
        end = head.tell()
    except Exception as e:  # msgpack raises several types for bad input
        raise WireFormatError(f"malformed choir wire data: {type(e).__name__}: {e}") from None
    _need(isinstance(obj, list) and len(obj) == 4, "header")
    magic, version, files, locs = obj
    _need(magic == MAGIC, "bad magic (not choir wire data)")
    if version not in (INLINE_VERSION, WIRE_VERSION):
        raise WireFormatError(f"unsupported choir wire version {version!r} "
                              f"(this accy reads versions {INLINE_VERSION} and "
                              f"{WIRE_VERSION})")
    _need(isinstance(files, list) and all(isinstance(f, str) for f in files), "file table")
    if version == INLINE_VERSION:
        _need(end == len(view), "trailing data after the module")
        body, locs = locs, None
    else:
        _need(isinstance(locs, list), "location table")
        _need(end < len(view), "no module after the header")
        try:  # from a view of the input: dense payloads are not copied twice
            body = msgpack.unpackb(memoryview(view)[end:], raw=False, use_list=True,
                                   strict_map_key=True)
        except Exception as e:
            raise WireFormatError(f"malformed choir wire data: {type(e).__name__}: {e}") \
                from None
    try:
        decoder = _Decoder(files, locs)
        op = decoder.op(body, 0)
    except WireFormatError:
        raise
    except (RecursionError, MemoryError, ValueError, TypeError, OverflowError) as e:
        raise WireFormatError(f"malformed choir wire data: {type(e).__name__}") from None
    _need(locs is None or decoder.next_loc == len(locs), "location table too long")
    return op
