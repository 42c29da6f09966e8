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
    """An element type: ``f32 f16 bf16 f64 i1 i8 i16 i32 i64 index``."""

    name: str

    @property
    def is_float(self) -> bool:
        return self.name in FLOAT_NAMES

    @property
    def is_int(self) -> bool:
        return self.name in INT_NAMES

    @property
    def bits(self) -> int:
        return _BITS[self.name]

    @property
    def nbytes(self) -> int:
        return max(1, self.bits // 8)

    def __str__(self) -> str:
        return self.name


FLOAT_NAMES = frozenset({"f16", "bf16", "f32", "f64"})
INT_NAMES = frozenset({"i1", "i8", "i16", "i32", "i64", "index"})
_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64, "i1": 1, "i8": 8, "i16": 16, "i32": 32,
         "i64": 64, "index": 64}
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


@dataclass(frozen=True, slots=True, eq=False)
class DenseElementsAttr(Attribute):
    """``dense<…> : tensor<…>``; values are flat, row-major (one value when splat).

    All-equal values are kept as a splat; equality is bit for bit (see :class:`FloatAttr`).
    """

    type: TensorType
    values: tuple[Any, ...]
    splat: bool = False

    def __post_init__(self) -> None:
        el = self.type.element
        if el.is_float:
            vals = tuple(round_to_type(float(v), el) for v in self.values)
        elif el.name == "i1":
            vals = tuple(bool(v) for v in self.values)
        else:
            vals = tuple(int(v) for v in self.values)
        if (self.type.is_static and not self.splat and len(vals) > 1
                and len(vals) == self.type.num_elements and len(set(map(_bits_key, vals))) == 1):
            vals = vals[:1]  # all equal (bit for bit): the splat form, as MLIR keeps it
        object.__setattr__(self, "values", vals)
        if self.type.is_static and not self.splat and len(vals) == 1 and self.type.num_elements != 1:
            object.__setattr__(self, "splat", True)
        if self.splat and self.type.is_static and self.type.num_elements == 1:
            object.__setattr__(self, "splat", False)

    def __eq__(self, other: object) -> bool:
        if type(other) is not DenseElementsAttr:
            return NotImplemented
        return (self.type == other.type and self.splat == other.splat
                and tuple(map(_bits_key, self.values)) == tuple(map(_bits_key, other.values)))

    def __hash__(self) -> int:
        return hash((self.type, self.splat, tuple(map(_bits_key, self.values))))

    def to_numpy(self) -> np.ndarray:
        """The constant as a NumPy array of its type's shape and dtype."""
        dtype = numpy_dtype(self.type.element)
        shape = tuple(int(d) for d in self.type.shape)  # type: ignore[arg-type]
        if self.splat:
            return np.full(shape, self.values[0], dtype=dtype)
        return np.array(self.values, dtype=dtype).reshape(shape)

    @staticmethod
    def from_numpy(array: np.ndarray, type: TensorType) -> DenseElementsAttr:
        flat = np.asarray(array).reshape(-1)
        return DenseElementsAttr(type, tuple(flat.tolist()))  # all-equal values become a splat


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
          "index": np.int64}


def numpy_dtype(t: ScalarType) -> np.dtype:
    """The NumPy dtype that holds values of ``t`` (bf16 is held in float32)."""
    return np.dtype(_NUMPY[t.name])


def scalar_type_of(dtype: np.dtype) -> ScalarType:
    """The choir element type of a NumPy dtype."""
    for name, np_t in (("f32", np.float32), ("f16", np.float16), ("f64", np.float64),
                       ("i1", np.bool_), ("i32", np.int32), ("i64", np.int64),
                       ("i8", np.int8), ("i16", np.int16)):
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


_NAN = float("nan")
_NEG_NAN = -_NAN


def _bits_key(v: Any) -> Any:
    """Bit-exact identity of a value (``0.0`` and ``-0.0`` differ; NaNs of one sign agree)."""
    return struct.pack("<d", v) if isinstance(v, float) else v


def round_to_type(x: float, t: ScalarType) -> float:
    """Round ``x`` to the precision of the float type ``t``.

    Every NaN comes back as one of two shared objects (by sign), so attributes
    holding a NaN keep value equality and a stable hash (a NaN is not equal to
    itself, but Python compares containers by identity first).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        if t.name == "f32":
            r = float(np.float32(x))
        elif t.name == "f16":
            r = float(np.float16(x))
        elif t.name == "bf16":
            r = round_bf16(x)
        else:
            r = float(x)
    if r != r:
        return _NAN if math.copysign(1.0, r) > 0 else _NEG_NAN
    return r


def i64_list(attr: Attribute | None) -> tuple[int, ...]:
    """The integers of an ``array<i64: …>`` (or an array of integer attrs)."""
    if isinstance(attr, DenseArrayAttr):
        return attr.values
    if isinstance(attr, ArrayAttr):
        return tuple(a.value for a in attr.values if isinstance(a, IntegerAttr))
    return ()
