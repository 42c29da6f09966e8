"""Shape arithmetic shared by the dialects: NumPy broadcasting with ``?`` dims.

Example
-------
>>> broadcast_shapes((None, 4096), (4096,))
(None, 4096)
>>> broadcast_shapes((8, 1), (1, 3))
(8, 3)
"""

from __future__ import annotations

from collections.abc import Sequence

from accy.choir.attributes import Dim, TensorType, Type


class ShapeError(ValueError):
    """Shapes that do not combine; turned into a ``VerifyError`` by the op."""


def broadcast_dim(a: Dim, b: Dim) -> Dim:
    if a == 1:
        return b
    if b == 1:
        return a
    if a is None:
        return b
    if b is None:
        return a
    if a != b:
        raise ShapeError(f"{a} vs {b}")
    return a


def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """NumPy broadcasting of several shapes; ``None`` is an unknown dim."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = [1] * rank
    for s in shapes:
        padded = [1] * (rank - len(s)) + list(s)
        out = [broadcast_dim(a, b) for a, b in zip(out, padded)]
    return tuple(out)


def can_broadcast_to(src: Sequence[Dim], dst: Sequence[Dim]) -> bool:
    """``src`` broadcasts to exactly ``dst`` (NumPy ``broadcast_to`` rules)."""
    if len(src) > len(dst):
        return False
    for s, d in zip(reversed(src), reversed(dst)):
        if s == 1 or s is None or d is None:
            continue
        if s != d:
            return False
    return True


def merge_types(declared: Type, inferred: Type) -> Type | None:
    """The most refined type both allow, or None when they disagree."""
    if declared == inferred:
        return declared
    if not (isinstance(declared, TensorType) and isinstance(inferred, TensorType)):
        return None
    if declared.element != inferred.element or declared.rank != inferred.rank:
        return None
    dims: list[Dim] = []
    for d, i in zip(declared.shape, inferred.shape):
        if d is not None and i is not None and d != i:
            return None
        dims.append(i if i is not None else d)
    return TensorType(tuple(dims), declared.element)


def normalize_axis(axis: int, rank: int) -> int | None:
    """``axis`` in ``[0, rank)``, counting negatives from the end; None if out of range."""
    a = axis + rank if axis < 0 else axis
    return a if 0 <= a < rank else None
