"""CUDA C for ``cuda:sm_XX``: one self-contained translation unit.

NVRTC compiles it with nothing but ``-arch=sm_XX``: no includes (the few
helpers it needs are defined here; math functions and vector types are
NVRTC built-ins). The launch table travels in a comment at the end.

Kernels follow the kernel stage's plan: grid-stride elementwise loops with
16-byte vector loads and stores; one block (or warp) per row with inputs
cached in registers and warp-shuffle reduction trees; shared-memory tiled
matmul with the epilogue applied in registers.
"""

from __future__ import annotations

from accy.choir.ir import Value
from accy.dialects.kernel import KernelFuncOp
from accy.target.common import (
    COMPUTE,
    LANE,
    STORAGE,
    ExprBuilder,
    Scope,
    combine,
    decompose,
    elem_of,
    load_convert,
    reduce_init,
    round_compute,
    shape_of,
    store_convert,
    strides_of,
    translation_unit,
)

PRELUDE = r"""
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
__device__ __forceinline__ float accy_h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short accy_f2h(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float accy_d2f_odd(double x) {
  float f = __double2float_rz(x);
  return ((double)f != x && x == x) ? __uint_as_float(__float_as_uint(f) | 1u) : f;
}
__device__ __forceinline__ float accy_bf2f(unsigned short h) {
  return __uint_as_float(((unsigned int)h) << 16);
}
__device__ __forceinline__ unsigned short accy_f2bf(float f) {
  unsigned int x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u); return (unsigned short)(x >> 16);
}
__device__ __forceinline__ int accy_idiv_int(int a, int b) { return b == 0 ? 0 : a / b; }
__device__ __forceinline__ long long accy_idiv_ll(long long a, long long b) {
  return b == 0 ? 0 : a / b;
}
__device__ __forceinline__ unsigned long long accy_idiv_ull(unsigned long long a,
                                                            unsigned long long b) {
  return b == 0 ? 0 : a / b;
}
__device__ __forceinline__ unsigned long long accy_ipow_ull(unsigned long long a,
                                                            unsigned long long b) {
  unsigned long long r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r;
}
__device__ __forceinline__ int accy_ipow_int(int a, int b) {
  if (b < 0) return (a == 1) ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
  int r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r;
}
__device__ __forceinline__ long long accy_ipow_ll(long long a, long long b) {
  if (b < 0) return (a == 1) ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
  long long r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r;
}
"""

LANES = "xyzw"


def _params(k: KernelFuncOp) -> tuple[list[str], list[str], list[str]]:
    ins = [f"in{i}" for i in range(len(k.body.args))]
    outs = [f"out{i}" for i in range(len(k.body.terminator.operands))]  # type: ignore[union-attr]
    aliased = set(k.plan.aliased_params)

    def qual(i: int) -> str:  # pointers that share memory are not restrict
        return "" if i in aliased else " __restrict__"

    params = [f"const {STORAGE[elem_of(a)]}*{qual(i)} {n}"
              for i, (a, n) in enumerate(zip(k.body.args, ins))]
    params += [f"{STORAGE[elem_of(v)]}*{qual(len(ins) + i)} {n}"
               for i, (v, n) in enumerate(zip(k.body.terminator.operands, outs))]  # type: ignore[union-attr]
    return ins, outs, params


class _Vectorizer:
    """Vector loads for inputs read along a unit stride (one per base offset)."""

    def __init__(self, builder_ref: list[ExprBuilder], vec: int, scope_ref: list[Scope]) -> None:
        self.b = builder_ref
        self.vec = vec
        self.scope_ref = scope_ref
        self.loaded: dict[tuple[int, str], str] = {}
        self.args: list[Value] = []

    def __call__(self, k: int, idx: tuple[str, ...], lane: int) -> str | None:
        if self.vec == 1 or not any(LANE in i for i in idx):
            return None
        arg = self.args[k]
        if elem_of(arg) != "f32":
            return None
        shape = shape_of(arg)
        st = strides_of(shape)
        lane_stride = sum(s for s, i, n in zip(st, idx, shape) if LANE in i and n != 1)
        if lane_stride != 1:
            return None
        if any(s % self.vec for s, i, n in zip(st, idx, shape)
               if n != 1 and i != "0" and LANE not in i):
            return None
        b = self.b[0]
        base = b.offset(shape, tuple(i.replace("+" + LANE, "") for i in idx), 0)
        key = (k, base)
        if key not in self.loaded:
            name = b.fresh("v")
            self.scope_ref[0].lines.append(
                f"const float{self.vec} {name} = __ldg(reinterpret_cast<const "
                f"float{self.vec}*>"
                f"({b.inputs[k]} + ({base})));")
            self.loaded[key] = name
        return f"{self.loaded[key]}.{LANES[lane]}"


def emit_elementwise(k: KernelFuncOp, fast_math: bool) -> tuple[str, list[str]]:
    ins, outs, params = _params(k)
    plan = k.plan
    shape = plan.iteration
    vec = plan.vector_width
    n = 1
    for d in shape:
        n *= d
    scope = Scope([])
    vz = _Vectorizer([], vec, [scope])
    b = ExprBuilder(ins, cuda=True, prefix=k.sym_name, load_hook=vz, fast_math=fast_math)
    vz.b.append(b)
    vz.args = list(k.body.args)
    pre, names = decompose("i", shape, "d") if shape else ([], ())
    body: list[str] = []
    yields = k.body.terminator.operands  # type: ignore[union-attr]
    if vec > 1:
        idx = tuple(names[:-1]) + (f"{names[-1]}+{LANE}",)
    else:
        idx = tuple(names)
    for oi, v in enumerate(yields):
        el = elem_of(v)
        lanes = [b.expr(v, idx, scope, lane) for lane in range(vec)]
        if vec > 1:
            body.append(f"*reinterpret_cast<float{vec}*>({outs[oi]} + i) = "
                        f"make_float{vec}({', '.join(lanes)});")
        else:
            body.append(f"{outs[oi]}[i] = {store_convert(lanes[0], el)};")
    text = "\n".join([
        f"extern \"C\" __global__ void __launch_bounds__({plan.block[0]}) "
        f"{k.sym_name}({', '.join(params)}) {{",
        f"  const long long n = {n // vec}LL;",
        "  for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < n;"
        " g += (long long)gridDim.x * blockDim.x) {",
        f"    const long long i = g * {vec};",
        *("    " + line for line in pre),
        *("    " + line for line in scope.lines),
        *("    " + line for line in body),
        "  }",
        "}",
    ])
    return text, b.tables


def _shuffle_tree(kind: str, acc: str, ct: str) -> str:
    """A warp's butterfly reduction of ``acc`` (every lane ends with the result)."""
    shfl = f"__shfl_xor_sync(0xffffffffu, {acc}, o)"
    if kind == "sum":
        return f"for (int o = 16; o > 0; o >>= 1) {acc} = {combine(kind, acc, shfl, ct)};"
    # max/min read their operand twice, and a shuffle under a ?: would run on only some
    # lanes: shuffle once on every lane, then combine
    return (f"for (int o = 16; o > 0; o >>= 1) {{ const {ct} s = {shfl}; "
            f"{acc} = {combine(kind, acc, 's', ct)}; }}")


def emit_rows(k: KernelFuncOp, fast_math: bool) -> tuple[str, list[str]]:
    ins, outs, params = _params(k)
    plan = k.plan
    shape = plan.iteration
    rows, cols = plan.rows, plan.cols
    vec = plan.vector_width
    items = plan.items
    warp = plan.mapping == "warp-per-row"
    rpb = plan.rows_per_block
    tpr = 32 if warp else plan.block[0]
    cached = set(plan.cached_inputs)
    lines: list[str] = []
    head = [f"extern \"C\" __global__ void __launch_bounds__({plan.block[0]}) "
            f"{k.sym_name}({', '.join(params)}) {{"]
    if warp:
        head += [f"  const long long row = (long long)blockIdx.x * {rpb} + (threadIdx.x >> 5);",
                 "  const int t = threadIdx.x & 31;",
                 f"  if (row >= {rows}LL) return;"]
    else:
        head += ["  const long long row = blockIdx.x;", "  const int t = threadIdx.x;",
                 "  __shared__ double accy_sh[32];"]
    pre, rnames = decompose("row", shape[:-1], "r") if len(shape) > 1 else ([], ())
    head += ["  " + p for p in pre]
    col = f"c+{LANE}" if vec > 1 else "c"
    ident = tuple(rnames) + (col,)
    # registers for cached inputs
    regs: dict[int, str] = {}
    outer = Scope(lines)
    scope_ref = [outer]
    vz = _Vectorizer([], vec, scope_ref)

    def hook(kidx: int, idx: tuple[str, ...], lane: int) -> str | None:
        if kidx in regs and idx == ident:
            return f"{regs[kidx]}[j]" if vec == 1 else f"{regs[kidx]}[j].{LANES[lane]}"
        return vz(kidx, idx, lane)

    b = ExprBuilder(ins, cuda=True, prefix=k.sym_name, load_hook=hook, fast_math=fast_math)
    vz.b.append(b)
    vz.args = list(k.body.args)

    def column_loop(emit_lanes) -> None:  # type: ignore[no-untyped-def]
        lines.append("#pragma unroll")
        lines.append(f"for (int j = 0; j < {items}; ++j) {{")
        lines.append(f"  const int c = (j * {tpr} + t) * {vec};")
        guard = cols % (tpr * vec) != 0
        if guard:
            lines.append(f"  if (c < {cols}) {{")
        inner = Scope([], parent=outer)
        scope_ref[0] = inner
        vz.loaded = {}
        emit_lanes(inner)
        scope_ref[0] = outer
        pad = "    " if guard else "  "
        lines.extend(pad + s for s in inner.lines)
        if guard:
            lines.append("  }")
        lines.append("}")

    for kidx in sorted(cached):
        arg = k.body.args[kidx]
        name = f"reg{kidx}"
        regs[kidx] = name
        if vec > 1:
            lines.append(f"float{vec} {name}[{items}];")
        else:
            lines.append(f"{COMPUTE[elem_of(arg)]} {name}[{items}];")

    if regs:
        def load_regs(inner: Scope) -> None:
            for kidx, name in regs.items():
                arg = k.body.args[kidx]
                off = b.offset(shape_of(arg), tuple(rnames) + ("c",), 0)
                if vec > 1:
                    inner.lines.append(f"{name}[j] = __ldg(reinterpret_cast<const float{vec}*>"
                                       f"({ins[kidx]} + ({off})));")
                else:
                    inner.lines.append(f"{name}[j] = {load_convert(f'{ins[kidx]}[{off}]', elem_of(arg))};")
        column_loop(load_regs)

    for op in k.body.ops:
        if op.op_name != "prim.reduce":
            continue
        kind = op.attr("kind").value  # type: ignore[union-attr]
        el = elem_of(op.results[0])
        ct = COMPUTE[el]
        acc = b.fresh("acc")
        lines.append(f"{ct} {acc} = {reduce_init(kind, el)};")

        def accumulate(inner: Scope, op=op, acc=acc, kind=kind, ct=ct) -> None:  # type: ignore[no-untyped-def]
            for lane in range(vec):
                val = b.expr(op.operands[0], ident, inner, lane)
                inner.lines.append(f"{acc} = {combine(kind, acc, val, ct)};")
        column_loop(accumulate)
        # warp tree, then across warps through shared memory
        lines.append(_shuffle_tree(kind, acc, ct))
        if not warp:
            nw = tpr // 32
            lines += [f"if ((t & 31) == 0) accy_sh[t >> 5] = (double){acc};", "__syncthreads();",
                      f"{acc} = (t & 31) < {nw} ? ({ct})accy_sh[t & 31] : {reduce_init(kind, el)};",
                      _shuffle_tree(kind, acc, ct),
                      "__syncthreads();"]
        if el in ("f16", "bf16"):  # rounded before the ops fused after it read it
            name = b.fresh("red")
            lines.append(f"const {ct} {name} = {round_compute(acc, el)};")
            b.bound[op.results[0]] = name
        else:
            b.bound[op.results[0]] = acc

    yields = k.body.terminator.operands  # type: ignore[union-attr]
    full = [(i, v) for i, v in enumerate(yields) if shape_of(v) == shape]
    reduced = [(i, v) for i, v in enumerate(yields) if shape_of(v) != shape]

    if full:
        def write(inner: Scope) -> None:
            # every value first, then the stores: an output may be written in place
            # over an input that a later output still reads at this element
            computed = [(oi, v, [b.expr(v, ident, inner, lane) for lane in range(vec)])
                        for oi, v in full]
            for oi, v, vals in computed:
                el = elem_of(v)
                if vec > 1:
                    inner.lines.append(f"*reinterpret_cast<float{vec}*>({outs[oi]} + row * "
                                       f"{cols} + c) = make_float{vec}({', '.join(vals)});")
                else:
                    inner.lines.append(f"{outs[oi]}[row * {cols} + c] = "
                                       f"{store_convert(vals[0], el)};")
        column_loop(write)
    if reduced:
        red_scope = Scope([], parent=outer)
        ridx = tuple(rnames) + ("0",)
        stores = []
        for oi, v in reduced:
            val = b.expr(v, ridx, red_scope, 0)
            stores.append(f"{outs[oi]}[row] = {store_convert(val, elem_of(v))};")
        lines.append("if (t == 0) {")
        lines.extend("  " + s for s in red_scope.lines + stores)
        lines.append("}")
    text = "\n".join(head + ["  " + line for line in lines] + ["}"])
    return text, b.tables


def emit_matmul(k: KernelFuncOp, fast_math: bool) -> tuple[str, list[str]]:
    ins, outs, params = _params(k)
    plan = k.plan
    tm, tn, tk = plan.tile
    mm = next(op for op in k.body.ops if op.op_name == "prim.matmul")
    out_shape = shape_of(mm.results[0])
    batch_shape = out_shape[:-2]
    m_, n_ = out_shape[-2], out_shape[-1]
    k_ = shape_of(mm.operands[0])[-1]
    el = elem_of(mm.results[0])
    ct = COMPUTE[el]
    b = ExprBuilder(ins, cuda=True, prefix=k.sym_name, fast_math=fast_math)
    mt_m, mt_n = plan.micro_tile
    nx, ny = tn // mt_n, tm // mt_m
    lines = [f"extern \"C\" __global__ void __launch_bounds__({nx * ny}) "
             f"{k.sym_name}({', '.join(params)}) {{",
             f"  __shared__ {ct} As[{tk}][{tm + 1}];",
             f"  __shared__ {ct} Bs[{tk}][{tn + 4}];",
             "  const int tx = threadIdx.x, ty = threadIdx.y;",
             f"  const int tid = ty * {nx} + tx;",
             f"  const long long m0 = (long long)blockIdx.y * {tm}, n0 = (long long)blockIdx.x"
             f" * {tn};",
             "  const long long bz = blockIdx.z;"]
    pre, bnames = decompose("bz", batch_shape, "b") if batch_shape else ([], ())
    lines += ["  " + p for p in pre]
    lines += [f"  {ct} acc[{mt_m}][{mt_n}];",
              "  #pragma unroll",
              f"  for (int i = 0; i < {mt_m}; ++i) {{",
              "    #pragma unroll",
              f"    for (int jj = 0; jj < {mt_n}; ++jj) acc[i][jj] = 0;",
              "  }",
              f"  for (long long k0 = 0; k0 < {k_}; k0 += {tk}) {{"]
    sa = Scope([])
    a_val = b.expr(mm.operands[0], tuple(bnames) + ("m", "kk"), sa)
    sb = Scope([])
    b_val = b.expr(mm.operands[1], tuple(bnames) + ("kk", "n"), sb)
    lines += [f"    for (int e = tid; e < {tm * tk}; e += {nx * ny}) {{",
              f"      const int em = e / {tk}, ek = e % {tk};",
              "      const long long m = m0 + em, kk = k0 + ek;",
              f"      {ct} va = 0;",
              f"      if (m < {m_} && kk < {k_}) {{",
              *("        " + s for s in sa.lines),
              f"        va = {a_val};",
              "      }",
              "      As[ek][em] = va;",
              "    }",
              f"    for (int e = tid; e < {tk * tn}; e += {nx * ny}) {{",
              f"      const int ek = e / {tn}, en = e % {tn};",
              "      const long long kk = k0 + ek, n = n0 + en;",
              f"      {ct} vb = 0;",
              f"      if (kk < {k_} && n < {n_}) {{",
              *("        " + s for s in sb.lines),
              f"        vb = {b_val};",
              "      }",
              "      Bs[ek][en] = vb;",
              "    }",
              "    __syncthreads();",
              "    #pragma unroll",
              f"    for (int q = 0; q < {tk}; ++q) {{",
              f"      {ct} ra[{mt_m}], rb[{mt_n}];",
              "      #pragma unroll",
              f"      for (int i = 0; i < {mt_m}; ++i) ra[i] = As[q][ty + i * {ny}];",
              "      #pragma unroll",
              f"      for (int jj = 0; jj < {mt_n}; ++jj) rb[jj] = Bs[q][tx + jj * {nx}];",
              "      #pragma unroll",
              f"      for (int i = 0; i < {mt_m}; ++i) {{",
              "        #pragma unroll",
              f"        for (int jj = 0; jj < {mt_n}; ++jj) acc[i][jj] += ra[i] * rb[jj];",
              "      }",
              "    }",
              "    __syncthreads();",
              "  }"]
    yields = k.body.terminator.operands  # type: ignore[union-attr]
    ep = Scope([])
    b.bound[mm.results[0]] = "accv"
    idx = tuple(bnames) + ("m", "n")
    stores = []
    for oi, v in enumerate(yields):
        val = b.expr(v, idx, ep)
        off = b.offset(shape_of(v), idx, 0)
        stores.append(f"{outs[oi]}[{off}] = {store_convert(val, elem_of(v))};")
    lines += ["  #pragma unroll",
              f"  for (int i = 0; i < {mt_m}; ++i) {{",
              "    #pragma unroll",
              f"    for (int jj = 0; jj < {mt_n}; ++jj) {{",
              f"      const long long m = m0 + ty + i * {ny}, n = n0 + tx + jj * {nx};",
              f"      if (m < {m_} && n < {n_}) {{",
              f"        const {ct} accv = {round_compute('acc[i][jj]', el)};",
              *("        " + s for s in ep.lines + stores),
              "      }",
              "    }",
              "  }",
              "}"]
    return "\n".join(lines), b.tables


EMITTERS = {"elementwise": emit_elementwise, "rows": emit_rows, "matmul": emit_matmul}


def emit_kernels(kernels: list[KernelFuncOp], fast_math: bool = False) -> str:
    """The translation unit for ``kernels`` (without the launch-table comment)."""
    return translation_unit(
        ["// generated by accy: CUDA C, compile with -arch=sm_XX only", PRELUDE], kernels,
        lambda k: EMITTERS[k.plan.kind](k, fast_math))
