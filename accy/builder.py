"""Build semantic programs from Python, for users who generate variants from code.

Every method adds one ``semantic.*`` op and infers its result type with the
op's own ``infer`` (the same code the verifier and shape specialization use),
so a program is checked as it is built.

Example
-------
>>> p = Program()
>>> x = p.arg("?x4096xf32")
>>> b = p.arg("4096xf32")
>>> y = p.gelu(p.add(x, b))
>>> p.ret(y)
>>> sm = p.build()
>>> str(sm.entry().function_type)
'(tensor<?x4096xf32>, tensor<4096xf32>) -> tensor<?x4096xf32>'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from accy.choir.attributes import (
    BoolAttr,
    DenseArrayAttr,
    DenseElementsAttr,
    FloatAttr,
    IntegerAttr,
    ScalarType,
    StringAttr,
    TensorType,
    scalar_type_of,
)
from accy.choir.builtin import FuncOp, ModuleOp, ReturnOp
from accy.choir.ir import Block, Operation, Value
from accy.dialects.semantic import BINARY_OPS, UNARY_OPS, SemanticOp
from accy.errors import VerifyError
from accy.preparation.products import SemanticModule


def tensor_type(spec: str | TensorType | tuple[Sequence[int | None], str]) -> TensorType:
    """``"?x4096xf32"``, ``"tensor<4xf16>"``, ``((None, 4096), "f32")`` or a TensorType."""
    if isinstance(spec, TensorType):
        return spec
    if isinstance(spec, tuple):
        dims, el = spec
        return TensorType(tuple(dims), ScalarType(el))
    text = spec.strip()
    if text.startswith("tensor<") and text.endswith(">"):
        text = text[7:-1]
    parts = text.split("x")
    dims = tuple(None if d == "?" else int(d) for d in parts[:-1])
    return TensorType(dims, ScalarType(parts[-1]))


class Program:
    """A one-function semantic program under construction."""

    def __init__(self, name: str = "main") -> None:
        self.name = name
        self.block = Block()
        self.results: list[Value] | None = None

    # -- structure
    def arg(self, spec: Any) -> Value:
        """Add a function argument of the given tensor type."""
        return self.block.add_arg(tensor_type(spec))

    def ret(self, *values: Value) -> None:
        """Return ``values`` (in order) from the function."""
        self.results = list(values)

    def build(self) -> SemanticModule:
        """The verified :class:`SemanticModule`."""
        if self.results is None:
            raise VerifyError("the program has no results: call ret(...) first")
        module = ModuleOp.build()
        func = FuncOp.build(self.name, [a.type for a in self.block.args],
                            [v.type for v in self.results])
        body = func.regions[0].blocks[0]
        # move the built block's ops into the function's entry block
        for a, b in zip(self.block.args, body.args):
            a.replace_all_uses_with(b)
        for op in list(self.block.ops):
            op.parent = None
            body.append(op)
        self.block.ops.clear()
        results = [body.args[v.index] if v.owner is self.block else v  # type: ignore[attr-defined]
                   for v in self.results]
        body.append(ReturnOp(results))
        module.body.append(func)
        sm = SemanticModule(module)
        sm.verify()
        return sm

    # -- generic op
    def op(self, name: str, operands: Sequence[Value], attributes: dict[str, Any] | None = None,
           result: TensorType | None = None) -> Value:
        """Add ``semantic.<name>``; its result type is inferred unless given."""
        attrs = attributes or {}
        placeholder = result or TensorType((), ScalarType("f32"))
        op = Operation.create(f"semantic.{name}", list(operands), [placeholder], attrs)
        if not isinstance(op, SemanticOp):
            raise VerifyError(f"unknown semantic op '{name}'")
        if result is None or name in ("reshape", "broadcast_to"):
            op.results[0].type = op.infer()
        self.block.append(op)
        op.verify_()
        return op.results[0]

    # -- ops with attributes or a given result type
    def constant(self, value: Any, dtype: str | None = None) -> Value:
        arr = np.asarray(value, dtype=dtype or None)
        if arr.dtype == np.float64 and dtype is None:
            arr = arr.astype(np.float32)
        t = TensorType(tuple(arr.shape), scalar_type_of(arr.dtype))
        return self.op("constant", [], {"value": DenseElementsAttr.from_numpy(arr, t)}, t)

    def cast(self, x: Value, dtype: str) -> Value:
        t = x.type
        assert isinstance(t, TensorType)
        return self.op("cast", [x], result=t.with_element(ScalarType(dtype)))

    def reshape(self, x: Value, shape: Sequence[int | None]) -> Value:
        t = x.type
        assert isinstance(t, TensorType)
        return self.op("reshape", [x], result=t.with_shape(tuple(shape)))

    def broadcast_to(self, x: Value, shape: Sequence[int | None]) -> Value:
        t = x.type
        assert isinstance(t, TensorType)
        return self.op("broadcast_to", [x], result=t.with_shape(tuple(shape)))

    def transpose(self, x: Value, permutation: Sequence[int]) -> Value:
        return self.op("transpose", [x], {"permutation": DenseArrayAttr(tuple(permutation))})

    def cmp(self, a: Value, b: Value, predicate: str) -> Value:
        return self.op("cmp", [a, b], {"predicate": StringAttr(predicate)})

    def select(self, cond: Value, a: Value, b: Value) -> Value:
        return self.op("select", [cond, a, b])

    def matmul(self, a: Value, b: Value) -> Value:
        return self.op("matmul", [a, b])

    def gelu(self, x: Value, approximate: str = "none") -> Value:
        return self.op("gelu", [x], {"approximate": StringAttr(approximate)})

    def softmax(self, x: Value, axis: int = -1) -> Value:
        return self.op("softmax", [x], {"axis": IntegerAttr(axis)})

    def layernorm(self, x: Value, gamma: Value, beta: Value, axis: int = -1,
                  epsilon: float = 1e-5) -> Value:
        return self.op("layernorm", [x, gamma, beta],
                       {"axis": IntegerAttr(axis), "epsilon": FloatAttr(epsilon)})

    def rmsnorm(self, x: Value, gamma: Value, axis: int = -1, epsilon: float = 1e-5) -> Value:
        return self.op("rmsnorm", [x, gamma],
                       {"axis": IntegerAttr(axis), "epsilon": FloatAttr(epsilon)})

    def _reduce(self, kind: str, x: Value, axes: Sequence[int], keepdims: bool) -> Value:
        return self.op(f"reduce_{kind}", [x], {"axes": DenseArrayAttr(tuple(axes)),
                                               "keepdims": BoolAttr(keepdims)})

    def reduce_sum(self, x: Value, axes: Sequence[int], keepdims: bool = False) -> Value:
        return self._reduce("sum", x, axes, keepdims)

    def reduce_max(self, x: Value, axes: Sequence[int], keepdims: bool = False) -> Value:
        return self._reduce("max", x, axes, keepdims)

    def reduce_min(self, x: Value, axes: Sequence[int], keepdims: bool = False) -> Value:
        return self._reduce("min", x, axes, keepdims)

    def reduce_mean(self, x: Value, axes: Sequence[int], keepdims: bool = False) -> Value:
        return self._reduce("mean", x, axes, keepdims)


def _unary(name: str) -> Any:
    def method(self: Program, x: Value) -> Value:
        return self.op(name, [x])

    method.__name__ = name
    method.__doc__ = f"``semantic.{name}``"
    return method


def _binary(name: str) -> Any:
    def method(self: Program, a: Value, b: Value) -> Value:
        return self.op(name, [a, b])

    method.__name__ = name
    method.__doc__ = f"``semantic.{name}`` (NumPy broadcasting)"
    return method


for _n in UNARY_OPS:
    if _n != "gelu":
        setattr(Program, _n, _unary(_n))
for _n in BINARY_OPS:
    setattr(Program, _n, _binary(_n))

__all__ = ["Program", "tensor_type"]
