"""The ONNX front end: an ONNX ``ModelProto`` (or ``.onnx`` path) → a verified SemanticModule.

Every ONNX node maps onto today's ``semantic`` ops, directly (``Add`` →
``semantic.add``) or composed (``LogSoftmax`` → max, sub, exp, sum, log).
Values known at import time — initializers, ``Constant``, ``Shape``/``Size``
of statically shaped tensors, and anything computed from those alone — are
folded with NumPy, so shape computations (``Shape → Gather → Concat →
Reshape``) never reach the IR; a constant that does is a ``semantic.constant``.
Integer graph inputs that only feed shape operands (``Reshape.shape``,
``Expand.shape``, ``axes``, …, possibly through foldable ops) are bound from
``input_values`` when given and leave the function's arguments; the module's
``meta["onnx_arguments"]`` lists the graph inputs that stayed arguments, in
order. Named or unknown dims become ``?``.

Each op carries ``loc("MODEL:NODE":N:1)`` — the model file, the node's name
(or ``OpType_N``) and its 1-based index N in the graph — so any later error
names the node. A node that does not map (an unsupported op, dtype, opset or
attribute) is one :class:`~accy.errors.FrontendError` naming the op, the node
and the opset.

Example
-------
>>> import onnx, onnx.helper as h
>>> g = h.make_graph([h.make_node("Relu", ["x"], ["y"], name="r")], "g",
...     [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 4])],
...     [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4])])
>>> sm = import_onnx(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))
>>> str(sm.entry().function_type)
'(tensor<?x4xf32>) -> tensor<?x4xf32>'
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from accy.builder import Program
from accy.choir.attributes import (
    DenseArrayAttr,
    DenseElementsAttr,
    IntegerAttr,
    ScalarType,
    StringAttr,
    TensorType,
    numpy_dtype,
    scalar_type_of,
)
from accy.choir.ir import Value
from accy.choir.location import UNKNOWN, Location
from accy.errors import AccyError, FrontendError
from accy.preparation.products import SemanticModule

ELEMENTS = {1: "f32", 10: "f16", 16: "bf16", 11: "f64", 3: "i8", 5: "i16", 6: "i32",
            7: "i64", 9: "i1", 2: "ui8", 4: "ui16", 12: "ui32", 13: "ui64"}
"""ONNX ``TensorProto.DataType`` → the semantic element types (SEMANTIC.md)."""

T = Any
"""A tensor during import: a NumPy array (known at import time) or an IR Value."""


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise FrontendError("reading ONNX models needs the 'onnx' package "
                            "(pip install 'accy[onnx]')") from None
    return onnx


def _dtype_name(code: int) -> str:
    onnx = _onnx()
    try:
        return str(onnx.TensorProto.DataType.Name(code))
    except ValueError:
        return f"dtype {code}"


# --------------------------------------------------------------------- public API


def import_onnx(model: Any, *, file: str | None = None,
                input_values: Mapping[str, np.ndarray] | None = None,
                input_shapes: Mapping[str, Sequence[int]] | None = None,
                argument_shapes: Mapping[int, Sequence[int]] | None = None) -> SemanticModule:
    """Import ``model`` (a ``ModelProto``, a path, or serialized bytes).

    ``input_values`` binds integer graph inputs that only feed shape operands
    (they leave the function's arguments); ``input_shapes`` refines the ``?``
    dims of the other graph inputs (so ``Shape`` of them folds);
    ``argument_shapes`` does the same by position (``--shape arg0=…``, a sweep's
    ``shapes``: argument N is the N-th graph input that is not an initializer).
    """
    onnx = _onnx()
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        try:
            model = onnx.load(path)
        except Exception as e:  # onnx raises DecodeError, OSError, … for a bad file
            raise FrontendError(f"cannot read ONNX model {path}: {type(e).__name__}: "
                                f"{str(e).splitlines()[0] if str(e) else ''}") from None
        file = file or path
    elif isinstance(model, (bytes, bytearray)):
        try:
            model = onnx.load_from_string(bytes(model))
        except Exception as e:
            raise FrontendError(f"malformed ONNX model bytes: {type(e).__name__}") from None
    if not isinstance(model, onnx.ModelProto):
        raise FrontendError(f"expected an ONNX ModelProto, got {type(model).__name__}")
    file = file or (model.graph.name or "model") + ".onnx"
    shapes = dict(input_shapes or {})
    if argument_shapes:
        names = _argument_names(model)
        for index, dims in argument_shapes.items():
            if not 0 <= index < len(names):
                raise FrontendError(f"{file}: a shape is given for arg{index}, but the model "
                                    f"has {len(names)} graph input(s) "
                                    f"({', '.join(names) or 'none'})")
            shapes[names[index]] = tuple(dims)
    importer = _Importer(model, file, dict(input_values or {}), shapes)
    return importer.run()


def _argument_names(model: Any) -> list[str]:
    """The graph inputs that are not initializers, in order (the function's arguments)."""
    inits = {t.name for t in model.graph.initializer}
    return [vi.name for vi in model.graph.input if vi.name not in inits]


# ----------------------------------------------------------------------- builder


class _Program(Program):
    """A Program whose ops carry the current node's location; errors name the node."""

    def __init__(self, importer: _Importer) -> None:
        super().__init__("main")
        self.importer = importer

    def op(self, name: str, operands: Sequence[Value], attributes: dict[str, Any] | None = None,
           result: TensorType | None = None) -> Value:
        try:
            v = super().op(name, operands, attributes, result)
        except FrontendError:
            raise
        except AccyError as e:
            raise self.importer.error(e.message) from None
        v.owner.loc = self.importer.loc  # type: ignore[union-attr]
        return v


def _is_const(x: T) -> bool:
    return isinstance(x, np.ndarray)


def _idiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero (0 on division by zero), as semantic.div."""
    with np.errstate(all="ignore"):
        safe = np.where(b == 0, 1, b)
        q = np.abs(a) // np.abs(safe) * np.sign(a) * np.sign(safe)
        return np.where(b == 0, 0, q)


_FOLD_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
    "min": np.minimum, "pow": np.power,
}
_FOLD_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "neg": np.negative, "abs": np.abs, "floor": np.floor, "sqrt": np.sqrt, "exp": np.exp,
    "log": np.log, "relu": lambda x: np.maximum(x, 0), "reciprocal": lambda x: 1 / x,
    "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
}
_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "eq": np.equal, "ne": np.not_equal}
_FOLD_REDUCE: dict[str, Callable[..., Any]] = {"sum": np.sum, "max": np.max, "min": np.min,
                                               "mean": np.mean}


class _Node:
    """The node being imported: its proto, attributes and position."""

    def __init__(self, proto: Any, index: int) -> None:
        from onnx import helper

        self.proto = proto
        self.index = index
        self.op_type = str(proto.op_type)
        self.name = str(proto.name) or f"{self.op_type}_{index}"
        self.attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
        self.outputs = list(proto.output)

    def get(self, key: str, default: Any = None) -> Any:
        v = self.attrs.get(key, default)
        return v.decode() if isinstance(v, bytes) else v


class _Importer:
    def __init__(self, model: Any, file: str, input_values: dict[str, np.ndarray],
                 input_shapes: dict[str, Sequence[int]]) -> None:
        self.model = model
        self.graph = model.graph
        self.file = file
        self.input_values = input_values
        self.input_shapes = input_shapes
        self.opset = 0
        for o in model.opset_import:
            if o.domain in ("", "ai.onnx"):
                self.opset = int(o.version)
        self.env: dict[str, T] = {}
        self.loc: Location = UNKNOWN
        self.node: _Node | None = None
        self.outer: list[tuple[_Node, int]] = []
        """The nodes whose function bodies are being imported, with their opsets."""
        self.p = _Program(self)

    # -- errors
    def where(self) -> str:
        if self.node is None:
            return f"ONNX graph '{self.graph.name}' (opset {self.opset})"
        here = f"ONNX node '{self.node.name}' ({self.node.op_type}, opset {self.opset})"
        if self.outer:
            outer, opset = self.outer[0]
            return f"ONNX node '{outer.name}' ({outer.op_type}, opset {opset}), in its " \
                f"function body: {here.removeprefix('ONNX ')}"
        return here

    def error(self, message: str) -> FrontendError:
        return FrontendError(f"{self.where()}: {message}", self.loc)

    def unsupported(self, reason: str) -> FrontendError:
        return self.error(f"unsupported: {reason}")

    # -- the import
    def run(self) -> SemanticModule:
        """Import the graph: bind its inputs, import each node in order, return its outputs."""
        arguments = self.bind_inputs()
        consumed = {i for n in self.graph.node for i in n.input} | \
            {o.name for o in self.graph.output}
        for index, proto in enumerate(self.graph.node):
            self.import_node(_Node(proto, index), consumed)
        self.node = None
        self.loc = UNKNOWN
        return self.finish(arguments)

    def bind_inputs(self) -> list[str]:
        """Bind initializers, shape-only inputs given values, and arguments; the argument names."""
        initializers = {t.name: t for t in self.graph.initializer}
        for name, t in initializers.items():
            self.env[name] = self.tensor_value(t)
        shape_only = self.shape_only_names()
        arguments: list[str] = []
        for vi in self.graph.input:
            if vi.name in initializers:
                continue
            if vi.name in shape_only and vi.name in self.input_values:
                self.env[vi.name] = np.asarray(self.input_values[vi.name])
                continue
            self.env[vi.name] = self.p.arg(self.input_type(vi))
            arguments.append(vi.name)
        return arguments

    def import_node(self, node: _Node, consumed: set[str]) -> None:
        """Import one node: find its handler, run it on its inputs, bind its outputs."""
        self.node = node
        if not self.outer:  # a function body's ops are located at the node it expands
            self.loc = Location(f"{self.file}:{node.name}", node.index + 1, 1)
        handler = self.handler_of(node)
        if handler is None:  # an op ONNX defines by a function: import its body
            self.expand(node)
            return
        ins: list[Any] = []
        for name in node.proto.input:
            if not name:
                ins.append(None)
            elif name not in self.env:
                raise self.error(f"uses '{name}', which no earlier node or input defines")
            else:
                ins.append(self.env[name])
        try:
            outs = handler(self, node, ins)
        except AccyError:
            raise
        except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError,
                OverflowError) as e:
            raise self.error(f"internal error: {type(e).__name__}: {e}") from None
        self.bind_outputs(node, outs, consumed)

    def handler_of(self, node: _Node) -> Handler | None:
        """The handler of ``node``'s op (a default-domain op); None when accy maps it
        through the op's ONNX function body instead (:meth:`expand`)."""
        if node.proto.domain not in ("", "ai.onnx"):
            raise self.unsupported(f"op '{node.op_type}' of domain '{node.proto.domain}'")
        if self.opset == 0:
            raise self.error("the model imports no default-domain ('ai.onnx') opset")
        return OPS.get(node.op_type)

    def bind_outputs(self, node: _Node, outs: list[Any], consumed: set[str]) -> None:
        """Bind the node's outputs; one it does not produce may go unused, never consumed."""
        for k, name in enumerate(node.outputs):
            if not name:
                continue
            if k < len(outs) and outs[k] is not None:
                out = outs[k]
                self.env[name] = np.asarray(out) if isinstance(out, np.generic) else out
            elif name in consumed:
                raise self.unsupported(f"output {k} ('{name}') of {node.op_type}")

    def finish(self, arguments: list[str]) -> SemanticModule:
        """Return the graph's outputs and build the module, its ONNX metadata attached."""
        results = []
        for vi in self.graph.output:
            if vi.name not in self.env:
                raise self.error(f"graph output '{vi.name}' is not computed by any node")
            results.append(self.value(self.env[vi.name]))
        self.p.ret(*results)
        try:
            sm = self.p.build()
        except FrontendError:
            raise
        except AccyError as e:
            raise self.error(e.message) from None
        sm.meta.update({"source": self.file, "onnx_arguments": arguments,
                        "onnx_opset": self.opset})
        return sm

    def expand(self, node: _Node) -> None:
        """Import a node with no handler as its schema's function body (onnx_functions)."""
        from accy.frontends.onnx_functions import function_body

        types = [self.type_proto(n) for n in node.proto.input]
        body = None if len(self.outer) > 8 else function_body(node.proto, self.opset, types)
        if body is None:
            raise self.unsupported(f"op '{node.op_type}' "
                                   f"({UNSUPPORTED.get(node.op_type, NO_MAPPING)})")
        nodes, opset = body
        consumed = {i for n in nodes for i in n.input} | set(node.outputs)
        outer_opset = self.opset
        self.outer.append((node, outer_opset))
        try:
            self.opset = opset
            for index, proto in enumerate(nodes):
                if proto.domain not in ("", "ai.onnx"):
                    self.node = _Node(proto, index)
                    raise self.unsupported(f"op '{proto.op_type}' of domain '{proto.domain}'")
                self.node = _Node(proto, index)
                self.import_node(self.node, consumed)
        finally:
            self.outer.pop()
            self.opset = outer_opset
        self.node = node
        for name in node.outputs:
            if name and name not in self.env:
                raise self.unsupported(f"output '{name}' of {node.op_type}'s function body")

    def type_proto(self, name: str) -> Any:
        """The ONNX type of a tensor in ``env`` (what context-dependent functions read)."""
        onnx = _onnx()
        if not name or name not in self.env:
            return onnx.TypeProto()
        x = self.env[name]
        el = self.el(x)
        code = next((c for c, e in ELEMENTS.items() if e == el), None)
        if code is None:
            return onnx.TypeProto()
        return onnx.helper.make_tensor_type_proto(code, [d if d is not None else "?"
                                                         for d in self.shape(x)])

    def input_type(self, vi: Any) -> TensorType:
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is None:
            raise self.unsupported(f"graph input '{vi.name}' is not a tensor "
                                   f"(sequence, map, optional or sparse)")
        el = ELEMENTS.get(tt.elem_type)
        if el is None:
            raise self.unsupported(f"dtype {_dtype_name(tt.elem_type)} of graph input "
                                   f"'{vi.name}'")
        if not tt.HasField("shape"):
            raise self.unsupported(f"graph input '{vi.name}' has an unknown rank")
        dims: list[int | None] = [int(d.dim_value) if d.HasField("dim_value") else None
                                  for d in tt.shape.dim]
        given = self.input_shapes.get(vi.name)
        if given is not None:
            if len(given) != len(dims) or any(d is not None and d != g
                                              for d, g in zip(dims, given)):
                raise self.error(f"graph input '{vi.name}' is {dims} but is given the "
                                 f"shape {list(given)}")
            dims = [int(g) for g in given]
        return TensorType(tuple(dims), ScalarType(el))

    def tensor_value(self, t: Any) -> np.ndarray:
        from onnx import numpy_helper

        if t.data_type in (16,):  # bfloat16: held as float32 in accy
            return numpy_helper.to_array(t).astype(np.float32)
        try:
            arr = numpy_helper.to_array(t)
        except Exception as e:
            raise self.unsupported(f"tensor '{t.name}' of {_dtype_name(t.data_type)}: "
                                   f"{type(e).__name__}") from None
        if arr.dtype.kind not in "biuf":
            raise self.unsupported(f"tensor '{t.name}' of {_dtype_name(t.data_type)}")
        return np.array(arr)

    def shape_only_names(self) -> set[str]:
        """Tensors whose every use is a shape operand (directly or through foldable ops)."""
        uses: dict[str, list[tuple[Any, int]]] = {}
        for n in self.graph.node:
            for i, name in enumerate(n.input):
                uses.setdefault(name, []).append((n, i))
        outputs = {o.name for o in self.graph.output}
        shape_only: set[str] = set()
        for n in reversed(self.graph.node):
            for name in n.input:
                if not name or name in outputs or name in shape_only:
                    continue
                ok = True
                for consumer, i in uses.get(name, []):
                    if i in SHAPE_OPERANDS.get(consumer.op_type, ()):
                        continue
                    if consumer.op_type in FOLD_THROUGH and consumer.output and all(
                            o in shape_only for o in consumer.output if o):
                        continue
                    ok = False
                    break
                if ok:
                    shape_only.add(name)
        return shape_only

    # -- tensors
    def el(self, x: T) -> str:
        if isinstance(x, np.ndarray):
            try:
                return scalar_type_of(x.dtype).name
            except ValueError:
                return str(x.dtype)
        return x.type.element.name  # type: ignore[no-any-return]

    def shape(self, x: T) -> tuple[int | None, ...]:
        if isinstance(x, np.ndarray):
            return tuple(int(d) for d in x.shape)
        return tuple(x.type.shape)

    def rank(self, x: T) -> int:
        return len(self.shape(x))

    def value(self, x: T, el: str | None = None) -> Value:
        """``x`` as an IR value (a constant becomes ``semantic.constant``)."""
        if isinstance(x, Value):
            return x
        arr = np.asarray(x)
        name = el or self.el(arr)
        if name not in ELEMENTS.values():
            raise self.unsupported(f"dtype {arr.dtype} (a constant of shape {list(arr.shape)})")
        if name == "bf16":
            arr = arr.astype(np.float32)
        else:
            with np.errstate(all="ignore"):
                arr = arr.astype(numpy_dtype(ScalarType(name)))
        t = TensorType(tuple(int(d) for d in arr.shape), ScalarType(name))
        return self.p.op("constant", [], {"value": DenseElementsAttr.from_numpy(arr, t)}, t)

    def const(self, x: T | None, what: str) -> np.ndarray:
        if x is None:
            raise self.error(f"needs {what}")
        if not isinstance(x, np.ndarray):
            raise self.unsupported(f"{what} must be known at import time (a constant, an "
                                   f"initializer or a bound graph input)")
        return x

    def scalar(self, v: float, like: T) -> np.ndarray:
        el = self.el(like)
        dtype = np.float32 if el == "bf16" else numpy_dtype(ScalarType(el)) \
            if el in ELEMENTS.values() else np.dtype(el)
        return np.array(v, dtype=dtype)

    def pair(self, a: T, b: T) -> tuple[Value, Value]:
        if isinstance(a, Value) and not isinstance(b, Value):
            return a, self.value(b, self.el(a))
        if isinstance(b, Value) and not isinstance(a, Value):
            return self.value(a, self.el(b)), b
        return self.value(a), self.value(b)

    def check_float(self, x: T, what: str = "") -> None:
        if self.el(x) not in ("f32", "f16", "bf16", "f64"):
            raise self.unsupported(f"{what or 'the op'} on {self.el(x)} tensors")

    # -- ops (constants fold with NumPy)
    def binary(self, name: str, a: T, b: T) -> T:
        if _is_const(a) and _is_const(b):
            with np.errstate(all="ignore"):
                if name == "div":
                    r = _idiv(a, b) if a.dtype.kind in "iub" else a / b
                else:
                    r = _FOLD_BINARY[name](a, b)
            return np.asarray(r).astype(a.dtype)
        va, vb = self.pair(a, b)
        return self.p.op(name, [va, vb])

    def unary(self, name: str, x: T) -> T:
        if _is_const(x) and name in _FOLD_UNARY:
            with np.errstate(all="ignore"):
                return np.asarray(_FOLD_UNARY[name](x)).astype(x.dtype)
        return self.p.op(name, [self.value(x)])

    def cmp(self, pred: str, a: T, b: T) -> T:
        if _is_const(a) and _is_const(b):
            return np.asarray(_CMP[pred](a, b))
        va, vb = self.pair(a, b)
        return self.p.cmp(va, vb, pred)

    def select(self, c: T, a: T, b: T) -> T:
        if _is_const(c) and _is_const(a) and _is_const(b):
            return np.asarray(np.where(c, a, b)).astype(a.dtype)
        va, vb = self.pair(a, b)
        return self.p.select(self.value(c), va, vb)

    def cast(self, x: T, el: str) -> T:
        if _is_const(x):
            if el == "i1":
                return np.asarray(x != 0)
            dtype = np.float32 if el == "bf16" else numpy_dtype(ScalarType(el)) \
                if el in ELEMENTS.values() else np.dtype(el)
            with np.errstate(all="ignore"):
                return np.asarray(x).astype(dtype)
        if el not in ELEMENTS.values():
            raise self.unsupported(f"cast to {el}")
        if self.el(x) == el:
            return x
        return self.p.cast(x, el)

    def reshape(self, x: T, shape: Sequence[int | None]) -> T:
        shape = tuple(shape)
        if _is_const(x):
            return x.reshape(tuple(-1 if d is None else d for d in shape))
        if self.shape(x) == shape and None not in shape:
            return x
        return self.p.reshape(x, shape)

    def transpose(self, x: T, perm: Sequence[int]) -> T:
        perm = [int(p) for p in perm]
        if _is_const(x):
            return np.ascontiguousarray(x.transpose(perm))
        if perm == list(range(len(perm))):
            return x
        return self.p.transpose(x, perm)

    def broadcast_to(self, x: T, shape: Sequence[int | None]) -> T:
        shape = tuple(shape)
        if _is_const(x) and None not in shape:
            return np.array(np.broadcast_to(x, tuple(int(d) for d in shape if d is not None)))
        if self.shape(x) == shape:
            return x
        return self.p.broadcast_to(self.value(x), shape)

    def reduce(self, kind: str, x: T, axes: Sequence[int], keep: bool) -> T:
        r = self.rank(x)
        axes = sorted({int(a) % r if r else 0 for a in axes})
        if not axes:
            return x
        if _is_const(x):
            out = _FOLD_REDUCE[kind](x, axis=tuple(axes), keepdims=keep)
            return np.asarray(out).astype(x.dtype)
        return self.p._reduce(kind, x, axes, keep)

    def matmul(self, a: T, b: T) -> T:
        va, vb = self.pair(a, b)
        ra, rb = self.rank(va), self.rank(vb)
        if ra == 0 or rb == 0:
            raise self.error("MatMul operands must have rank >= 1")
        if ra == 1:
            va = self.reshape(va, (1,) + self.shape(va))
        if rb == 1:
            vb = self.reshape(vb, self.shape(vb) + (1,))
        y = self.p.matmul(va, vb)
        s = self.shape(y)
        if ra == 1 and rb == 1:
            return self.reshape(y, ())
        if ra == 1:
            return self.reshape(y, s[:-2] + s[-1:])
        if rb == 1:
            return self.reshape(y, s[:-1])
        return y

    def norm_axes(self, axes: Sequence[int], rank: int) -> list[int]:
        out = []
        for a in axes:
            a = int(a)
            if not -rank <= a < max(rank, 1):
                raise self.error(f"axis {a} is out of range for rank {rank}")
            out.append(a % rank if rank else 0)
        return out

    def reduced_shape(self, x: T, axes: Sequence[int], keep: bool) -> tuple[int | None, ...]:
        s = self.shape(x)
        if keep:
            return tuple(1 if i in axes else d for i, d in enumerate(s))
        return tuple(d for i, d in enumerate(s) if i not in axes)


# ------------------------------------------------------------------- op handlers

Handler = Callable[[_Importer, _Node, list[T]], list[T]]
OPS: dict[str, Handler] = {}


def _op(*names: str) -> Callable[[Handler], Handler]:
    def decorate(fn: Handler) -> Handler:
        for n in names:
            OPS[n] = fn
        return fn

    return decorate


def _prod(dims: Sequence[int | None]) -> int | None:
    out = 1
    for d in dims:
        if d is None:
            return None
        out *= d
    return out


def _broadcast_dims(imp: _Importer, a: Sequence[int | None], b: Sequence[int | None]) \
        -> tuple[int | None, ...]:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out: list[int | None] = []
    for x, y in zip(a, b):
        if x == 1:
            out.append(y)
        elif y == 1:
            out.append(x)
        elif x is None or y is None:
            out.append(x if y is None else y)
        elif x == y:
            out.append(x)
        else:
            raise imp.error(f"shapes {list(a)} and {list(b)} do not broadcast")
    return tuple(out)


# -- elementwise, direct
for _onnx_name, _sem in (("Add", "add"), ("Sub", "sub"), ("Mul", "mul"), ("Div", "div"),
                         ("Pow", "pow")):
    def _make_binary(sem: str) -> Handler:
        def handler(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
            a, b = ins[0], ins[1]
            if sem == "pow" and imp.el(a) != imp.el(b):
                b = imp.cast(b, imp.el(a))
            return [imp.binary(sem, a, b)]

        return handler

    OPS[_onnx_name] = _make_binary(_sem)

for _onnx_name, _sem in (("Neg", "neg"), ("Abs", "abs"), ("Exp", "exp"), ("Log", "log"),
                         ("Sqrt", "sqrt"), ("Reciprocal", "reciprocal"), ("Floor", "floor"),
                         ("Tanh", "tanh"), ("Sigmoid", "sigmoid"), ("Relu", "relu"),
                         ("Erf", "erf"), ("Sin", "sin"), ("Cos", "cos")):
    def _make_unary(sem: str) -> Handler:
        def handler(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
            return [imp.unary(sem, ins[0])]

        return handler

    OPS[_onnx_name] = _make_unary(_sem)


@_op("Max", "Min", "Sum", "Mean")
def _variadic(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    sem = {"Max": "max", "Min": "min", "Sum": "add", "Mean": "add"}[n.op_type]
    xs = [x for x in ins if x is not None]
    if not xs:
        raise imp.error("needs at least one input")
    acc = xs[0]
    for x in xs[1:]:
        acc = imp.binary(sem, acc, x)
    if n.op_type == "Mean":
        acc = imp.binary("div", acc, imp.scalar(len(xs), acc))
    return [acc]


for _onnx_name, _pred in (("Equal", "eq"), ("Less", "lt"), ("Greater", "gt"),
                          ("LessOrEqual", "le"), ("GreaterOrEqual", "ge")):
    def _make_cmp(pred: str) -> Handler:
        def handler(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
            return [imp.cmp(pred, ins[0], ins[1])]

        return handler

    OPS[_onnx_name] = _make_cmp(_pred)


@_op("Where")
def _where(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    return [imp.select(ins[0], ins[1], ins[2])]


@_op("Not")
def _not(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    return [imp.cmp("eq", ins[0], np.array(False))]


@_op("And", "Or", "Xor")
def _logical(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    a, b = ins
    if n.op_type == "Xor":
        return [imp.cmp("ne", a, b)]
    if n.op_type == "And":
        return [imp.select(a, b, np.array(False))]
    return [imp.select(a, np.array(True), b)]


@_op("Identity")
def _identity(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    if ins[0] is None:
        raise imp.error("needs an input")
    return [ins[0]]


@_op("Dropout")
def _dropout(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    training = ins[2] if len(ins) > 2 else None
    if training is not None and (not _is_const(training) or bool(training)):
        raise imp.unsupported("Dropout in training mode (random)")
    mask = imp.broadcast_to(np.array(True), imp.shape(x))
    return [x, mask]


@_op("Cast", "CastLike")
def _cast(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    el: str | None
    if n.op_type == "CastLike":
        el = imp.el(ins[1])
    else:
        to = int(n.get("to", 0))
        el = ELEMENTS.get(to)
        if el is None:
            from onnx import helper

            if _is_const(ins[0]):
                try:
                    dtype = helper.tensor_dtype_to_np_dtype(to)
                except Exception:
                    raise imp.unsupported(f"cast to {_dtype_name(to)}") from None
                if np.dtype(dtype).kind in "biuf":
                    with np.errstate(all="ignore"):
                        return [np.asarray(ins[0]).astype(dtype)]
            raise imp.unsupported(f"cast to {_dtype_name(to)}")
    if imp.el(ins[0]) not in ELEMENTS.values() and not _is_const(ins[0]):
        raise imp.unsupported(f"cast from {imp.el(ins[0])}")
    return [imp.cast(ins[0], el)]


@_op("Sign")
def _sign(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    one, zero = imp.scalar(1, x), imp.scalar(0, x)
    neg = imp.select(imp.cmp("lt", x, zero), imp.scalar(-1, x), zero)
    return [imp.select(imp.cmp("gt", x, zero), one, neg)]


@_op("Ceil")
def _ceil(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    return [imp.unary("neg", imp.unary("floor", imp.unary("neg", ins[0])))]


@_op("IsNaN")
def _isnan(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    return [imp.cmp("ne", ins[0], ins[0])]


@_op("IsInf")
def _isinf(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    imp.check_float(x, "IsInf")
    pos, neg = int(n.get("detect_positive", 1)), int(n.get("detect_negative", 1))
    out: T = imp.broadcast_to(np.array(False), imp.shape(x))
    if pos:
        out = imp.cmp("eq", x, imp.scalar(math.inf, x))
    if neg:
        m = imp.cmp("eq", x, imp.scalar(-math.inf, x))
        out = imp.select(out, np.array(True), m) if pos else m
    return [out]


@_op("Tan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh")
def _trig(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    imp.check_float(x, n.op_type)
    one, half = imp.scalar(1, x), imp.scalar(0.5, x)
    if n.op_type == "Tan":
        return [imp.binary("div", imp.unary("sin", x), imp.unary("cos", x))]
    if n.op_type in ("Sinh", "Cosh"):
        e, ei = imp.unary("exp", x), imp.unary("exp", imp.unary("neg", x))
        return [imp.binary("mul", imp.binary("sub" if n.op_type == "Sinh" else "add", e, ei),
                           half)]
    if n.op_type == "Atanh":
        q = imp.binary("div", imp.binary("add", one, x), imp.binary("sub", one, x))
        return [imp.binary("mul", imp.unary("log", q), half)]
    sq = imp.binary("add" if n.op_type == "Asinh" else "sub", imp.binary("mul", x, x), one)
    return [imp.unary("log", imp.binary("add", x, imp.unary("sqrt", sq)))]


@_op("Mod")
def _mod(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    a, b = ins
    fmod = int(n.get("fmod", 0))
    if imp.el(a) in ("f32", "f16", "bf16", "f64"):
        if not fmod:
            raise imp.error("Mod of floating-point tensors needs fmod=1")
        q = imp.binary("div", a, b)
        zero = imp.scalar(0, q)
        fl = imp.select(imp.cmp("lt", q, zero), imp.unary("neg", imp.unary("floor", imp.unary(
            "neg", q))), imp.unary("floor", q))
        return [imp.binary("sub", a, imp.binary("mul", b, fl))]
    r = imp.binary("sub", a, imp.binary("mul", imp.binary("div", a, b), b))
    if fmod:
        return [r]
    zero = imp.scalar(0, r)
    differ = imp.cmp("ne", imp.cmp("lt", r, zero), imp.cmp("lt", b, zero))
    fix = imp.select(imp.cmp("ne", r, zero), differ, np.array(False))
    return [imp.select(fix, imp.binary("add", r, b), r)]


# -- activations, composed
@_op("Clip")
def _clip(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    if imp.opset < 11:
        lo: T | None = imp.scalar(n.get("min", -3.4028234663852886e38), x)
        hi: T | None = imp.scalar(n.get("max", 3.4028234663852886e38), x)
    else:
        lo = ins[1] if len(ins) > 1 else None
        hi = ins[2] if len(ins) > 2 else None
    y = x
    if lo is not None:
        y = imp.binary("max", y, lo)
    if hi is not None:
        y = imp.binary("min", y, hi)
    return [y]


@_op("LeakyRelu", "Elu", "Selu", "Celu", "ThresholdedRelu", "Softplus", "Softsign",
     "HardSigmoid", "HardSwish", "Mish", "Swish", "Gelu", "Shrink")
def _activation(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    imp.check_float(x, n.op_type)
    c = lambda v: imp.scalar(v, x)  # noqa: E731
    zero, one = c(0), c(1)
    t = n.op_type
    if t == "LeakyRelu":
        a = c(n.get("alpha", 0.01))
        return [imp.select(imp.cmp("lt", x, zero), imp.binary("mul", x, a), x)]
    if t == "Elu":
        a = c(n.get("alpha", 1.0))
        em1 = imp.binary("mul", imp.binary("sub", imp.unary("exp", x), one), a)
        return [imp.select(imp.cmp("lt", x, zero), em1, x)]
    if t == "Selu":
        a, g = c(n.get("alpha", 1.67326319217681884765625)), \
            c(n.get("gamma", 1.05070102214813232421875))
        neg = imp.binary("sub", imp.binary("mul", imp.unary("exp", x), a), a)
        return [imp.binary("mul", imp.select(imp.cmp("le", x, zero), neg, x), g)]
    if t == "Celu":
        a = c(n.get("alpha", 1.0))
        e = imp.binary("mul", imp.binary("sub", imp.unary("exp", imp.binary("div", x, a)),
                                          one), a)
        return [imp.binary("add", imp.binary("max", x, zero), imp.binary("min", e, zero))]
    if t == "ThresholdedRelu":
        a = c(n.get("alpha", 1.0))
        return [imp.select(imp.cmp("gt", x, a), x, zero)]
    if t == "Softplus":
        return [imp.unary("log", imp.binary("add", imp.unary("exp", x), one))]
    if t == "Softsign":
        return [imp.binary("div", x, imp.binary("add", imp.unary("abs", x), one))]
    if t in ("HardSigmoid", "HardSwish"):
        a = c(n.get("alpha", 0.2) if t == "HardSigmoid" else 1 / 6)
        b = c(n.get("beta", 0.5) if t == "HardSigmoid" else 0.5)
        hs = imp.binary("max", zero, imp.binary("min", one, imp.binary(
            "add", imp.binary("mul", x, a), b)))
        return [hs if t == "HardSigmoid" else imp.binary("mul", x, hs)]
    if t == "Mish":
        sp = imp.unary("log", imp.binary("add", imp.unary("exp", x), one))
        return [imp.binary("mul", x, imp.unary("tanh", sp))]
    if t == "Swish":
        a = c(n.get("alpha", 1.0))
        return [imp.binary("mul", x, imp.unary("sigmoid", imp.binary("mul", x, a)))]
    if t == "Shrink":
        lambd, bias = c(n.get("lambd", 0.5)), c(n.get("bias", 0.0))
        inner = imp.select(imp.cmp("gt", x, lambd), imp.binary("sub", x, bias), zero)
        return [imp.select(imp.cmp("lt", x, imp.unary("neg", lambd)),
                           imp.binary("add", x, bias), inner)]
    approximate = n.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise imp.error(f"Gelu approximate='{approximate}' is not 'none' or 'tanh'")
    return [imp.p.gelu(imp.value(x), approximate)]


@_op("PRelu")
def _prelu(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x, slope = ins
    zero = imp.scalar(0, x)
    return [imp.select(imp.cmp("lt", x, zero), imp.binary("mul", x, slope), x)]


# -- matmul
@_op("MatMul")
def _matmul(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    return [imp.matmul(ins[0], ins[1])]


@_op("Gemm")
def _gemm(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    if imp.rank(a) != 2 or imp.rank(b) != 2:
        raise imp.error("Gemm needs rank-2 A and B")
    if int(n.get("transA", 0)):
        a = imp.transpose(a, (1, 0))
    if int(n.get("transB", 0)):
        b = imp.transpose(b, (1, 0))
    y = imp.matmul(a, b)
    alpha, beta = float(n.get("alpha", 1.0)), float(n.get("beta", 1.0))
    if alpha != 1.0:
        y = imp.binary("mul", y, imp.scalar(alpha, y))
    if c is not None:
        if beta != 1.0:
            c = imp.binary("mul", c, imp.scalar(beta, c))
        y = imp.binary("add", y, c)
    return [y]


# -- layout
@_op("Transpose")
def _transpose(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    r = imp.rank(ins[0])
    perm = n.get("perm", list(range(r))[::-1])
    if sorted(int(p) for p in perm) != list(range(r)):
        raise imp.error(f"perm {list(perm)} is not a permutation of rank {r}")
    return [imp.transpose(ins[0], perm)]


@_op("Reshape")
def _reshape(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    if imp.opset < 5:
        target = [int(d) for d in n.get("shape", [])]
    else:
        target = [int(d) for d in imp.const(ins[1], "a 'shape' input").reshape(-1)]
    allowzero = int(n.get("allowzero", 0))
    src = imp.shape(x)
    dims: list[int | None] = []
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            if i >= len(src):
                raise imp.error(f"shape {target} copies dim {i} of a rank-{len(src)} tensor")
            dims.append(src[i])
        elif d == -1:
            dims.append(-1)
        elif d < 0:
            raise imp.error(f"shape {target} has a negative dim")
        else:
            dims.append(d)
    if dims.count(-1) > 1:
        raise imp.error(f"shape {target} has more than one -1")
    if -1 in dims:
        total, known = _prod(src), _prod([d for d in dims if d != -1])
        if total is not None and known is not None:
            if known == 0 or total % known:
                raise imp.error(f"cannot reshape {list(src)} to {target}")
            dims[dims.index(-1)] = total // known
        else:
            dims[dims.index(-1)] = None
    return [imp.reshape(x, dims)]


def _axes_input(imp: _Importer, n: _Node, ins: list[T], since: int) -> list[int] | None:
    """``axes``: an attribute before opset ``since``, an (optional) input from it."""
    if imp.opset < since:
        axes = n.get("axes")
        return None if axes is None else [int(a) for a in axes]
    if len(ins) < 2 or ins[1] is None:
        return None
    return [int(a) for a in imp.const(ins[1], "the 'axes' input").reshape(-1)]


@_op("Squeeze")
def _squeeze(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    s = imp.shape(x)
    axes = _axes_input(imp, n, ins, 13)
    if axes is None:
        if None in s:
            raise imp.unsupported("Squeeze without axes of a tensor with unknown dims")
        axes = [i for i, d in enumerate(s) if d == 1]
    axes = imp.norm_axes(axes, len(s))
    for a in axes:
        if s[a] not in (1, None):
            raise imp.error(f"cannot squeeze axis {a} of size {s[a]}")
    return [imp.reshape(x, [d for i, d in enumerate(s) if i not in axes])]


@_op("Unsqueeze")
def _unsqueeze(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    s = list(imp.shape(x))
    axes = _axes_input(imp, n, ins, 13)
    if axes is None:
        raise imp.error("needs axes")
    out_rank = len(s) + len(axes)
    axes = imp.norm_axes(axes, out_rank)
    if len(set(axes)) != len(axes):
        raise imp.error(f"axes {axes} repeat")
    it = iter(s)
    dims = [1 if i in axes else next(it) for i in range(out_rank)]
    return [imp.reshape(x, dims)]


@_op("Flatten")
def _flatten(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    s = imp.shape(x)
    axis = int(n.get("axis", 1))
    if axis < 0:
        axis += len(s)
    if not 0 <= axis <= len(s):
        raise imp.error(f"axis {n.get('axis')} is out of range for rank {len(s)}")
    return [imp.reshape(x, (_prod(s[:axis]), _prod(s[axis:])))]


@_op("Expand")
def _expand(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    target = [int(d) for d in imp.const(ins[1], "a 'shape' input").reshape(-1)]
    return [imp.broadcast_to(x, _broadcast_dims(imp, imp.shape(x), target))]


@_op("Tile")
def _tile(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    reps = [int(r) for r in imp.const(ins[1], "a 'repeats' input").reshape(-1)]
    s = imp.shape(x)
    if len(reps) != len(s):
        raise imp.error(f"repeats {reps} do not match rank {len(s)}")
    if _is_const(x):
        return [np.tile(x, reps)]
    inter = [d for pair in ((1, d) for d in s) for d in pair]
    wide = [d for pair in ((r, d) for r, d in zip(reps, s)) for d in pair]
    y = imp.broadcast_to(imp.reshape(x, inter), wide)
    return [imp.reshape(y, [None if d is None else r * d for r, d in zip(reps, s)])]


@_op("DepthToSpace", "SpaceToDepth")
def _depth_space(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    s = imp.shape(x)
    if len(s) != 4 or None in s:
        raise imp.unsupported(f"{n.op_type} of {list(s)} (needs a static rank-4 tensor)")
    b = int(n.get("blocksize"))
    nb, c, h, w = (int(d) for d in s if d is not None)
    if n.op_type == "SpaceToDepth":
        y = imp.reshape(x, (nb, c, h // b, b, w // b, b))
        crd = n.get("mode", "DCR") == "CRD"  # SpaceToDepth has a mode from opset 28
        y = imp.transpose(y, (0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4))
        return [imp.reshape(y, (nb, c * b * b, h // b, w // b))]
    if n.get("mode", "DCR") == "DCR":
        y = imp.reshape(x, (nb, b, b, c // (b * b), h, w))
        y = imp.transpose(y, (0, 3, 4, 1, 5, 2))
    else:
        y = imp.reshape(x, (nb, c // (b * b), b, b, h, w))
        y = imp.transpose(y, (0, 1, 4, 2, 5, 3))
    return [imp.reshape(y, (nb, c // (b * b), h * b, w * b))]


@_op("Trilu")
def _trilu(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    s = imp.shape(x)
    k = int(imp.const(ins[1], "the 'k' input").reshape(-1)[0]) if len(ins) > 1 and \
        ins[1] is not None else 0
    if len(s) < 2 or s[-1] is None or s[-2] is None:
        raise imp.unsupported("Trilu needs static last two dims")
    ones = np.ones(tuple(int(d) for d in s[-2:] if d is not None), dtype=np.bool_)
    mask = np.triu(ones, k) if int(n.get("upper", 1)) else np.tril(ones, k)
    if _is_const(x):
        return [np.where(mask, x, 0).astype(x.dtype)]
    return [imp.select(mask, x, imp.scalar(0, x))]


# -- shape computations (fold only, unless noted)
@_op("Constant")
def _constant(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    if "value" in n.attrs:
        return [imp.tensor_value(n.attrs["value"])]
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        if key in n.attrs:
            return [np.array(n.attrs[key], dtype=dtype)]
    raise imp.unsupported(f"Constant with attribute {sorted(n.attrs)}")


@_op("ConstantOfShape")
def _constant_of_shape(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    shape = [int(d) for d in imp.const(ins[0], "a 'shape' input").reshape(-1)]
    value = imp.tensor_value(n.attrs["value"]).reshape(-1) if "value" in n.attrs \
        else np.zeros(1, np.float32)
    return [np.full(shape, value[0], dtype=value.dtype)]


@_op("Shape")
def _shape(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    s = imp.shape(ins[0])
    r = len(s)
    start, end = int(n.get("start", 0)), n.get("end")
    end = r if end is None else int(end)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    dims = s[start:end]
    if None in dims:
        raise imp.unsupported("Shape of a tensor with unknown dims (bind the input shapes)")
    return [np.array(dims, dtype=np.int64)]


@_op("Size")
def _size(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    total = _prod(imp.shape(ins[0]))
    if total is None:
        raise imp.unsupported("Size of a tensor with unknown dims (bind the input shapes)")
    return [np.array(total, dtype=np.int64)]


@_op("Concat")
def _concat(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    xs = [x for x in ins if x is not None]
    if not xs:
        raise imp.error("needs at least one input")
    axis = imp.norm_axes([int(n.get("axis", 0))], imp.rank(xs[0]))[0]
    if all(_is_const(x) for x in xs):
        return [np.concatenate(xs, axis=axis)]
    el = next(imp.el(x) for x in xs if not _is_const(x))
    vs = [imp.value(x, el) for x in xs if imp.shape(x)[axis] != 0]
    if len(vs) == 1:
        return [vs[0]]
    return [imp.p.op("concat", vs, {"axis": IntegerAttr(axis)})]


def _ints_attr(values: Sequence[int]) -> DenseArrayAttr:
    return DenseArrayAttr(tuple(int(v) for v in values))


def _static(imp: _Importer, x: T, what: str) -> tuple[int, ...]:
    s = imp.shape(x)
    if None in s:
        raise imp.unsupported(f"{what} of a tensor with unknown dims (bind the input shapes)")
    return tuple(int(d) for d in s)  # type: ignore[arg-type]


def _slice_value(imp: _Importer, x: T, starts: Sequence[int], sizes: Sequence[int],
                 steps: Sequence[int]) -> T:
    """``x`` sliced per dim (``starts``, ``sizes``, ``steps`` already clamped)."""
    shape = imp.shape(x)
    if list(starts) == [0] * len(shape) and all(st == 1 for st in steps) and \
            tuple(sizes) == shape:
        return x
    if _is_const(x):
        index = tuple(st + sp * np.arange(sz) for st, sz, sp in zip(starts, sizes, steps))
        return np.array(x[np.ix_(*index)]) if x.ndim else x
    return imp.p.op("slice", [x], {"starts": _ints_attr(starts), "sizes": _ints_attr(sizes),
                                   "steps": _ints_attr(steps)})


@_op("Gather")
def _gather(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    data, idx = ins
    axis = imp.norm_axes([int(n.get("axis", 0))], imp.rank(data))[0]
    if _is_const(data) and _is_const(idx):
        dim = data.shape[axis]
        return [np.take(data, np.where(idx < 0, idx + dim, idx), axis=axis)]
    if imp.el(idx) not in ("i32", "i64", "i8", "i16"):
        raise imp.unsupported(f"Gather with {imp.el(idx)} indices")
    return [imp.p.op("gather", [imp.value(data), imp.value(idx)], {"axis": IntegerAttr(axis)})]


@_op("GatherElements")
def _gather_elements(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    data, idx = ins
    axis = imp.norm_axes([int(n.get("axis", 0))], imp.rank(data))[0]
    if _is_const(data) and _is_const(idx):
        dim = data.shape[axis]
        return [np.take_along_axis(data, np.where(idx < 0, idx + dim, idx), axis=axis)]
    return [imp.p.op("gather_elements", [imp.value(data), imp.value(idx)],
                     {"axis": IntegerAttr(axis)})]


@_op("Slice")
def _slice(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    data = ins[0]
    if imp.opset < 10:
        starts, ends = n.get("starts"), n.get("ends")
        axes, steps = n.get("axes"), None
    else:
        starts = imp.const(ins[1], "'starts'").tolist()
        ends = imp.const(ins[2], "'ends'").tolist()
        axes = imp.const(ins[3], "'axes'").tolist() if len(ins) > 3 and ins[3] is not None \
            else None
        steps = imp.const(ins[4], "'steps'").tolist() if len(ins) > 4 and ins[4] is not None \
            else None
    shape = _static(imp, data, "Slice")
    r = len(shape)
    axes = list(range(len(starts))) if axes is None else imp.norm_axes(axes, r)
    steps = [1] * len(starts) if steps is None else steps
    first, sizes, step = [0] * r, list(shape), [1] * r
    for a, st, e, sp in zip(axes, starts, ends, steps):
        sp = int(sp)
        if sp == 0:
            raise imp.error("Slice steps must be nonzero")
        rng = range(shape[a])[slice(int(st), int(e), sp)]
        first[a], sizes[a], step[a] = (rng.start if len(rng) else 0), len(rng), sp
    return [_slice_value(imp, data, first, sizes, step)]


@_op("Split")
def _split(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    shape = _static(imp, x, "Split")
    axis = imp.norm_axes([int(n.get("axis", 0))], len(shape))[0]
    dim = shape[axis]
    if imp.opset < 13:
        split = n.get("split")
    else:
        split = imp.const(ins[1], "'split'").tolist() if len(ins) > 1 and ins[1] is not None \
            else None
    if split is None:
        parts = int(n.get("num_outputs", len(n.outputs)))
        chunk = -(-dim // parts)
        split = [min(chunk, dim - k * chunk) for k in range(parts)]
    if sum(int(s) for s in split) != dim or any(int(s) < 0 for s in split):
        raise imp.error(f"split {list(split)} does not sum to dim {dim}")
    outs, off = [], 0
    for size in split:
        first = [0] * len(shape)
        sizes = list(shape)
        first[axis], sizes[axis] = off, int(size)
        outs.append(_slice_value(imp, x, first, sizes, [1] * len(shape)))
        off += int(size)
    return outs


@_op("Pad")
def _pad(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    shape = _static(imp, x, "Pad")
    r = len(shape)
    mode = n.get("mode", "constant")
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise imp.error(f"Pad mode '{mode}' is not constant, edge, reflect or wrap")
    if imp.opset < 11:
        pads = [int(p) for p in n.get("pads", n.get("paddings", []))]
        value: T = imp.scalar(float(n.get("value", 0.0)), x)
        axes = list(range(r))
    else:
        pads = [int(p) for p in imp.const(ins[1], "'pads'").reshape(-1)]
        value = ins[2] if len(ins) > 2 and ins[2] is not None else imp.scalar(0, x)
        axes = imp.norm_axes(imp.const(ins[3], "'axes'").reshape(-1).tolist(), r) \
            if len(ins) > 3 and ins[3] is not None else list(range(r))
    if len(pads) != 2 * len(axes):
        raise imp.error(f"pads {pads} need two values per axis ({len(axes)} axes)")
    low, high = [0] * r, [0] * r
    for k, a in enumerate(axes):
        low[a], high[a] = pads[k], pads[k + len(axes)]
    v = imp.reshape(value, ())
    return [imp.p.op("pad", [imp.value(x), imp.value(v, imp.el(x))],
                     {"low": _ints_attr(low), "high": _ints_attr(high),
                      "mode": StringAttr(mode)})]


@_op("ArgMax", "ArgMin")
def _argmax(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    shape = _static(imp, x, n.op_type)
    r = len(shape)
    axis = imp.norm_axes([int(n.get("axis", 0))], r)[0]
    keep = bool(int(n.get("keepdims", 1)))
    last = bool(int(n.get("select_last_index", 0)))
    dim = shape[axis]
    if _is_const(x):
        f = np.argmax if n.op_type == "ArgMax" else np.argmin
        y = dim - 1 - f(np.flip(x, axis), axis=axis) if last else f(x, axis=axis)
        y = np.asarray(y, dtype=np.int64)
        return [np.expand_dims(y, axis) if keep else y]
    # the first (last) position holding the extreme value; a NaN is the extreme (NumPy)
    m = imp.reduce("max" if n.op_type == "ArgMax" else "min", x, [axis], True)
    hit = imp.cmp("eq", x, m)
    if imp.el(x) in ("f32", "f16", "bf16", "f64"):
        hit = imp.select(imp.cmp("ne", x, x), np.array(True), hit)
    iota = np.arange(dim, dtype=np.int64).reshape([dim if i == axis else 1 for i in range(r)])
    miss = np.array(-1 if last else dim, dtype=np.int64)
    pos = imp.select(hit, iota, miss)
    return [imp.reduce("max" if last else "min", pos, [axis], keep)]


@_op("Range")
def _range(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    start, limit, delta = (imp.const(x, "constant start, limit and delta") for x in ins)
    return [np.arange(start.item(), limit.item(), delta.item()).astype(start.dtype)]


@_op("EyeLike")
def _eye_like(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    s = imp.shape(ins[0])
    if len(s) != 2 or None in s:
        raise imp.unsupported("EyeLike of a tensor without a static rank-2 shape")
    from onnx import helper

    dtype = helper.tensor_dtype_to_np_dtype(int(n.get("dtype"))) if "dtype" in n.attrs \
        else (ins[0].dtype if _is_const(ins[0]) else None)
    el = ELEMENTS.get(int(n.get("dtype", 0))) if "dtype" in n.attrs else imp.el(ins[0])
    eye = np.eye(s[0], s[1], k=int(n.get("k", 0)))  # type: ignore[arg-type]
    if dtype is not None and el is None:
        return [eye.astype(dtype)]
    return [imp.cast(eye.astype(np.float32), el or "f32")]


@_op("OneHot")
def _one_hot(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    idx, depth, values = ins
    d = int(imp.const(depth, "a constant 'depth'").reshape(-1)[0])
    vals = imp.const(values, "constant 'values'")
    r = imp.rank(idx) + 1
    axis = int(n.get("axis", -1)) % r
    s = list(imp.shape(idx))
    idx = imp.select(imp.cmp("lt", idx, imp.scalar(0, idx)), imp.binary(
        "add", idx, imp.scalar(d, idx)), idx)
    expanded = imp.reshape(idx, s[:axis] + [1] + s[axis:])
    ar = np.arange(d).reshape([d if i == axis else 1 for i in range(r)])
    hot = imp.cmp("eq", expanded, imp.cast(ar, imp.el(idx)))
    return [imp.select(hot, vals[1], vals[0])]


# -- reductions, normalizations
_REDUCE_AXES_INPUT_SINCE = {"ReduceSum": 13}


@_op("ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceL1", "ReduceL2",
     "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
def _reduce(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    r = imp.rank(x)
    axes = _axes_input(imp, n, ins, _REDUCE_AXES_INPUT_SINCE.get(n.op_type, 18))
    keep = bool(int(n.get("keepdims", 1)))
    if not axes:
        if int(n.get("noop_with_empty_axes", 0)):
            return [x]
        axes = list(range(r))
    axes = imp.norm_axes(axes, r)
    t = n.op_type
    if t in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean"):
        return [imp.reduce(t[6:].lower(), x, axes, keep)]
    if t == "ReduceL1":
        return [imp.reduce("sum", imp.unary("abs", x), axes, keep)]
    if t in ("ReduceL2", "ReduceSumSquare"):
        s = imp.reduce("sum", imp.binary("mul", x, x), axes, keep)
        return [imp.unary("sqrt", s) if t == "ReduceL2" else s]
    if t == "ReduceLogSum":
        return [imp.unary("log", imp.reduce("sum", x, axes, keep))]
    m = imp.reduce("max", x, axes, True)
    s = imp.reduce("sum", imp.unary("exp", imp.binary("sub", x, m)), axes, True)
    y = imp.binary("add", imp.unary("log", s), m)
    return [y if keep else imp.reshape(y, imp.reduced_shape(x, axes, False))]


@_op("Softmax", "LogSoftmax")
def _softmax(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    s = imp.shape(x)
    r = len(s)
    axis = int(n.get("axis", -1 if imp.opset >= 13 else 1))
    axis = imp.norm_axes([axis], r)[0] if r else 0
    coerce = imp.opset < 13 and axis != r - 1
    if coerce:  # before opset 13: flatten to 2-D at axis, normalize over the second dim
        outer, inner = _prod(s[:axis]), _prod(s[axis:])
        if inner is None:
            raise imp.unsupported(f"{n.op_type} (opset < 13) over unknown dims")
        x = imp.reshape(x, (outer, inner))
        axis = 1
    if n.op_type == "Softmax":
        y = imp.p.softmax(imp.value(x), axis)
    else:
        imp.check_float(x, n.op_type)
        d = imp.binary("sub", x, imp.reduce("max", x, [axis], True))
        y = imp.binary("sub", d, imp.unary("log", imp.reduce("sum", imp.unary("exp", d),
                                                              [axis], True)))
    return [imp.reshape(y, s) if coerce else y]


@_op("LayerNormalization")
def _layernorm(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    s = imp.shape(x)
    axis = imp.norm_axes([int(n.get("axis", -1))], len(s))[0]
    eps = float(n.get("epsilon", 1e-5))
    norm = s[axis:]
    scale = imp.broadcast_to(scale, norm)
    bias = imp.broadcast_to(bias if bias is not None else imp.scalar(0, x), norm)
    sx, sb = imp.pair(scale, bias)
    y = imp.p.layernorm(imp.value(x), sx, sb, axis, eps)
    axes = list(range(axis, len(s)))
    mean = imp.reduce("mean", x, axes, True)
    d = imp.binary("sub", x, mean)
    var = imp.reduce("mean", imp.binary("mul", d, d), axes, True)
    inv = imp.unary("rsqrt", imp.binary("add", var, imp.scalar(eps, var)))
    return [y, mean, inv]


@_op("RMSNormalization")
def _rmsnorm(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x, scale = ins[0], ins[1]
    s = imp.shape(x)
    axis = imp.norm_axes([int(n.get("axis", -1))], len(s))[0]
    scale = imp.value(imp.broadcast_to(scale, s[axis:]), imp.el(x))
    return [imp.p.rmsnorm(imp.value(x), scale, axis, float(n.get("epsilon", 1e-5)))]


def _per_channel(imp: _Importer, p: T, x: T) -> T:
    r = imp.rank(x)
    return imp.reshape(p, (imp.shape(p)[0],) + (1,) * (r - 2))


@_op("BatchNormalization")
def _batchnorm(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    if int(n.get("training_mode", 0)) or imp.opset < 6:
        raise imp.unsupported("BatchNormalization in training mode (or before opset 6)")
    x, scale, b, mean, var = ins[:5]
    eps = imp.scalar(float(n.get("epsilon", 1e-5)), x)
    scale, b, mean, var = (_per_channel(imp, p, x) for p in (scale, b, mean, var))
    inv = imp.binary("div", scale, imp.unary("sqrt", imp.binary("add", var, eps)))
    return [imp.binary("add", imp.binary("mul", imp.binary("sub", x, mean), inv), b)]


@_op("InstanceNormalization")
def _instancenorm(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x, scale, b = ins
    axes = list(range(2, imp.rank(x)))
    eps = imp.scalar(float(n.get("epsilon", 1e-5)), x)
    mean = imp.reduce("mean", x, axes, True)
    d = imp.binary("sub", x, mean)
    var = imp.reduce("mean", imp.binary("mul", d, d), axes, True)
    y = imp.binary("mul", d, imp.unary("rsqrt", imp.binary("add", var, eps)))
    return [imp.binary("add", imp.binary("mul", y, _per_channel(imp, scale, x)),
                       _per_channel(imp, b, x))]


@_op("LpNormalization")
def _lpnorm(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    axis = imp.norm_axes([int(n.get("axis", -1))], imp.rank(x))
    p = int(n.get("p", 2))
    if p == 1:
        norm = imp.reduce("sum", imp.unary("abs", x), axis, True)
    elif p == 2:
        norm = imp.unary("sqrt", imp.reduce("sum", imp.binary("mul", x, x), axis, True))
    else:
        raise imp.error(f"p must be 1 or 2, got {p}")
    return [imp.binary("div", x, norm)]


@_op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(imp: _Importer, n: _Node, ins: list[T]) -> list[T]:
    x = ins[0]
    kind = "mean" if n.op_type == "GlobalAveragePool" else "max"
    return [imp.reduce(kind, x, list(range(2, imp.rank(x))), True)]


# ----------------------------------------------------------- what does not map

NO_MAPPING = "no mapping onto today's semantic ops"
UNSUPPORTED = {
    **{op: "needs a convolution/pooling semantic op" for op in (
        "Conv", "ConvTranspose", "ConvInteger", "DeformConv", "AveragePool", "MaxPool",
        "LpPool", "MaxUnpool", "QLinearConv", "Col2Im", "CausalConvWithState")},
    **{op: "needs a gather/scatter/index semantic op" for op in (
        "GatherND", "ScatterElements", "ScatterND", "Scatter",
        "TensorScatter", "NonZero", "Compress", "Unique", "TopK",
        "Hardmax", "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss")},
    **{op: "needs a data-movement semantic op (slice, concat, pad, resize)" for op in (
        "Resize", "Upsample", "CenterCropPad", "ReverseSequence",
        "GridSample", "AffineGrid", "RoiAlign")},
    **{op: "needs control flow or sequences" for op in (
        "If", "Loop", "Scan", "SequenceMap", "SequenceEmpty", "SequenceLength",
        "SequenceInsert", "SplitToSequence", "OptionalHasElement", "OptionalGetElement")},
    **{op: "needs integer bit ops" for op in (
        "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "BitCast")},
    **{op: "needs int8/uint8 or float8 dtypes" for op in (
        "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearMatMul",
        "MatMulInteger")},
    **{op: "needs a scan (cumulative) semantic op" for op in ("CumSum", "CumProd")},
    **{op: "needs strings" for op in ("StringSplit", "StringNormalizer", "StringConcat",
                                       "RegexFullMatch", "TfIdfVectorizer", "LabelEncoder")},
    **{op: "needs random numbers" for op in ("Bernoulli", "RandomUniformLike",
                                              "RandomNormalLike", "RandomUniform",
                                              "RandomNormal", "Multinomial")},
    **{op: "needs recurrence (control flow)" for op in ("GRU", "LSTM", "RNN")},
    "ReduceProd": "needs a reduce_prod semantic op",
    "Round": "needs a round-half-to-even semantic op",
    "Acos": "needs an inverse trigonometric semantic op",
    "Asin": "needs an inverse trigonometric semantic op",
    "Atan": "needs an inverse trigonometric semantic op",
    "Einsum": "needs general contractions (einsum) beyond matmul",
    "Det": "needs a determinant semantic op",
}

SHAPE_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Tile": (1,),
    "ConstantOfShape": (0,), "Range": (0, 1, 2), "Slice": (1, 2, 3, 4), "OneHot": (1, 2),
    "Trilu": (1,), "Gather": (1,), "Split": (1,), "Pad": (1, 3),
    **{op: (1,) for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceL1",
                           "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
}
"""Input positions that must be known at import time (bound from input values when given)."""

FOLD_THROUGH = frozenset({
    "Cast", "Concat", "Gather", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Identity",
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Where", "Neg", "Abs", "Range",
    "ConstantOfShape", "Expand", "Mod", "Less", "Greater", "Not", "And", "Or",
})
"""Ops through which a shape-only input may flow and still fold."""




def import_onnx_with_inputs(path: str, arrays: Sequence[np.ndarray]) \
        -> tuple[SemanticModule, list[np.ndarray]]:
    """Import the model at ``path`` for a run on ``arrays`` (one per graph input, in order).

    Integer inputs that only feed shape operands are bound from their values,
    every other input's shape binds its ``?`` dims; returns the module and the
    arrays of the inputs that stayed function arguments, in argument order.
    """
    onnx = _onnx()
    try:
        model = onnx.load(path)
    except Exception as e:
        raise FrontendError(f"cannot read ONNX model {path}: {type(e).__name__}") from None
    names = _argument_names(model)
    if len(arrays) != len(names):
        raise FrontendError(f"{path}: the model has {len(names)} graph input(s) "
                            f"({', '.join(names)}), got {len(arrays)} --input")
    by_name = dict(zip(names, arrays))
    sm = import_onnx(model, file=path, input_values=by_name,
                     input_shapes={n: a.shape for n, a in by_name.items()})
    return sm, [by_name[n] for n in sm.meta["onnx_arguments"]]

__all__ = ["ELEMENTS", "OPS", "UNSUPPORTED", "import_onnx", "import_onnx_with_inputs"]
