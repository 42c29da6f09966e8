"""The NumPy reference interpreter: the oracle every compiled program is checked against.

:func:`run_reference` runs a function of a choir module on NumPy arrays, op by
op, through the dispatch table :data:`IMPLS`. Every op is computed in float64
(int64 for integer tensors) from its inputs and rounded once to its declared
element type: f32 and f16 through NumPy, bf16 to nearest-even through float32
(held in a float32 array), i1 as bool. Other dialects (``prim.*``,
``dispatch.*``) add their ops from their own modules with
:func:`register_impl`; region-holding ops can run their bodies with
:func:`run_block`.

Conventions beyond SEMANTIC.md: integer ``div`` truncates toward zero (and
gives 0 on division by zero); integer arithmetic wraps; float→int ``cast``
truncates and saturates (NaN → 0), int/float→i1 is ``!= 0``; ``bf16``
arguments are given as float32 arrays and rounded to bf16 on entry. Float
``max``/``min``/``relu`` and ``reduce_max``/``reduce_min`` propagate NaN (as
``np.maximum``/``np.max`` do). A reduction over an empty axis gives its
identity: ``reduce_sum`` 0, ``reduce_max`` -inf for floats, the type's
minimum for integers and false for i1, ``reduce_min`` +inf / the type's
maximum / true (NumPy raises for an empty max/min; accy defines it, so that
e.g. a softmax over an empty axis is an empty result, not an error), and
``reduce_mean`` NaN.

Example
-------
>>> import numpy as np
>>> from accy.choir.parser import parse_module
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<?xf32>) -> tensor<?xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<?xf32>):
...     %0 = "semantic.relu"(%x) : (tensor<?xf32>) -> tensor<?xf32>
...     "func.return"(%0) : (tensor<?xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> run_reference(m, [np.array([-1.0, 2.0], dtype=np.float32)])
[array([0., 2.], dtype=float32)]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from accy.choir.attributes import (
    BoolAttr,
    DenseElementsAttr,
    FloatAttr,
    IntegerAttr,
    ScalarType,
    StringAttr,
    SymbolRefAttr,
    TensorType,
    UnitAttr,
    i64_list,
    numpy_dtype,
)
from accy.choir.builtin import FuncOp, ModuleOp
from accy.choir.ir import Block, Operation, Value
from accy.errors import VerifyError
from accy.numerics import erf, erfc, round_bf16_array

Impl = Callable[[Operation, list[np.ndarray]], list[np.ndarray]]
"""An op implementation: (the op, its operand arrays) → its result arrays."""

IMPLS: dict[str, Impl] = {}
"""Reference implementations by op name."""


def register_impl(*names: str) -> Callable[[Impl], Impl]:
    """Register ``fn`` as the reference implementation of the ops ``names``.

    Example
    -------
    >>> @register_impl("test.twice")
    ... def _twice(op, args):
    ...     return [args[0] * 2]
    >>> "test.twice" in IMPLS
    True
    >>> del IMPLS["test.twice"]
    """

    def decorate(fn: Impl) -> Impl:
        for name in names:
            IMPLS[name] = fn
        return fn

    return decorate


# ---------------------------------------------------------------------- public API


def run_reference(module: ModuleOp, inputs: Sequence[np.ndarray], *,
                  function: str | None = None) -> list[np.ndarray]:
    """Run the entry function (or ``function``) of ``module`` on ``inputs``.

    ``?`` dims of the arguments bind to the inputs' shapes; each input must
    have the argument's rank, static dims and dtype (f32→float32, f16→float16,
    bf16→float32, i1→bool, i32/i64→int32/int64), else ``VerifyError``.
    Returns the values of ``func.return`` in order.

    Example
    -------
    >>> import numpy as np
    >>> from accy.choir.parser import parse_file
    >>> m = parse_file("graphs/softmax.mlir")  # doctest: +SKIP
    >>> run_reference(m, [np.zeros((2, 4096), np.float32)])[0].sum()  # doctest: +SKIP
    2.0
    """
    func = _find_function(module, function)
    args = bind_inputs(func, inputs)
    with np.errstate(all="ignore"):
        results = run_block(func.body, args)
    ftype = func.function_type
    for i, (arr, t) in enumerate(zip(results, ftype.results)):
        _check_array(arr, t, f"result {i} of function '{func.sym_name}'", func)
    return [np.array(r, copy=True) for r in results]


def bind_inputs(func: FuncOp, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Check ``inputs`` against the argument types of ``func``; bf16 inputs are rounded."""
    types = func.function_type.inputs
    if len(inputs) != len(types):
        raise VerifyError(f"function '{func.sym_name}' takes {len(types)} arguments but "
                          f"{len(inputs)} inputs were given")
    out = []
    for i, (x, t) in enumerate(zip(inputs, types)):
        arr = np.asarray(x)
        if not isinstance(t, TensorType):
            raise VerifyError(f"argument {i} has type {t}, which the reference cannot bind")
        if arr.ndim != t.rank or any(d is not None and d != n for d, n in zip(t.shape, arr.shape)):
            raise VerifyError(f"input {i} has shape {tuple(arr.shape)} but argument {i} is {t}")
        if arr.dtype != numpy_dtype(t.element):
            raise VerifyError(f"input {i} has dtype {arr.dtype} but argument {i} is {t} "
                              f"(needs {numpy_dtype(t.element)})")
        out.append(round_bf16_array(arr) if t.element.name == "bf16" else arr)
    return out


def run_block(block: Block, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run the ops of ``block`` with its arguments bound to ``args``.

    Returns the operands of the block's terminator (``func.return``, or a last op
    without results and without an implementation, such as a ``*.yield``).
    """
    env: dict[Value, np.ndarray] = dict(zip(block.args, args))
    for op in block.ops:
        operands = [env[v] for v in op.operands]
        impl = IMPLS.get(op.op_name)
        if impl is None:
            if "terminator" in op.traits or (op is block.ops[-1] and not op.results):
                return operands
            hint = " (the prim and dispatch ops of later stages: import accy.reference_lowered)" \
                if op.op_name.split(".")[0] in ("prim", "dispatch") else ""
            raise VerifyError(f"no reference implementation for '{op.op_name}'{hint}", op.loc)
        try:
            results = impl(op, operands)
        except ValueError as e:  # NumPy shape errors: operands that do not broadcast, …
            raise VerifyError(f"'{op.op_name}': {e}", op.loc) from None
        if len(results) != len(op.results):
            raise VerifyError(f"'{op.op_name}' produced {len(results)} results but declares "
                              f"{len(op.results)}", op.loc)
        for i, (r, arr) in enumerate(zip(op.results, results)):
            _check_array(arr, r.type, f"result {i} of '{op.op_name}'", op)
            env[r] = arr
    return []


# ------------------------------------------------------------------------- helpers


def _find_function(module: ModuleOp, name: str | None) -> FuncOp:
    if name is None:
        return module.entry()
    for f in module.functions:
        if f.sym_name == name:
            return f
    raise VerifyError(f"module has no function named '{name}'", module.loc)


def _check_array(arr: np.ndarray, t: object, what: str, op: Operation) -> None:
    if not isinstance(t, TensorType):
        return
    if not isinstance(arr, np.ndarray) or arr.dtype != numpy_dtype(t.element):
        got = arr.dtype if isinstance(arr, np.ndarray) else type(arr).__name__
        raise VerifyError(f"{what} is {got} but its type is {t}", op.loc)
    if arr.ndim != t.rank or any(d is not None and d != n for d, n in zip(t.shape, arr.shape)):
        raise VerifyError(f"{what} has shape {tuple(arr.shape)} but its declared type is {t}",
                          op.loc)


def _element(op: Operation, index: int = 0) -> ScalarType:
    t = op.results[index].type
    if not isinstance(t, TensorType):
        raise VerifyError(f"'{op.op_name}' result {index} must be a tensor, got {t}", op.loc)
    return t.element


def _operand_element(op: Operation, index: int) -> ScalarType:
    t = op.operands[index].type
    if not isinstance(t, TensorType):
        raise VerifyError(f"'{op.op_name}' operand {index} must be a tensor, got {t}", op.loc)
    return t.element


def _lift(a: np.ndarray) -> np.ndarray:
    """float64 for float tensors, uint64 for ui64, int64 for other integer and i1 tensors."""
    if a.dtype == np.uint64:
        return a.copy()
    return a.astype(np.float64 if a.dtype.kind == "f" else np.int64)


def store(value: np.ndarray, element: ScalarType) -> np.ndarray:
    """Round a float64/int64/bool result to the storage of ``element`` (ints wrap)."""
    value = np.asarray(value)
    if element.is_float:
        if element.name == "bf16":
            return round_bf16_array(value)
        with np.errstate(over="ignore", invalid="ignore"):
            return value.astype(numpy_dtype(element))
    if element.name == "i1":
        return value.copy() if value.dtype == np.bool_ else (value.astype(np.int64) & 1) != 0
    assert value.dtype.kind != "f", "float value stored to an integer type without a cast"
    return value.astype(numpy_dtype(element))


def _attr_int(op: Operation, key: str) -> int:
    a = op.attr(key)
    if not isinstance(a, IntegerAttr):
        raise VerifyError(f"'{op.op_name}' needs an integer '{key}' attribute", op.loc)
    return a.value


def _attr_bool(op: Operation, key: str, default: bool) -> bool:
    a = op.attr(key)
    if a is None:
        return default
    if isinstance(a, BoolAttr):
        return a.value
    if isinstance(a, UnitAttr):
        return True
    if isinstance(a, IntegerAttr):
        return bool(a.value)
    raise VerifyError(f"'{op.op_name}' attribute '{key}' must be true or false", op.loc)


def _axis(op: Operation, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise VerifyError(f"'{op.op_name}' axis {axis} is out of range for rank {rank}", op.loc)
    return axis % rank


def _float_only(op: Operation, index: int = 0) -> None:
    el = _operand_element(op, index)
    if not el.is_float:
        raise VerifyError(f"'{op.op_name}' needs a float tensor, got {op.operands[index].type}",
                          op.loc)


def _same_elements(op: Operation, indices: Sequence[int]) -> None:
    els = {_operand_element(op, i) for i in indices}
    if len(els) > 1:
        names = ", ".join(str(op.operands[i].type) for i in indices)
        raise VerifyError(f"'{op.op_name}' operands must have one element type, got {names}",
                          op.loc)


# --------------------------------------------------------------------- elementwise


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
        with np.errstate(over="ignore"):  # 0.5·x·(1 + tanh(inner)), without its cancellation
            return x / (1.0 + np.exp(-2.0 * inner))
    return 0.5 * x * erfc(-x / math.sqrt(2.0))


_FLOAT_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "semantic.exp": np.exp,
    "semantic.log": np.log,
    "semantic.sqrt": np.sqrt,
    "semantic.rsqrt": lambda x: 1.0 / np.sqrt(x),
    "semantic.tanh": np.tanh,
    "semantic.sigmoid": _sigmoid,
    "semantic.erf": erf,
    "semantic.erfc": erfc,
    "semantic.sin": np.sin,
    "semantic.cos": np.cos,
    "semantic.reciprocal": lambda x: 1.0 / x,
}
_ANY_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "semantic.neg": np.negative,
    "semantic.abs": np.abs,
    "semantic.relu": lambda x: np.maximum(x, 0),
    "semantic.floor": lambda x: np.floor(x) if x.dtype.kind == "f" else x,
}


@register_impl(*_FLOAT_UNARY, *_ANY_UNARY)
def _unary(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    fn = _ANY_UNARY.get(op.op_name)
    if fn is None:
        _float_only(op)
        fn = _FLOAT_UNARY[op.op_name]
    return [store(fn(_lift(args[0])), _element(op))]


@register_impl("semantic.gelu")
def _gelu_impl(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    _float_only(op)
    a = op.attr("approximate")
    approximate = "none" if a is None else a.value if isinstance(a, StringAttr) else None
    if approximate not in ("none", "tanh"):
        raise VerifyError("'semantic.gelu' approximate must be \"none\" or \"tanh\"", op.loc)
    return [store(_gelu(_lift(args[0]), approximate), _element(op))]


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    safe = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(safe)
    q = np.where((a < 0) != (safe < 0), -q, q)
    return np.where(b == 0, 0, q)


def _int_pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    if a.dtype.kind == "u":
        return np.power(a, b)
    out = np.power(a, np.maximum(b, 0))
    negative = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0))
    return np.where(b < 0, negative, out)


_BINARY: dict[str, tuple[Callable[..., np.ndarray], Callable[..., np.ndarray]]] = {
    # name: (float64 form, int64 form)
    "semantic.add": (np.add, np.add),
    "semantic.sub": (np.subtract, np.subtract),
    "semantic.mul": (np.multiply, np.multiply),
    "semantic.div": (np.divide, _trunc_div),
    "semantic.max": (np.maximum, np.maximum),
    "semantic.min": (np.minimum, np.minimum),
    "semantic.pow": (np.power, _int_pow),
}


@register_impl(*_BINARY)
def _binary(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    _same_elements(op, (0, 1))
    a, b = _lift(args[0]), _lift(args[1])
    fn_float, fn_int = _BINARY[op.op_name]
    fn = fn_float if a.dtype.kind == "f" else fn_int
    return [store(fn(a, b), _element(op))]


_PREDICATES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal,
}


@register_impl("semantic.cmp")
def _cmp(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    _same_elements(op, (0, 1))
    p = op.attr("predicate")
    if not isinstance(p, StringAttr) or p.value not in _PREDICATES:
        raise VerifyError("'semantic.cmp' needs a predicate: lt, le, gt, ge, eq or ne", op.loc)
    return [store(_PREDICATES[p.value](_lift(args[0]), _lift(args[1])), _element(op))]


@register_impl("semantic.select")
def _select(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    if _operand_element(op, 0).name != "i1":
        raise VerifyError("'semantic.select' condition must be an i1 tensor", op.loc)
    _same_elements(op, (1, 2))
    return [store(np.where(args[0], _lift(args[1]), _lift(args[2])), _element(op))]


@register_impl("semantic.cast")
def _cast(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    x, el = args[0], _element(op)
    if el.name == "i1":
        return [x != 0]
    if el.is_float or x.dtype.kind != "f":
        return [store(_lift(x), el)]
    # float → int: truncate toward zero, saturate at the type's range, NaN → 0
    info = np.iinfo(numpy_dtype(el))
    t = np.trunc(x.astype(np.float64))
    high, low = t >= float(info.max), t <= float(info.min)
    inside = np.where(high | low | np.isnan(t), 0.0, t).astype(np.int64)
    out = np.where(high, info.max, np.where(low, info.min, inside))
    return [out.astype(numpy_dtype(el))]


@register_impl("semantic.constant")
def _constant(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    value = op.attr("value")
    if not isinstance(value, DenseElementsAttr):
        raise VerifyError("'semantic.constant' needs a dense 'value' attribute", op.loc)
    if value.type != op.results[0].type:
        raise VerifyError(f"'semantic.constant' value has type {value.type} but the result "
                          f"is {op.results[0].type}", op.loc)
    return [store(value.to_numpy(), value.type.element)]


# ---------------------------------------------------------------------- reductions


def _reduce_axes(op: Operation, rank: int) -> tuple[int, ...]:
    if op.attr("axes") is None:
        raise VerifyError(f"'{op.op_name}' needs an 'axes' attribute", op.loc)
    axes = tuple(_axis(op, a, rank) for a in i64_list(op.attr("axes")))
    if len(set(axes)) != len(axes):
        raise VerifyError(f"'{op.op_name}' names an axis twice", op.loc)
    return axes


@register_impl("semantic.reduce_sum", "semantic.reduce_max", "semantic.reduce_min",
               "semantic.reduce_mean")
def _reduce(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    x = args[0]
    kind = op.op_name.removeprefix("semantic.reduce_")
    if kind == "mean" and not _operand_element(op, 0).is_float:
        raise VerifyError(f"'semantic.reduce_mean' of an integer tensor "
                          f"({op.operands[0].type}) is not defined", op.loc)
    axes = _reduce_axes(op, x.ndim)
    keep = _attr_bool(op, "keepdims", False)
    v = _lift(x)
    if kind == "sum":
        r = np.sum(v, axis=axes, keepdims=keep)
    elif kind == "mean":
        r = np.mean(v, axis=axes, keepdims=keep)
    else:
        if v.dtype.kind == "f":
            lowest, highest = -np.inf, np.inf
        elif x.dtype == np.bool_:
            lowest, highest = 0, 1
        else:
            lowest, highest = np.iinfo(x.dtype).min, np.iinfo(x.dtype).max
        if kind == "max":
            r = np.max(v, axis=axes, keepdims=keep, initial=lowest)
        else:
            r = np.min(v, axis=axes, keepdims=keep, initial=highest)
    return [store(np.asarray(r), _element(op))]


# -------------------------------------------------------------------------- layout


@register_impl("semantic.reshape")
def _reshape(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    x, t = args[0], op.results[0].type
    assert isinstance(t, TensorType)
    unknown = [i for i, d in enumerate(t.shape) if d is None]
    if len(unknown) > 1 and t.rank == x.ndim and all(
            d is None or d == n for d, n in zip(t.shape, x.shape)):
        shape: tuple[int, ...] = x.shape  # an identity reshape: every ? keeps its dim
    elif len(unknown) > 1:
        raise VerifyError(f"'semantic.reshape' to {t} from shape {x.shape}: more than one "
                          f"'?' dim cannot be inferred", op.loc)
    else:
        shape = tuple(-1 if d is None else d for d in t.shape)
    return [store(_lift(x).reshape(shape), t.element)]


@register_impl("semantic.transpose")
def _transpose(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    x = args[0]
    perm = i64_list(op.attr("permutation"))
    if sorted(perm) != list(range(x.ndim)):
        raise VerifyError(f"'semantic.transpose' permutation {list(perm)} is not a "
                          f"permutation of rank {x.ndim}", op.loc)
    return [store(np.transpose(_lift(x), perm), _element(op))]


@register_impl("semantic.broadcast_to")
def _broadcast_to(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    x, t = args[0], op.results[0].type
    assert isinstance(t, TensorType)
    shape = []
    for i, d in enumerate(t.shape):
        j = x.ndim - t.rank + i  # the aligned input dim, counting from the right
        if d is not None:
            shape.append(d)
        elif j >= 0 and x.shape[j] != 1:
            shape.append(x.shape[j])
        else:
            raise VerifyError(f"'semantic.broadcast_to' cannot bind dim {i} of {t} from an "
                              f"input of shape {x.shape}", op.loc)
    return [store(np.broadcast_to(_lift(x), tuple(shape)), t.element)]


# ------------------------------------------------------------------ data movement


def pad_source(i: np.ndarray, n: int, low: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Per output position ``i`` of a padded dim: the source index (in range) and
    whether it is inside the source (``constant`` mode fills the rest)."""
    j = i - low
    inside = (j >= 0) & (j < n)
    if n == 0:
        return np.zeros_like(j), inside
    if mode == "edge":
        j = np.clip(j, 0, n - 1)
    elif mode == "wrap":
        j = np.mod(j, n)
    elif mode == "reflect":
        p = 2 * (n - 1)
        j = np.zeros_like(j) if p == 0 else np.mod(j, p)
        j = np.where(j >= n, p - j, j)
    return np.clip(j, 0, n - 1), inside


def _clamped_index(idx: np.ndarray, n: int) -> np.ndarray:
    """Indices with negative ones counted from the end, then clamped into ``[0, n)``."""
    idx = idx.astype(np.int64)
    return np.clip(np.where(idx < 0, idx + n, idx), 0, max(n - 1, 0))


@register_impl("semantic.slice")
def _slice(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    x = args[0]
    starts, sizes, steps = (i64_list(op.attr(k)) for k in ("starts", "sizes", "steps"))
    index = tuple(st + sp * np.arange(sz) for st, sz, sp in zip(starts, sizes, steps))
    for d, (ix, n) in enumerate(zip(index, x.shape)):
        if ix.size and (ix.min() < 0 or ix.max() >= n):
            raise VerifyError(f"'{op.op_name}' reads dim {d} at {ix.min()}…{ix.max()} of {n}",
                              op.loc)
    return [store(_lift(x)[np.ix_(*index)] if x.ndim else _lift(x), _element(op))]


@register_impl("semantic.concat")
def _concat(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    _same_elements(op, range(len(args)))
    axis = _axis(op, _attr_int(op, "axis"), args[0].ndim)
    return [store(np.concatenate([_lift(a) for a in args], axis=axis), _element(op))]


@register_impl("semantic.pad")
def _pad(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    x, value = _lift(args[0]), _lift(args[1])
    low, high = i64_list(op.attr("low")), i64_list(op.attr("high"))
    mode_attr = op.attr("mode")
    mode = mode_attr.value if isinstance(mode_attr, StringAttr) else "constant"
    index, mask = [], np.ones((), dtype=bool)
    out_shape = tuple(n + lo + hi for n, lo, hi in zip(x.shape, low, high))
    for d, (n, lo) in enumerate(zip(x.shape, low)):
        src, inside = pad_source(np.arange(out_shape[d]), n, lo, mode)
        shape = [1] * x.ndim
        shape[d] = -1
        index.append(src.reshape(shape))
        mask = mask & inside.reshape(shape)
    if x.size == 0:
        y = np.broadcast_to(value, out_shape)
    else:
        y = x[tuple(index)]
        if mode == "constant":
            y = np.where(mask, y, value)
    return [store(np.broadcast_to(y, out_shape), _element(op))]


@register_impl("semantic.gather")
def _gather(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    data, idx = args
    axis = _axis(op, _attr_int(op, "axis"), data.ndim)
    return [store(np.take(_lift(data), _clamped_index(idx, data.shape[axis]), axis=axis),
                  _element(op))]


@register_impl("semantic.gather_elements")
def _gather_elements(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    data, idx = args
    axis = _axis(op, _attr_int(op, "axis"), data.ndim)
    if idx.ndim != data.ndim or any(b > a for k, (a, b) in enumerate(zip(data.shape, idx.shape))
                                    if k != axis):
        raise VerifyError(f"'{op.op_name}' indices of shape {idx.shape} do not fit data of "
                          f"shape {data.shape}", op.loc)
    window = _lift(data)[tuple(slice(0, n) if k != axis else slice(None)
                               for k, n in enumerate(idx.shape))]
    return [store(np.take_along_axis(window, _clamped_index(idx, data.shape[axis]), axis=axis),
                  _element(op))]


# ------------------------------------------------------------ contraction, norms


@register_impl("semantic.matmul")
def _matmul(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    a, b = args
    _same_elements(op, (0, 1))
    if a.ndim < 2 or b.ndim < 2:
        raise VerifyError(f"'semantic.matmul' needs operands of rank >= 2, got shapes "
                          f"{a.shape} and {b.shape}", op.loc)
    if a.shape[-1] != b.shape[-2]:
        raise VerifyError(f"'semantic.matmul' contracts {a.shape[-1]} with {b.shape[-2]} "
                          f"(shapes {a.shape} and {b.shape})", op.loc)
    return [store(np.matmul(_lift(a), _lift(b)), _element(op))]


@register_impl("semantic.softmax")
def _softmax(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    _float_only(op)
    x = _lift(args[0])
    axis = _axis(op, _attr_int(op, "axis"), x.ndim)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True, initial=-np.inf))
    return [store(e / np.sum(e, axis=axis, keepdims=True), _element(op))]


def _norm_setup(op: Operation, args: list[np.ndarray]) -> tuple[np.ndarray, tuple[int, ...],
                                                                  float]:
    _float_only(op)
    _same_elements(op, range(len(args)))
    x = _lift(args[0])
    axis = _axis(op, _attr_int(op, "axis"), x.ndim)
    eps = op.attr("epsilon")
    if not isinstance(eps, FloatAttr):
        raise VerifyError(f"'{op.op_name}' needs a float 'epsilon' attribute", op.loc)
    for i, p in enumerate(args[1:], start=1):
        if p.shape != x.shape[axis:]:
            raise VerifyError(f"'{op.op_name}' operand {i} has shape {p.shape} but must be "
                              f"{x.shape[axis:]} (the input's dims from axis {axis})", op.loc)
    return x, tuple(range(axis, x.ndim)), eps.value


@register_impl("semantic.layernorm")
def _layernorm(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    x, axes, eps = _norm_setup(op, args)
    centered = x - np.mean(x, axis=axes, keepdims=True)
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    y = centered / np.sqrt(var + eps) * _lift(args[1]) + _lift(args[2])
    return [store(y, _element(op))]


@register_impl("semantic.rmsnorm")
def _rmsnorm(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    x, axes, eps = _norm_setup(op, args)
    y = x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps) * _lift(args[1])
    return [store(y, _element(op))]


# ----------------------------------------------------------------------- functions


@register_impl("func.call")
def _call(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    callee = op.attr("callee")
    module = op.parent_op
    while module is not None and not isinstance(module, ModuleOp):
        module = module.parent_op
    if not isinstance(callee, SymbolRefAttr) or module is None:
        raise VerifyError("'func.call' needs a 'callee' symbol inside a module", op.loc)
    func = _find_function(module, callee.name)
    return run_block(func.body, bind_inputs(func, args))
