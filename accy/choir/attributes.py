"""Types and attributes of choir: frozen dataclasses with value equality.

Types follow MLIR's builtin spellings (``tensor<?x4096xf32>``, ``f32``,
``(tensor<4xf32>) -> tensor<4xf32>``); attributes are the subset of MLIR's
builtin attributes accy needs (integers, floats, strings, booleans, unit,
types, ``array<i64: …>``, ``dense<…>``, arrays, dictionaries, symbol refs).

Example
-------
>>> t = TensorType((None, 4096), F32)
>>> t.rank, t.is_static, t.with_shape((8, 4096)).is_static
(2, False, True)
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# --------------------------------------------------------------------------- types


class Type:
    """Base class of every choir type (frozen, hashable)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class ScalarType(Type):
    """An element type: ``f32 f16 bf16 f64 i1 i8 i16 i32 i64 ui8 ui16 ui32 ui64 index``."""

    name: str

    @property
    def is_float(self) -> bool:
        return self.name in FLOAT_NAMES

    @property
    def is_int(self) -> bool:
        return self.name in INT_NAMES

    @property
    def is_unsigned(self) -> bool:
        return self.name in UNSIGNED_NAMES

    @property
    def bits(self) -> int:
        return _BITS[self.name]

    @property
    def nbytes(self) -> int:
        return max(1, self.bits // 8)

    def __str__(self) -> str:
        return self.name


FLOAT_NAMES = frozenset({"f16", "bf16", "f32", "f64"})
UNSIGNED_NAMES = frozenset({"ui8", "ui16", "ui32", "ui64"})
INT_NAMES = frozenset({"i1", "i8", "i16", "i32", "i64", "index"}) | UNSIGNED_NAMES
_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64, "i1": 1, "i8": 8, "i16": 16, "i32": 32,
         "i64": 64, "index": 64, "ui8": 8, "ui16": 16, "ui32": 32, "ui64": 64}
SCALAR_NAMES = FLOAT_NAMES | INT_NAMES

F32 = ScalarType("f32")
F16 = ScalarType("f16")
BF16 = ScalarType("bf16")
F64 = ScalarType("f64")
I1 = ScalarType("i1")
I32 = ScalarType("i32")
I64 = ScalarType("i64")
INDEX = ScalarType("index")

Dim = int | None
"""A tensor dimension: an int, or ``None`` for ``?``."""


@dataclass(frozen=True, slots=True)
class TensorType(Type):
    """``tensor<D0xD1x…xT>``; a ``None`` dimension prints as ``?``."""

    shape: tuple[Dim, ...]
    element: ScalarType

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(d is not None for d in self.shape)

    @property
    def num_elements(self) -> int:
        assert self.is_static, "num_elements of a dynamic tensor"
        return math.prod(self.shape)  # type: ignore[arg-type]

    @property
    def nbytes(self) -> int:
        return self.num_elements * self.element.nbytes

    def with_shape(self, shape: tuple[Dim, ...]) -> TensorType:
        return TensorType(tuple(shape), self.element)

    def with_element(self, element: ScalarType) -> TensorType:
        return TensorType(self.shape, element)

    def __str__(self) -> str:
        dims = "".join(("?" if d is None else str(d)) + "x" for d in self.shape)
        return f"tensor<{dims}{self.element}>"


@dataclass(frozen=True, slots=True)
class FunctionType(Type):
    """``(inputs) -> results``."""

    inputs: tuple[Type, ...]
    results: tuple[Type, ...]

    def __str__(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        if len(self.results) == 1 and not isinstance(self.results[0], FunctionType):
            return f"({ins}) -> {self.results[0]}"
        return f"({ins}) -> ({', '.join(map(str, self.results))})"


@dataclass(frozen=True, slots=True)
class NoneType(Type):
    """MLIR's ``none``."""

    def __str__(self) -> str:
        return "none"


@dataclass(frozen=True, slots=True)
class OpaqueType(Type):
    """A dialect type kept as text, e.g. ``!memory.arena``."""

    text: str
    """Everything after the ``!``."""

    def __str__(self) -> str:
        return f"!{self.text}"


# ---------------------------------------------------------------------- attributes


class Attribute:
    """Base class of every choir attribute (frozen, hashable)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class IntegerAttr(Attribute):
    """``3 : i64``."""

    value: int
    type: ScalarType = I64


@dataclass(frozen=True, slots=True, eq=False)
class FloatAttr(Attribute):
    """``1.0e-05 : f32``; the value is rounded to its type on construction.

    Equality is bit for bit, as in MLIR: ``0.0`` and ``-0.0`` differ, a NaN equals itself.
    """

    value: float
    type: ScalarType = F32

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", round_to_type(float(self.value), self.type))

    def __eq__(self, other: object) -> bool:
        if type(other) is not FloatAttr:
            return NotImplemented
        return self.type == other.type and _bits_key(self.value) == _bits_key(other.value)

    def __hash__(self) -> int:
        return hash((self.type, _bits_key(self.value)))


@dataclass(frozen=True, slots=True)
class StringAttr(Attribute):
    """``"text"``."""

    value: str


@dataclass(frozen=True, slots=True)
class BoolAttr(Attribute):
    """``true`` / ``false``."""

    value: bool


@dataclass(frozen=True, slots=True)
class UnitAttr(Attribute):
    """A name with no value (``{fused}``)."""


@dataclass(frozen=True, slots=True)
class TypeAttr(Attribute):
    """A type used as an attribute (``function_type = (…) -> …``)."""

    type: Type


@dataclass(frozen=True, slots=True)
class DenseArrayAttr(Attribute):
    """``array<i64: 1, 0>``."""

    values: tuple[int, ...]
    element: ScalarType = I64


MAX_DENSE_ELEMENTS = 1 << 28
"""Most elements a non-splat ``dense<…>`` may hold (1 GiB of f32); the parser and
the wire decoder check it before allocating."""

MAX_SPLAT_ELEMENTS = 1 << 36
"""Most elements the shape of a splat ``dense<…>`` may have (256 GiB of f32, past
any one device). A splat holds one value and is never materialised by parse,
print, verify, wire or fingerprint; the limit only keeps absurd shapes out."""


def dense_limit(splat: bool) -> int:
    """The element limit of a ``dense<…>`` constant (splat or not)."""
    return MAX_SPLAT_ELEMENTS if splat else MAX_DENSE_ELEMENTS


@dataclass(frozen=True, slots=True, eq=False, init=False)
class DenseElementsAttr(Attribute):
    """``dense<…> : tensor<…>``; values are flat, row-major (one value when splat).

    The values live in ``data``, a read-only flat NumPy array of the element's
    storage dtype (:func:`numpy_dtype`; bf16 is held in float32, rounded), so
    every bit of a NaN payload is kept. All-equal values are kept as a splat;
    equality is bit for bit (see :class:`FloatAttr`).
    """

    type: TensorType
    data: np.ndarray
    """Flat, read-only values in the storage dtype; one value when ``splat``."""
    splat: bool
    _hash: int | None

    def __init__(self, type: TensorType, values: Any, splat: bool = False) -> None:
        data = storage_array(values, type.element)
        n = type.num_elements if type.is_static else None
        if n is not None and not splat and data.size > 1 and data.size == n:
            bits = _bit_view(data)
            if bool(np.all(bits == bits[0])):
                data = data[:1]  # all equal (bit for bit): the splat form, as MLIR keeps it
        if n is not None and not splat and data.size == 1 and n != 1:
            splat = True
        if splat and n == 1:
            splat = False
        if splat:
            data = data[:1]
        data = np.ascontiguousarray(data)
        data.flags.writeable = False
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "splat", bool(splat))
        object.__setattr__(self, "_hash", None)

    @property
    def values(self) -> tuple[Any, ...]:
        """The values as Python scalars (one when splat); prefer ``data`` for big constants."""
        return tuple(self.data.tolist())

    def __eq__(self, other: object) -> bool:
        if type(other) is not DenseElementsAttr:
            return NotImplemented
        return (self.type == other.type and self.splat == other.splat
                and self.data.dtype == other.data.dtype and self.data.size == other.data.size
                and bool(np.array_equal(_bit_view(self.data), _bit_view(other.data))))

    def __hash__(self) -> int:
        if self._hash is None:  # computed once, without copying the values
            digest = hashlib.blake2b(_bit_view(self.data).data, digest_size=16).digest()
            object.__setattr__(self, "_hash", hash((self.type, self.splat, digest)))
        return self._hash  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"DenseElementsAttr({self.type}, {self.data!r}, splat={self.splat})"

    def to_numpy(self) -> np.ndarray:
        """The constant as a (new, writable) NumPy array of its type's shape and dtype."""
        shape = tuple(int(d) for d in self.type.shape)  # type: ignore[arg-type]
        if self.splat:
            return np.full(shape, self.data[0], dtype=self.data.dtype)
        return self.data.reshape(shape).copy()

    @staticmethod
    def from_numpy(array: np.ndarray, type: TensorType) -> DenseElementsAttr:
        flat = np.asarray(array).reshape(-1)
        return DenseElementsAttr(type, flat)  # all-equal values become a splat


def _bit_view(data: np.ndarray) -> np.ndarray:
    """``data`` as unsigned integers of its width (bit-exact comparison, NaNs included)."""
    if data.dtype == np.bool_:
        return data.view(np.uint8)
    return data.view(np.dtype(f"u{data.dtype.itemsize}"))


_NAN_LAYOUT = {"f16": (np.uint16, 10, 0), "bf16": (np.uint32, 7, 16), "f32": (np.uint32, 23, 0)}
"""Storage uint, mantissa bits and left shift of a NaN's bits in the storage word."""


def storage_array(values: Any, el: ScalarType) -> np.ndarray:
    """Flat values of element type ``el`` in their storage dtype, rounded to ``el``.

    NaNs keep their payload bit for bit (the top mantissa bits of a wider NaN).
    """
    dtype = numpy_dtype(el)
    if isinstance(values, np.ndarray):
        src = values.reshape(-1)
    elif el.is_float:
        src = np.array([float(v) for v in values], dtype=np.float64)
    elif el.name == "i1":
        return np.array([bool(v) for v in values], dtype=np.bool_)
    else:
        b = el.bits
        half = 0 if el.is_unsigned else 1 << (b - 1)
        return np.array([(int(v) + half) % (1 << b) - half for v in values], dtype=dtype)
    if not el.is_float:
        return src.astype(dtype)
    if src.dtype == dtype and el.name != "bf16":
        return src
    with np.errstate(over="ignore", invalid="ignore"):
        if el.name == "bf16":
            f = src.astype(np.float32)
            bits = f.view(np.uint32)
            rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
                       ) & np.uint32(0xFFFF0000)
            out = np.where(np.isfinite(f), rounded, bits & np.uint32(0xFFFF0000))
            out = out.view(np.float32)
        else:
            out = src.astype(dtype)
    if el.name in _NAN_LAYOUT and src.dtype.kind == "f":
        nan = np.isnan(src)
        if nan.any():  # set NaN bits exactly: hardware casts may quiet or drop the payload
            out = _with_nan_bits(out, src, nan, el)
    return out


def _with_nan_bits(out: np.ndarray, src: np.ndarray, nan: np.ndarray,
                   el: ScalarType) -> np.ndarray:
    """``out`` with its NaNs set, by integer arithmetic, to the payloads of ``src``'s NaNs."""
    u64 = np.uint64
    sbits = _bit_view(src)[nan].astype(u64)
    sw = src.dtype.itemsize * 8
    sm = {16: 10, 32: 23, 64: 52}[sw]
    sign = sbits >> u64(sw - 1)
    mant52 = (sbits & u64((1 << sm) - 1)) << u64(52 - sm)
    m = _MANT[el.name]
    mant = mant52 >> u64(52 - m)
    mant = np.where(mant == 0, u64(1 << (m - 1)), mant)
    word = (sign << u64(_WIDTH[el.name] - 1)) | u64(_EXP_ONES[el.name]) | mant
    word = word << u64(_NAN_LAYOUT[el.name][2])
    res = _bit_view(out).copy()
    res[nan] = word.astype(res.dtype)
    return res.view(out.dtype)


@dataclass(frozen=True, slots=True)
class ArrayAttr(Attribute):
    """``[a, b, …]``."""

    values: tuple[Attribute, ...]


@dataclass(frozen=True, slots=True)
class DictAttr(Attribute):
    """``{a = …, b = …}``; entries are kept sorted by name."""

    entries: tuple[tuple[str, Attribute], ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", tuple(sorted(self.entries, key=lambda e: e[0])))

    def get(self, name: str, default: Attribute | None = None) -> Attribute | None:
        for k, v in self.entries:
            if k == name:
                return v
        return default

    def as_dict(self) -> dict[str, Attribute]:
        return dict(self.entries)


@dataclass(frozen=True, slots=True)
class SymbolRefAttr(Attribute):
    """``@name``."""

    name: str


# ------------------------------------------------------------------------- helpers

_NUMPY = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "bf16": np.float32,
          "i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
          "index": np.int64, "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32,
          "ui64": np.uint64}


def numpy_dtype(t: ScalarType) -> np.dtype:
    """The NumPy dtype that holds values of ``t`` (bf16 is held in float32)."""
    return np.dtype(_NUMPY[t.name])


def scalar_type_of(dtype: np.dtype) -> ScalarType:
    """The choir element type of a NumPy dtype."""
    for name, np_t in (("f32", np.float32), ("f16", np.float16), ("f64", np.float64),
                       ("i1", np.bool_), ("i32", np.int32), ("i64", np.int64),
                       ("i8", np.int8), ("i16", np.int16), ("ui8", np.uint8),
                       ("ui16", np.uint16), ("ui32", np.uint32), ("ui64", np.uint64)):
        if np.dtype(dtype) == np.dtype(np_t):
            return ScalarType(name)
    raise ValueError(f"no choir element type for dtype {dtype}")


def round_bf16(x: float) -> float:
    """Round a float to the nearest bfloat16 (ties to even), returned as a float."""
    if not math.isfinite(x):
        return x
    (bits,) = struct.unpack("<I", struct.pack("<f", np.float32(x)))
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _bits_key(v: Any) -> Any:
    """Bit-exact identity of a value (``0.0`` and ``-0.0`` differ, NaN payloads too)."""
    return struct.pack("<d", v) if isinstance(v, float) else v


_MANT = {"f16": 10, "bf16": 7, "f32": 23, "f64": 52}
_EXP_ONES = {"f16": 0x7C00, "bf16": 0x7F80, "f32": 0x7F800000, "f64": 0x7FF0000000000000}
_WIDTH = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}


def float_bits(x: float, t: ScalarType) -> int:
    """The IEEE bit pattern of ``x`` (already a ``t`` value) in float type ``t``.

    A NaN is held in a Python float with its ``t`` payload in the top mantissa
    bits, so its bits survive any number of round trips.
    """
    (b64,) = struct.unpack("<Q", struct.pack("<d", x))
    if x != x:
        m = _MANT[t.name]
        mant = (b64 & ((1 << 52) - 1)) >> (52 - m)
        if not mant:
            mant = 1 << (m - 1)
        return ((b64 >> 63) << (_WIDTH[t.name] - 1)) | _EXP_ONES[t.name] | mant
    if t.name == "f64":
        return b64
    if t.name == "f32":
        return int(np.array(x, dtype=np.float32).view(np.uint32))
    if t.name == "f16":
        return int(np.array(x, dtype=np.float16).view(np.uint16))
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16  # bf16 (x is a bf16 value)


def float_from_bits(bits: int, t: ScalarType) -> float:
    """The value of the ``t`` bit pattern ``bits`` (NaN payloads kept, see :func:`float_bits`)."""
    w, m = _WIDTH[t.name], _MANT[t.name]
    if bits & _EXP_ONES[t.name] == _EXP_ONES[t.name] and bits & ((1 << m) - 1):
        sign = bits >> (w - 1)
        b64 = (sign << 63) | _EXP_ONES["f64"] | ((bits & ((1 << m) - 1)) << (52 - m))
        return struct.unpack("<d", struct.pack("<Q", b64))[0]
    if t.name == "f64":
        return struct.unpack("<d", struct.pack("<Q", bits))[0]
    if t.name == "f32":
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    if t.name == "f16":
        return float(np.array(bits, dtype=np.uint16).view(np.float16))
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def round_to_type(x: float, t: ScalarType) -> float:
    """Round ``x`` to the precision of the float type ``t``.

    A NaN keeps the top bits of its payload that ``t`` can hold (bit-level,
    never through a hardware cast that could quiet or drop it).
    """
    if x != x:
        return x if t.name == "f64" else float_from_bits(float_bits(x, t), t)
    with np.errstate(over="ignore", invalid="ignore"):
        if t.name == "f32":
            return float(np.float32(x))
        if t.name == "f16":
            return float(np.float16(x))
        if t.name == "bf16":
            return round_bf16(x)
        return float(x)


def i64_list(attr: Attribute | None) -> tuple[int, ...]:
    """The integers of an ``array<i64: …>`` (or an array of integer attrs)."""
    if isinstance(attr, DenseArrayAttr):
        return attr.values
    if isinstance(attr, ArrayAttr):
        return tuple(a.value for a in attr.values if isinstance(a, IntegerAttr))
    return ()
