"""Differential testing: random semantic programs, compiled for the host, against NumPy.

The oracle here is written independently of :mod:`accy.reference`: it reads
the generator's own op list (not the IR), computes every op in float64 with
NumPy and rounds it to the op's element type (bf16 with its own bit
arithmetic). A compiled result must agree within a dtype-aware tolerance:

- NaN exactly where the oracle has NaN, ±inf exactly where it has ±inf;
- elsewhere ``|got - want| <= 2·eps·max(|want|, scale) + spread``, where
  ``eps`` is the output dtype's unit roundoff, ``scale`` the magnitude of the terms that summed into the value (so a
  cancelling sum is judged against its terms), and ``spread`` how far the
  oracle itself moves when every op's result is nudged by two ulps (so an
  ill-conditioned value — a near-cancellation, a comparison of near-equal
  computed values — gets the slack its conditioning needs, and no more).
  Where the nudged oracles disagree on NaN/inf, that element is not judged.

Discontinuous ops (``floor``, ``cmp``, float→int ``cast``) read only program
arguments, whose values both sides see exactly. Each program batches several
ops (one cc compile per program). The seed rotates daily and is printed;
``ACCY_DIFF_SEED`` and ``ACCY_DIFF_PROGRAMS`` override it and the count. A
failure prints the program, minimised to the first failing output's cone.
"""

from __future__ import annotations

import datetime
import math
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

FLOATS = ("f32", "f16", "bf16")
EPS = {"f32": 2.0 ** -23, "f16": 2.0 ** -10, "bf16": 2.0 ** -7}
UNARY = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "erf", "sin",
         "cos", "reciprocal", "gelu", "gelu_tanh")
BINARY = ("add", "sub", "mul", "div", "max", "min", "pow")
REDUCE = ("reduce_sum", "reduce_max", "reduce_min", "reduce_mean")
PROFILES = ("plain", "special", "half", "bf16", "int")


# ------------------------------------------------------------------ rounding


def round_bf16(x: np.ndarray) -> np.ndarray:
    """Nearest bfloat16 (ties to even), as float32; NaN and ±inf pass through."""
    with np.errstate(all="ignore"):
        f = np.asarray(x, dtype=np.float64).astype(np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = r.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(f), f, out)


def to_dtype(x: Any, el: str) -> np.ndarray:
    """Round a float64/int64/bool array to the storage of ``el`` (bf16 as float32)."""
    x = np.asarray(x)
    with np.errstate(all="ignore"):
        if el == "f32":
            return x.astype(np.float32)
        if el == "f16":
            return x.astype(np.float16)
        if el == "bf16":
            return round_bf16(x)
        if el == "i1":
            return x.astype(bool)
        return x.astype({"i32": np.int32, "i64": np.int64}[el])


# ------------------------------------------------------------------ programs


@dataclass
class Node:
    """One value of a generated program: an argument, a constant or an op."""

    op: str
    args: tuple[int, ...]
    shape: tuple[int, ...]
    el: str
    attrs: dict[str, Any] = field(default_factory=dict)
    exact: bool = False
    """Seen identically by both sides (arguments, constants, ops of them that are exact)."""


@dataclass
class Case:
    """A generated program: its values, which it returns, its inputs and run options."""

    nodes: list[Node]
    outputs: list[int]
    inputs: list[np.ndarray]
    options: tuple[str, ...] = ()

    def cone(self, outputs: list[int]) -> Case:
        """The same program returning only ``outputs`` (every argument is kept)."""
        return Case(self.nodes, outputs, self.inputs, self.options)


def _shape(rng: np.random.Generator, profile: str) -> tuple[int, ...]:
    rank = int(rng.choice([0, 1, 2, 2, 3]))
    dims = [int(rng.choice([1, 2, 3, 4, 5, 7, 8, 16])) for _ in range(rank)]
    if rank and rng.random() < 0.05:
        dims[int(rng.integers(rank))] = 0
    return tuple(dims)


def _values(rng: np.random.Generator, shape: tuple[int, ...], el: str, profile: str) \
        -> np.ndarray:
    if el == "i1":
        return rng.random(shape) < 0.5
    if el in ("i32", "i64"):
        return rng.integers(-50, 50, shape).astype(np.int32 if el == "i32" else np.int64)
    x = rng.standard_normal(shape) * float(rng.choice([0.5, 1.0, 3.0]))
    if profile == "special" and x.size:
        pick = rng.random(shape)
        x = np.where(pick < 0.08, np.nan, x)
        x = np.where((pick >= 0.08) & (pick < 0.13), np.inf, x)
        x = np.where((pick >= 0.13) & (pick < 0.18), -np.inf, x)
        x = np.where((pick >= 0.18) & (pick < 0.22), 0.0, x)
    if profile in ("half", "bf16") and x.size and rng.random() < 0.3:
        x = x * float(rng.choice([100.0, 300.0, 3000.0]))  # f16-hostile magnitudes
    return to_dtype(x, el) if el != "bf16" else round_bf16(x)


def _broadcastable(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against ``shape``: a suffix with some dims set to 1."""
    keep = int(rng.integers(0, len(shape) + 1))
    sub = list(shape[len(shape) - keep:])
    return tuple(1 if rng.random() < 0.3 else d for d in sub)


def generate(rng: np.random.Generator, n_ops: int = 6) -> Case:
    """A random program of about ``n_ops`` ops, batched over several outputs."""
    profile = str(rng.choice(PROFILES))
    el = {"plain": "f32", "special": str(rng.choice(FLOATS)), "half": "f16", "bf16": "bf16",
          "int": "f32"}[profile]
    nodes: list[Node] = []
    inputs: list[np.ndarray] = []

    def arg(shape: tuple[int, ...], e: str = el) -> int:
        nodes.append(Node("arg", (), shape, e, exact=True))
        inputs.append(_values(rng, shape, e, profile))
        return len(nodes) - 1

    def add(op: str, args: tuple[int, ...], shape: tuple[int, ...], e: str,
            exact: bool = False, **attrs: Any) -> int:
        nodes.append(Node(op, args, shape, e, attrs, exact))
        return len(nodes) - 1

    arg(_shape(rng, profile))
    if profile == "int":
        a = arg(nodes[0].shape, "i32")
        b = arg(_broadcastable(rng, nodes[0].shape), "i32")
        for op in rng.choice(["add", "sub", "mul", "max", "min"], 3):
            shape = np.broadcast_shapes(nodes[a].shape, nodes[b].shape)
            a = add(str(op), (a, b), shape, "i32", exact=True)
        add("neg", (a,), nodes[a].shape, "i32", exact=True)
        r = int(len(nodes[a].shape))
        if r:
            add("reduce_max", (a,), nodes[a].shape[:-1], "i32", exact=True, axes=(r - 1,),
                keepdims=False)
    for _ in range(n_ops):
        floats = [i for i, n in enumerate(nodes) if n.el == el]
        x = int(rng.choice(floats))
        nx = nodes[x]
        kind = rng.random()
        if kind < 0.3:
            op = str(rng.choice(UNARY))
            add(op, (x,), nx.shape, el)
        elif kind < 0.55:
            op = str(rng.choice(BINARY))
            r = rng.random()
            if r < 0.4:
                y = arg(_broadcastable(rng, nx.shape))
            elif r < 0.6:
                value = float(rng.choice([-3.0, -0.5, 0.0, 2.0, np.nan, -np.inf]))
                y = add("constant", (), (), el, exact=True, value=value)
                if rng.random() < 0.5:
                    y = add("neg", (y,), (), el, exact=True)
            else:
                same = [i for i in floats if nodes[i].shape == nx.shape]
                y = int(rng.choice(same))
            if rng.random() < 0.5:
                x, y = y, x
            add(op, (x, y), np.broadcast_shapes(nodes[x].shape, nodes[y].shape), el)
        elif kind < 0.7 and nx.shape:
            op = str(rng.choice(REDUCE))
            r = len(nx.shape)
            axes = tuple(sorted(rng.choice(r, int(rng.integers(1, r + 1)), replace=False)))
            keep = bool(rng.random() < 0.5)
            shape = tuple(1 if i in axes else d for i, d in enumerate(nx.shape)) if keep else \
                tuple(d for i, d in enumerate(nx.shape) if i not in axes)
            add(op, (x,), shape, el, axes=tuple(int(a) for a in axes), keepdims=keep)
        elif kind < 0.82 and nx.shape:
            op = str(rng.choice(["softmax", "layernorm", "rmsnorm"]))
            r = len(nx.shape)
            axis = int(rng.integers(-r, r)) if op == "softmax" else int(rng.integers(0, r))
            params = []
            if op != "softmax":
                params = [arg(nx.shape[axis:]) for _ in range(2 if op == "layernorm" else 1)]
            add(op, (x, *params), nx.shape, el, axis=axis)
        elif kind < 0.88 and len(nx.shape) >= 2:
            k = nx.shape[-1]
            w = arg((k, int(rng.choice([1, 3, 4]))))
            add("matmul", (x, w), (*nx.shape[:-1], nodes[w].shape[-1]), el)
        elif kind < 0.94 and nx.shape:
            perm = tuple(int(p) for p in rng.permutation(len(nx.shape)))
            t = add("transpose", (x,), tuple(nx.shape[p] for p in perm), el, perm=perm)
            add("reshape", (t,), (math.prod(nx.shape),), el)
        else:
            # discontinuous ops read arguments only: both sides see them exactly
            src = int(rng.choice([i for i, n in enumerate(nodes) if n.op == "arg"
                                  and n.el == el]))
            s = nodes[src]
            other = arg(s.shape)
            pred = str(rng.choice(["lt", "le", "gt", "ge", "eq", "ne"]))
            c = add("cmp", (src, other), s.shape, "i1", exact=True, predicate=pred)
            add("select", (c, src, other), s.shape, el, exact=True)
            add("floor", (src,), s.shape, el, exact=True)
            add("cast", (src,), s.shape, "i32", exact=True)
            wide = "f32" if el != "f32" else str(rng.choice(["f16", "bf16"]))
            add("cast", (src,), s.shape, wide, exact=True)
    used = {a for n in nodes for a in n.args}
    outputs = [i for i, n in enumerate(nodes) if n.op not in ("arg", "constant")
               and (i not in used or rng.random() < 0.3)]
    options = ("contract.fold_constants=false",) if rng.random() < 0.25 else ()
    if rng.random() < 0.25:
        options += ("dispatch.fuse=false",)
    return Case(nodes, outputs or [len(nodes) - 1], inputs, options)


# ------------------------------------------------------------------ building


def build(case: Case) -> Any:
    """The case as a verified :class:`SemanticModule` (through :mod:`accy.builder`)."""
    from accy.builder import Program

    p = Program()
    vals: list[Any] = []
    for n in case.nodes:
        a = [vals[i] for i in n.args]
        if n.op == "arg":
            v = p.arg(f"{'x'.join(map(str, n.shape))}{'x' if n.shape else ''}{n.el}")
        elif n.op == "constant":
            dtype = {"f32": np.float32, "f16": np.float16, "bf16": np.float32,
                     "i32": np.int32}[n.el]
            v = p.constant(np.array(n.attrs["value"], dtype=dtype)) if n.el != "bf16" else \
                p.cast(p.constant(np.array(n.attrs["value"], np.float32)), "bf16")
        elif n.op in ("gelu", "gelu_tanh"):
            v = p.gelu(a[0], "tanh" if n.op == "gelu_tanh" else "none")
        elif n.op in REDUCE:
            v = getattr(p, n.op)(a[0], list(n.attrs["axes"]), n.attrs["keepdims"])
        elif n.op == "softmax":
            v = p.softmax(a[0], n.attrs["axis"])
        elif n.op in ("layernorm", "rmsnorm"):
            v = getattr(p, n.op)(*a, axis=n.attrs["axis"])
        elif n.op == "transpose":
            v = p.transpose(a[0], n.attrs["perm"])
        elif n.op == "reshape":
            v = p.reshape(a[0], n.shape)
        elif n.op == "cmp":
            v = p.cmp(a[0], a[1], n.attrs["predicate"])
        elif n.op == "cast":
            v = p.cast(a[0], n.el)
        else:
            v = getattr(p, n.op)(*a)
        vals.append(v)
    p.ret(*[vals[i] for i in case.outputs])
    return p.build()


def compile_and_run(case: Case, target: str = "host") -> list[np.ndarray]:
    """Compile the case for ``target`` (the host: cc) and run it on its inputs."""
    from accy.executable.cache import FragmentCompilerCache
    from accy.preparation.options import RunOptions
    from accy.preparation.stages import PreparationRequest

    sm = build(case)
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(source="differential", options=RunOptions.parse(
            target, case.options), shapes={}))
    assert update.fragment is not None
    return [np.asarray(o) for o in update.fragment(*case.inputs)]


# ------------------------------------------------------------------ the oracle


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x) if x.size else x.astype(np.float64)


def _erfc(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erfc, otypes=[np.float64])(x) if x.size else x.astype(np.float64)


def _gelu(x: np.ndarray, tanh: bool) -> np.ndarray:
    # gelu's definitions, written so that their x ≪ 0 tails (tiny, not 0) do not cancel
    if tanh:
        u = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
        with np.errstate(over="ignore"):
            return x / (1.0 + np.exp(-2.0 * u))
    return 0.5 * x * _erfc(-x / math.sqrt(2.0))


F64_UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "relu": lambda x: np.maximum(x, 0.0),
    "erf": _erf, "sin": np.sin, "cos": np.cos, "reciprocal": lambda x: 1.0 / x,
    "floor": np.floor, "gelu": lambda x: _gelu(x, False), "gelu_tanh": lambda x: _gelu(x, True),
}
def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C99 ``pow`` elementwise (NumPy turns a scalar exponent 0.5 into sqrt: -inf → NaN)."""
    x, y = (np.atleast_1d(v).copy() for v in np.broadcast_arrays(a, b))
    return np.power(x, y).reshape(np.broadcast_shapes(a.shape, b.shape))


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Every product summed, so inf·0 is NaN (a BLAS may skip zero terms)."""
    return np.sum(a[..., :, :, None] * b[..., None, :, :], axis=-2)


F64_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
              "max": np.maximum, "min": np.minimum, "pow": _pow}
COMPOSITE = frozenset({"gelu", "gelu_tanh", "softmax", "layernorm", "rmsnorm"})
EMPTY = {"reduce_max": -np.inf, "reduce_min": np.inf}
"""Identities of empty float max/min reductions (NumPy raises; accy defines them)."""


def _reduce(op: str, x: np.ndarray, axes: tuple[int, ...], keep: bool, el: str) -> np.ndarray:
    if op == "reduce_sum":
        return np.sum(x, axis=axes, keepdims=keep)
    if op == "reduce_mean":
        return np.mean(x, axis=axes, keepdims=keep)
    fn = np.max if op == "reduce_max" else np.min
    if el in FLOATS:
        init = EMPTY[op]
    else:
        info = np.iinfo(np.int32)
        init = info.min if op == "reduce_max" else info.max
    return fn(x, axis=axes, keepdims=keep, initial=init)


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True, initial=-np.inf))
    return e / np.sum(e, axis=axis, keepdims=True)


def _norm(op: str, x: np.ndarray, params: list[np.ndarray], axis: int) -> np.ndarray:
    axes = tuple(range(axis, x.ndim))
    if op == "rmsnorm":
        return x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + 1e-5) * params[0]
    c = x - np.mean(x, axis=axes, keepdims=True)
    return c / np.sqrt(np.mean(c * c, axis=axes, keepdims=True) + 1e-5) * params[0] + params[1]


def _cast_to_int(x: np.ndarray) -> np.ndarray:
    """C-style float→i32: truncate, saturate, NaN → 0 (accy's documented convention)."""
    t = np.trunc(x)
    info = np.iinfo(np.int32)
    return np.where(np.isnan(t), 0, np.clip(np.nan_to_num(t), info.min, info.max))


def evaluate(case: Case, nudge: np.random.Generator | float | None = None) \
        -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every node's value (float64 / int64 / bool) and its term scale.

    With ``nudge``, every inexact float result is moved by 2 ulps of its dtype
    before rounding, up (``+1.0``), down (``-1.0``) or with a random sign per
    element (a generator): the spread between such runs is how sensitive the
    value is to rounding.
    """
    vals: list[np.ndarray] = []
    scales: list[np.ndarray] = []
    inputs = iter(case.inputs)
    for n in case.nodes:
        a = [vals[i] for i in n.args]
        sa = [scales[i] for i in n.args]
        scale = None
        with np.errstate(all="ignore"):
            if n.op == "arg":
                v = np.asarray(next(inputs))
                v = v.astype(np.float64) if v.dtype.kind == "f" else v
            elif n.op == "constant":
                v = np.asarray(n.attrs["value"], np.float64)
            elif n.op in F64_UNARY and n.el in FLOATS and a[0].dtype.kind == "f":
                v = F64_UNARY[n.op](a[0])
            elif n.op in F64_UNARY:  # integer neg/abs
                v = {"neg": np.negative, "abs": np.abs}[n.op](a[0].astype(np.int64))
            elif n.op in F64_BINARY:
                v = F64_BINARY[n.op](a[0], a[1])
                if n.op in ("add", "sub"):
                    scale = np.broadcast_to(np.maximum(sa[0], sa[1]), v.shape)
            elif n.op in REDUCE:
                v = _reduce(n.op, a[0], n.attrs["axes"], n.attrs["keepdims"], n.el)
                if n.op in ("reduce_sum", "reduce_mean"):
                    scale = np.sum(sa[0], axis=n.attrs["axes"], keepdims=n.attrs["keepdims"])
                    if n.op == "reduce_mean":
                        count = math.prod(a[0].shape[i] for i in n.attrs["axes"])
                        scale = scale / max(count, 1)
            elif n.op == "softmax":
                v = _softmax(a[0], n.attrs["axis"])
            elif n.op in ("layernorm", "rmsnorm"):
                v = _norm(n.op, a[0], a[1:], n.attrs["axis"])
            elif n.op == "matmul":
                v = _matmul(a[0], a[1])
                scale = _matmul(sa[0], sa[1])
            elif n.op == "transpose":
                v = np.transpose(a[0], n.attrs["perm"])
                scale = np.transpose(sa[0], n.attrs["perm"])
            elif n.op == "reshape":
                v = a[0].reshape(n.shape)
                scale = sa[0].reshape(n.shape)
            elif n.op == "cmp":
                fn = {"lt": np.less, "le": np.less_equal, "gt": np.greater,
                      "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal}
                v = fn[n.attrs["predicate"]](a[0], a[1])
            elif n.op == "select":
                v = np.where(a[0], a[1], a[2])
            elif n.op == "cast":
                v = _cast_to_int(a[0]) if n.el == "i32" else a[0]
            else:
                raise AssertionError(n.op)
            v = np.asarray(v)
            if n.op in COMPOSITE and n.el in FLOATS and a[0].size:
                # decomposed into f32 steps (for f16/bf16 too): an absolute error that
                # grows with the operand's magnitude (1 + erf(x) cancels for x << 0)
                big = float(np.max(np.abs(np.nan_to_num(a[0], nan=0.0, posinf=0.0,
                                                        neginf=0.0))))
                scale = np.full(v.shape, 16.0 * (1.0 + big) * EPS["f32"] / EPS[n.el])
            elif n.op in ("neg", "abs", "relu", "max", "min") and n.el in FLOATS:
                scale = np.broadcast_to(np.maximum.reduce([np.broadcast_to(x, v.shape)
                                                           for x in sa]), v.shape)
            if n.el in FLOATS:
                if nudge is not None and not n.exact and v.size:
                    size = np.abs(v) if scale is None else np.maximum(np.abs(v), scale / 4)
                    sign = nudge.choice([-1.0, 1.0], v.shape) if \
                        isinstance(nudge, np.random.Generator) else nudge
                    with np.errstate(invalid="ignore"):
                        v = v + 2.0 * EPS[n.el] * size * sign
                v = to_dtype(v, n.el).astype(np.float64)
            elif n.el == "i32":
                v = to_dtype(v, "i32").astype(np.int64)
            if scale is None:
                scale = np.abs(np.nan_to_num(v.astype(np.float64), nan=0.0, posinf=0.0,
                                             neginf=0.0))
            else:
                scale = np.nan_to_num(np.maximum(scale, np.abs(v.astype(np.float64))),
                                      nan=0.0, posinf=0.0, neginf=0.0)
        vals.append(v)
        scales.append(np.asarray(scale, np.float64))
    return vals, scales


def compare(case: Case, got: list[np.ndarray], seed: int = 0) -> list[str]:
    """What is wrong with ``got`` (one line per output that disagrees)."""
    want, scale = evaluate(case)
    nudged = [evaluate(case, how)[0] for how in
              (1.0, -1.0, np.random.default_rng(seed + 1), np.random.default_rng(seed + 2))]
    problems = []
    for k, (i, g) in enumerate(zip(case.outputs, got)):
        n = case.nodes[i]
        w = want[i]
        if g.shape != n.shape:
            problems.append(f"output {k} ({n.op}): shape {g.shape}, expected {n.shape}")
            continue
        if n.el not in FLOATS:
            bad = np.asarray(g).astype(np.int64) != w.astype(np.int64)
        else:
            g64 = np.asarray(g).astype(np.float64)
            others = [v[i] for v in nudged]
            w_nan, w_inf = np.isnan(w), np.isinf(w)
            unsure = np.zeros(w.shape, bool)
            for o in others:
                unsure |= (np.isnan(o) != w_nan) | (np.isinf(o) != w_inf) | \
                    (np.isinf(o) & w_inf & (np.sign(o) != np.sign(w)))
            finite = ~w_nan & ~w_inf
            spread = np.zeros(w.shape)
            for o in others:
                with np.errstate(invalid="ignore"):
                    spread = np.maximum(spread, np.where(finite & np.isfinite(o),
                                                         np.abs(o - w), 0.0))
            eps = EPS[n.el]
            tol = 2 * eps * np.maximum(np.abs(np.where(finite, w, 0.0)), scale[i]) + spread + \
                (1e-30 if n.el == "f32" else 1e-7)
            with np.errstate(invalid="ignore"):
                bad = np.where(w_nan, ~np.isnan(g64),
                               np.where(w_inf, g64 != w,
                                        ~(np.abs(g64 - w) <= tol)))
            bad &= ~unsure
        if bad.any():
            j = tuple(int(t) for t in np.argwhere(bad)[0])
            problems.append(f"output {k} ({n.op} {n.el}{list(n.shape)}): {int(bad.sum())} of "
                            f"{bad.size} wrong; at {j} got {np.asarray(g)[j]!r}, "
                            f"expected {w[j]!r}")
    return problems


def describe(case: Case) -> str:
    """The program as MLIR text, its inputs and options: a reproducer."""
    from accy.choir.printer import print_op

    text = print_op(build(case).module)
    ins = "\n".join(f"  input {i}: {np.array2string(x, threshold=64)}"
                    for i, x in enumerate(case.inputs))
    return f"options {case.options}\n{text}\n{ins}"


def minimise(case: Case, got: list[np.ndarray]) -> Case:
    """The case returning only its first wrong output (its cone of ops)."""
    for k, i in enumerate(case.outputs):
        single = case.cone([i])
        if compare(single, [got[k]]):
            return single
    return case


def run_case(case: Case, seed: int, target: str = "host") -> list[str]:
    """Compile and run ``case`` for ``target``; the problems found (with a reproducer),
    or []."""
    try:
        got = compile_and_run(case, target)
    except Exception as e:  # a crash is a finding too
        return [f"{type(e).__name__}: {e}\n{describe(case)}"]
    problems = compare(case, got, seed)
    if problems:
        small = minimise(case, got)
        return problems + [describe(small)]
    return []


def daily_seed() -> int:
    env = os.environ.get("ACCY_DIFF_SEED")
    return int(env) if env else int(datetime.date.today().strftime("%Y%m%d"))


# ------------------------------------------------------------------ tests


def test_random_programs_match_numpy() -> None:
    seed = daily_seed()
    count = int(os.environ.get("ACCY_DIFF_PROGRAMS", "250"))
    budget = float(os.environ.get("ACCY_DIFF_SECONDS", "45"))
    print(f"differential seed {seed} (ACCY_DIFF_SEED={seed} reproduces)")
    start = time.monotonic()
    failures = []
    done = 0
    for k in range(count):
        if time.monotonic() - start > budget:
            break
        rng = np.random.default_rng([seed, k])
        case = generate(rng)
        problems = run_case(case, seed + k)
        done += 1
        if problems:
            failures.append(f"program {k} (seed {seed}):\n" + "\n".join(problems))
    print(f"{done} programs, {len(failures)} wrong")
    assert done >= min(count, 50), f"only {done} programs ran within {budget} s"
    assert not failures, "\n\n".join(failures[:3])


# Minimised regressions: each failed before the numerics fixes (see the commit log).

def _case(nodes: list[Node], outputs: list[int], inputs: list[Any],
          options: tuple[str, ...] = ()) -> Case:
    return Case(nodes, outputs, [np.asarray(x) for x in inputs], options)


NAN = float("nan")


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_propagate_nan(op: str) -> None:
    x = np.array([NAN, 1.0, 2.0, -0.0], np.float32)
    y = np.array([0.0, NAN, 1.0, 0.0], np.float32)
    case = _case([Node("arg", (), (4,), "f32", exact=True), Node("arg", (), (4,), "f32", exact=True),
                  Node(op, (0, 1), (4,), "f32"), Node("relu", (0,), (4,), "f32")], [2, 3], [x, y])
    assert not compare(case, compile_and_run(case))


@pytest.mark.parametrize("op", ["reduce_max", "reduce_min"])
@pytest.mark.parametrize("el", ["f32", "f16", "bf16"])
def test_reductions_propagate_nan(op: str, el: str) -> None:
    x = to_dtype(np.array([[1.0, NAN, 3.0, 2.0] * 9, [1.0, 5.0, 3.0, 2.0] * 9]), el)
    case = _case([Node("arg", (), (2, 36), el, exact=True),
                  Node(op, (0,), (2,), el, {"axes": (1,), "keepdims": False})], [1], [x])
    got = compile_and_run(case)
    assert np.isnan(got[0][0]) and not np.isnan(got[0][1])
    assert not compare(case, got)


def test_f16_mean_does_not_overflow() -> None:
    case = _case([Node("arg", (), (4,), "f16", exact=True),
                  Node("reduce_mean", (0,), (), "f16", {"axes": (0,), "keepdims": False})],
                 [1], [np.full(4, 30000, np.float16)])
    got = compile_and_run(case)
    assert float(got[0]) == 30000.0
    assert not compare(case, got)


@pytest.mark.parametrize("el", ["f16", "bf16"])
@pytest.mark.parametrize("fuse", [True, False])
def test_half_norms_compute_in_f32(el: str, fuse: bool) -> None:
    rng = np.random.default_rng(7)
    x = to_dtype(np.concatenate([np.full((1, 16), 300.0), rng.standard_normal((2, 16)) * 300]),
                 el)
    g = to_dtype(np.ones(16), el)
    b = to_dtype(np.zeros(16), el)
    nodes = [Node("arg", (), (3, 16), el, exact=True), Node("arg", (), (16,), el, exact=True),
             Node("arg", (), (16,), el, exact=True),
             Node("rmsnorm", (0, 1), (3, 16), el, {"axis": 1}),
             Node("layernorm", (0, 1, 2), (3, 16), el, {"axis": 1}),
             Node("softmax", (0,), (3, 16), el, {"axis": 1}),
             Node("gelu", (0,), (3, 16), el)]
    case = _case(nodes, [3, 4, 5, 6], [x, g, b], () if fuse else ("dispatch.fuse=false",))
    got = compile_and_run(case)
    assert np.all(np.isfinite(got[1]))
    np.testing.assert_allclose(got[0][0].astype(np.float64), 1.0, rtol=1e-2)
    assert not compare(case, got)


@pytest.mark.parametrize("el", ["f32", "i32"])
def test_neg_of_a_negative_constant_compiles(el: str) -> None:
    dtype = np.float32 if el == "f32" else np.int32
    nodes = [Node("arg", (), (3,), el, exact=True),
             Node("constant", (), (), el, {"value": -3.0}, exact=True),
             Node("neg", (1,), (), el, exact=True), Node("add", (0, 2), (3,), el)]
    if el == "f32":
        nodes.append(Node("sigmoid", (1,), (), el))
        nodes.append(Node("add", (0, 4), (3,), el))
    case = _case(nodes, [3] + ([5] if el == "f32" else []), [np.ones(3, dtype)],
                 ("contract.fold_constants=false",))
    assert not compare(case, compile_and_run(case))


def test_empty_reductions_have_identities() -> None:
    nodes = [Node("arg", (), (3, 0), "i1", exact=True), Node("arg", (), (3, 0), "f32", exact=True),
             Node("reduce_max", (0,), (3,), "i1", {"axes": (1,), "keepdims": False}),
             Node("reduce_min", (0,), (3,), "i1", {"axes": (1,), "keepdims": False}),
             Node("reduce_max", (1,), (3,), "f32", {"axes": (1,), "keepdims": False}),
             Node("reduce_min", (1,), (3,), "f32", {"axes": (1,), "keepdims": False}),
             Node("reduce_sum", (1,), (3,), "f32", {"axes": (1,), "keepdims": False})]
    got = compile_and_run(_case(nodes, [2, 3, 4, 5, 6],
                                [np.zeros((3, 0), bool), np.zeros((3, 0), np.float32)]))
    assert got[0].tolist() == [False] * 3 and got[1].tolist() == [True] * 3
    assert got[2].tolist() == [-np.inf] * 3 and got[3].tolist() == [np.inf] * 3
    assert got[4].tolist() == [0.0] * 3


def test_oracle_rounds_bf16_like_the_hardware() -> None:
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even wins
    x = np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 3.4e38, NAN])
    got = round_bf16(x)
    bits = [struct.unpack("<I", struct.pack("<f", float(v)))[0] >> 16 for v in got[:3]]
    assert bits == [0x3F80, 0x3F82, 0x7F80] and np.isnan(got[3])


def test_the_oracle_catches_a_wrong_answer() -> None:
    case = _case([Node("arg", (), (4,), "f16", exact=True), Node("exp", (0,), (4,), "f16")], [1],
                 [np.ones(4, np.float16)])
    got = compile_and_run(case)
    assert not compare(case, got)
    wrong = got[0].copy()
    wrong[2] = np.float16(float(wrong[2]) * (1 + 8 * EPS["f16"]))
    assert compare(case, [wrong])
    wrong[2] = np.nan
    assert compare(case, [wrong])


@pytest.mark.parametrize("el", ["f16", "bf16"])
@pytest.mark.parametrize("producer", ["matmul", "reduce_sum"])
def test_half_results_round_before_fused_consumers(el: str, producer: str) -> None:
    # found by the generator: a matmul / reduction result typed f16 was read unrounded
    # (in f32) by the sin/cos fused after it; in f16, 6e4 + 6e4 is inf and cos(inf) NaN
    big = 60000.0 if el == "f16" else 3.0e38
    x = to_dtype(np.array([[big, big], [1.0, 2.0]]), el)
    w = to_dtype(np.array([[1.0], [1.0]]), el)
    if producer == "matmul":
        nodes = [Node("arg", (), (2, 2), el, exact=True), Node("arg", (), (2, 1), el, exact=True),
                 Node("matmul", (0, 1), (2, 1), el), Node("cos", (2,), (2, 1), el)]
        inputs = [x, w]
    else:
        nodes = [Node("arg", (), (2, 2), el, exact=True),
                 Node("reduce_sum", (0,), (2,), el, {"axes": (1,), "keepdims": False}),
                 Node("cos", (1,), (2,), el)]
        inputs = [x]
    case = _case(nodes, [len(nodes) - 1], inputs)
    got = compile_and_run(case)
    assert np.isnan(got[0].ravel()[0]) and np.isfinite(got[0].ravel()[1])
    assert not compare(case, got)


LAYERNORM_OF_GELU = '''"builtin.module"() ({
  "func.func"() <{function_type = (tensor<4x1xf32>, tensor<1xf32>, tensor<1xf32>) -> tensor<4x1xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<4x1xf32>, %g: tensor<1xf32>, %b: tensor<1xf32>):
    %0 = "semantic.gelu"(%x) {approximate = "none"} : (tensor<4x1xf32>) -> tensor<4x1xf32>
    %1 = "semantic.layernorm"(%0, %g, %b) {axis = 1 : i64, epsilon = 1.0e-05 : f32} : (tensor<4x1xf32>, tensor<1xf32>, tensor<1xf32>) -> tensor<4x1xf32>
    "func.return"(%1) : (tensor<4x1xf32>) -> ()
  }) : () -> ()
}) : () -> ()'''


@pytest.mark.parametrize("target", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_recomputed_producer_rounds_the_same_in_every_row_pass(target: str) -> None:
    """A row of one element normalises to exactly 0, so layernorm returns ``b``: the
    fused gelu, recomputed in the mean, variance and output passes, must round the
    same each time (found on the GPU: NVRTC contracted ``gelu - mean`` into an FMA)."""
    from accy.executable.cache import FragmentCompilerCache
    from accy.preparation.options import RunOptions
    from accy.preparation.products import SemanticModule
    from accy.preparation.stages import PreparationRequest

    sm = SemanticModule.from_text(LAYERNORM_OF_GELU)
    x = np.array([[-4.5684953], [0.74858356], [1.7999896], [2.3476424]], np.float32)
    g, b = np.array([1.2275333], np.float32), np.array([-0.33254504], np.float32)
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(source="ln", options=RunOptions.parse(target)))
    (y,) = update.fragment(x, g, b)
    np.testing.assert_array_equal(np.asarray(y), np.full((4, 1), b[0], np.float32))


def test_cuda_fragments_compile_without_implicit_contraction() -> None:
    from accy.preparation.options import Target

    assert "--fmad=false" in Target.parse("cuda:sm_90").backend.flags(fast_math=False)


TRANSPOSE_READ_TWICE = '''"builtin.module"() ({
  "func.func"() <{function_type = (tensor<7x7x4xf32>) -> (tensor<196xf32>, tensor<7x7x4xf32>), sym_name = "main"}> ({
  ^bb0(%x: tensor<7x7x4xf32>):
    %0 = "semantic.abs"(%x) : (tensor<7x7x4xf32>) -> tensor<7x7x4xf32>
    %1 = "semantic.transpose"(%0) {permutation = array<i64: 1, 0, 2>} : (tensor<7x7x4xf32>) -> tensor<7x7x4xf32>
    %2 = "semantic.reshape"(%1) : (tensor<7x7x4xf32>) -> tensor<196xf32>
    %3 = "semantic.neg"(%1) : (tensor<7x7x4xf32>) -> tensor<7x7x4xf32>
    "func.return"(%2, %3) : (tensor<196xf32>, tensor<7x7x4xf32>) -> ()
  }) : () -> ()
}) : () -> ()'''


def test_an_index_map_read_by_a_reshape_and_by_a_fused_op() -> None:
    """A transpose that a reshape reads (its own copy region) and a fused op reads too
    (cloned into the op's region) once made the regions depend on each other
    (programs 2003 of seed 20261201, 2112 and 2254 of 20261202)."""
    from accy.executable.cache import FragmentCompilerCache
    from accy.preparation.options import RunOptions
    from accy.preparation.products import SemanticModule
    from accy.preparation.stages import PreparationRequest

    x = np.random.default_rng(0).standard_normal((7, 7, 4)).astype(np.float32)
    update = FragmentCompilerCache().refresh_from_semantic_module(
        SemanticModule.from_text(TRANSPOSE_READ_TWICE),
        PreparationRequest(source="t", options=RunOptions()))
    a, b = update.fragment(x)
    t = np.abs(x).transpose(1, 0, 2)
    np.testing.assert_array_equal(a, t.reshape(196))
    np.testing.assert_array_equal(b, -t)
