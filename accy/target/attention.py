"""Attention kernels: the ``attention`` kind for the host (C) and CUDA renderers.

An attention kernel's body is the chain ``softmax(q·kᵀ·c)·v``
(:mod:`accy.dialects.attention`); these emitters read its operands, extents and
scale back out of the body and spell the kernel the plan describes:

- host (``loop``): per query row, the scores (each a dot product summed in
  double, as the host matmul does), their max, the exponentials and their sum
  (double), then the probabilities' weighted sum of V's rows (double) — the
  unfused host kernels' arithmetic, without writing the scores;
- CUDA (``flash``): a block owns ``tile[0]`` query rows of one batch index, its
  Q tile in shared memory, and walks the keys in tiles of ``tile[1]``: K's and
  V's tiles are loaded into registers (the next tile's while the current one is
  used, ``stages`` 2) and stored to shared memory; each thread computes its
  ``micro_tile`` scores with float4 shared reads (rows ``ty·rows + r``, keys
  ``tx + 16·c``: the 16 threads of a row are one half-warp, so the row max is a
  ``__shfl_xor_sync`` tree), scales them, masks keys past the end with −inf,
  updates the running max, rescales its output accumulators and partial sums by
  ``exp(m_old − m_new)``, writes the probabilities transposed over K's tile and
  adds ``P·V``; at the end the partial sums are summed across the half-warp and
  the output rows divided by them, in one ``__noinline__`` helper a kernel.

NVRTC's time on this kernel (512×128×64) is its code's length, about half NVVM's
and half ptxas': the key loop's online softmax is most of it (40 ``expf`` and 64
max steps a tile at 8 rows × 4 keys), so what is not in the hot loops is spelled
once — guards the extents make always true are not spelled, the row ends
(divisions with their slow path, stores) are one helper, the max step one
instruction from sm_80 on.
"""

from __future__ import annotations

from accy.dialects.attention import AttentionMatch, match_in
from accy.dialects.kernel import ATTENTION_PAD, KernelFuncOp, attention_shared_floats
from accy.target.common import c_float, combine


def _match(k: KernelFuncOp) -> AttentionMatch:
    match = match_in(k.body.ops)
    assert match is not None, f"kernel {k.sym_name} holds no attention chain"
    yields = list(k.body.terminator.operands)  # type: ignore[union-attr]
    assert yields == [match.out], "an attention kernel writes its output only"
    return match


def _scaled(value: str, match: AttentionMatch) -> str:
    if match.scale is None:
        return value
    c = c_float(match.scale, "float")
    return f"({value} * {c})" if match.scale_op == "mul" else f"({value} / {c})"


def _offsets(match: AttentionMatch) -> dict[str, str]:
    """Row-major offsets of q[b, i, d], k[b, j, d], v[b, j, e], out[b, i, e] (batch ``b``
    linear: the batch dims of every operand are equal)."""
    m, n, d, dv = match.m, match.n, match.d, match.dv
    k_off = f"(b * {n}LL + j) * {d} + dd" if match.k_rows else f"(b * {d}LL + dd) * {n} + j"
    return {"q": f"(b * {m}LL + i) * {d} + dd", "k": k_off,
            "v": f"(b * {n}LL + j) * {dv} + e", "o": f"(b * {m}LL + i) * {dv} + e"}


# ------------------------------------------------------------------------- host C


def emit_attention_c(k: KernelFuncOp, ins: list[str], outs: list[str], lines: list[str]) \
        -> tuple[str, list[str]]:
    """The host kernel: a loop per query row (see the module docstring); ``lines`` is the
    function's opening (its pointer declarations), ``ins``/``outs`` their names."""
    match = _match(k)
    q, kk, v = (ins[match.arg_index(x)] for x in (match.q, match.k, match.v))
    o = outs[0]
    n, d, dv = match.n, match.d, match.dv
    off = _offsets(match)
    score = _scaled("(float)dot", match)
    lines += [f"  float* srow = (float*)malloc(sizeof(float) * {n});",
              f"  double* orow = (double*)malloc(sizeof(double) * {dv});",
              "  if (!srow || !orow) { free(srow); free(orow); return; }",
              f"  for (long long b = 0; b < {match.batch_size}LL; ++b) {{",
              f"    for (long long i = 0; i < {match.m}LL; ++i) {{",
              "      float mx = -INFINITY;",
              f"      for (long long j = 0; j < {n}LL; ++j) {{",
              "        double dot = 0;",
              f"        for (long long dd = 0; dd < {d}LL; ++dd) dot += (double){q}[{off['q']}]"
              f" * (double){kk}[{off['k']}];",
              f"        const float t = {score};",
              "        srow[j] = t;",
              f"        mx = {combine('max', 'mx', 't', 'float')};",
              "      }",
              "      double sum = 0;",
              f"      for (long long j = 0; j < {n}LL; ++j) {{",
              "        srow[j] = expf(srow[j] - mx);",
              "        sum += srow[j];",
              "      }",
              "      const float l = (float)sum;",
              f"      for (long long e = 0; e < {dv}LL; ++e) orow[e] = 0;",
              f"      for (long long j = 0; j < {n}LL; ++j) {{",
              "        const double p = (double)(srow[j] / l);",
              f"        for (long long e = 0; e < {dv}LL; ++e) orow[e] += p * (double){v}"
              f"[{off['v']}];",
              "      }",
              f"      for (long long e = 0; e < {dv}LL; ++e) {o}[{off['o']}] = (float)orow[e];",
              "    }",
              "  }",
              "  free(srow);",
              "  free(orow);",
              "}"]
    return "\n".join(lines), []


# --------------------------------------------------------------------------- CUDA


def _ceil4(x: int) -> int:
    return -(-x // 4) * 4


def _vec_type(n: int) -> str:
    return {1: "float", 2: "float2", 4: "float4"}[n]


_LANES = "xyzw"


def _guarded(inside: list[str], value: str, zero: str) -> str:
    """``value`` where every condition of ``inside`` holds, else ``zero``; ``value`` itself
    where there is none (the tile lies inside the operand: no guard for NVRTC to spell)."""
    return f"({' && '.join(inside)}) ? {value} : {zero}" if inside else value


class _Flash:
    """The pieces of one ``flash`` kernel (:func:`emit_attention_cuda`)."""

    def __init__(self, k: KernelFuncOp, ins: list[str], outs: list[str], params: list[str],
                 fast_math: bool) -> None:
        self.k = k
        self.match = match = _match(k)
        plan = k.plan
        self.bm, self.bn, _ = plan.tile
        self.rm, self.rn = plan.micro_tile
        self.threads = plan.block[0]
        self.vec = plan.vector_width
        self.prefetch = plan.stages == 2
        self.params = params
        self.q, self.kin, self.v = (ins[match.arg_index(x)] for x in (match.q, match.k, match.v))
        self.o = outs[0]
        self.m, self.n, self.d, self.dv = match.m, match.n, match.d, match.dv
        self.dp, self.dvp = _ceil4(self.d), _ceil4(self.dv)
        self.lq = self.dp + ATTENTION_PAD
        self.lp = self.bm + ATTENTION_PAD
        self.groups = -(-self.dvp // 64)  # 64 output columns a group (16 threads × 4)
        self.exp = "__expf" if fast_math else "expf"
        qf, kf, vf = attention_shared_floats(self.bm, self.bn, self.d, self.dv)
        assert 4 * (qf + kf + vf) == plan.dynamic_shared, "the plan sized the tiles"
        self.k_floats, self.q_floats = kf, qf
        self.mt = -(-self.m // self.bm)
        self.tiles = -(-self.n // self.bn)

    # ------------------------------------------------------------ tile loads
    def tile_loads(self) -> tuple[list[str], list[str], list[str]]:
        """Declarations of the K/V staging registers, the statements that load tile
        ``kt`` into them and the ones that store them to shared memory."""
        t, bn, n = self.threads, self.bn, self.n
        decl: list[str] = []
        load: list[str] = []
        store: list[str] = []

        def chunked(name: str, src: str, rows_len: int, stride: int, width: int, dst: str,
                    dst_stride: int) -> None:
            """Rows ``n0 + r`` (r < bn) of ``src`` (``stride`` floats a row, ``rows_len``
            real columns, zero past them and past the last key), ``width`` floats a load."""
            cols = (_ceil4(rows_len) if width == 1 else rows_len) // width
            total = bn * cols
            per = -(-total // t)
            vt = _vec_type(width)
            zero = "make_float4(0.f, 0.f, 0.f, 0.f)" if width == 4 else "0.f"
            decl.append(f"{vt} {name}[{per}];")
            for i in range(per):
                guard_e = total % t != 0 and i == per - 1
                e = f"(tid + {i * t})"
                r, c = f"({e} / {cols})", f"({e} % {cols})"
                inside = [f"n0 + {r} < {n}"] if n % bn else []  # else r < bn: a key
                if width == 1 and _ceil4(rows_len) != rows_len:
                    inside.append(f"{c} < {rows_len}")
                if guard_e:
                    inside.append(f"{e} < {total}")
                ptr = f"{src} + (long long)(n0 + {r}) * {stride} + {c} * {width}"
                val = f"__ldg(reinterpret_cast<const float4*>({ptr}))" if width == 4 else \
                    f"__ldg({ptr})"
                load.append(f"{name}[{i}] = {_guarded(inside, val, zero)};")
                at = f"{dst}[{r} * {dst_stride} + {c} * {width}]"
                st = f"*reinterpret_cast<float4*>(&{at}) = {name}[{i}];" if width == 4 else \
                    f"{at} = {name}[{i}];"
                store.append(f"if ({e} < {total}) {st}" if guard_e else st)

        if self.match.k_rows:
            chunked("lk", "Kg", self.d, self.d, self.vec, "Ks", self.lq)
        else:  # K stored [D, N]: scalar loads along the keys (coalesced), stored transposed
            total = bn * self.dp
            per = -(-total // t)
            decl.append(f"float lk[{per}];")
            for i in range(per):
                e = f"(tid + {i * t})"
                dd, r = f"({e} / {bn})", f"({e} % {bn})"
                inside = ([f"n0 + {r} < {n}"] if n % bn else []) + \
                    ([f"{dd} < {self.d}"] if self.dp != self.d else [])
                if total % t != 0 and i == per - 1:
                    inside.append(f"{e} < {total}")
                val = f"__ldg(Kg + (long long){dd} * {n} + n0 + {r})"
                load.append(f"lk[{i}] = {_guarded(inside, val, '0.f')};")
                st = f"Ks[{r} * {self.lq} + {dd}] = lk[{i}];"
                store.append(f"if ({e} < {total}) {st}" if total % t else st)
        chunked("lv", "Vg", self.dv, self.dv, self.vec, "Vs", self.dvp)
        return decl, load, store

    def q_load(self) -> list[str]:
        """The block's Q tile into shared memory (zero past the last row and past D)."""
        t, bm, width = self.threads, self.bm, self.vec
        cols = self.dp // width
        total = bm * cols
        zero = "make_float4(0.f, 0.f, 0.f, 0.f)" if width == 4 else "0.f"
        inside = ([f"m0 + r < {self.m}"] if self.m % bm else []) + \
            ([f"c < {self.d}"] if width == 1 and self.dp != self.d else [])
        ptr = f"Qg + (long long)(m0 + r) * {self.d} + c * {width}"
        val = f"__ldg(reinterpret_cast<const float4*>({ptr}))" if width == 4 else f"__ldg({ptr})"
        at = f"Qs[r * {self.lq} + c * {width}]"
        st = f"*reinterpret_cast<float4*>(&{at})" if width == 4 else at
        # a count NVVM knows (each thread's share), unrolled by 4 as NVVM unrolled the
        # strided loop from tid: four loads in flight, without that loop's remainder
        guard = f"if (e < {total}) " if total % t else ""
        return ["#pragma unroll 4",
                f"for (int qi = 0; qi < {-(-total // t)}; ++qi) {{",
                f"  const int e = tid + qi * {t}, r = e / {cols}, c = e % {cols};",
                f"  {guard}{st} = {_guarded(inside, val, zero)};",
                "}"]

    # -------------------------------------------------------------- compute
    def scores(self) -> list[str]:
        """s[r][c] = Q[row r] · K[key c] over the (padded) head dim, float4 reads."""
        rm, rn, lq = self.rm, self.rn, self.lq
        fma = [f"s[r][c] = fmaf(qa[r].{ln}, kb[c].{ln}, s[r][c]);" for ln in _LANES]
        # the head-dim loop stays rolled: at 512×128×64 on the H200 that ran 5 % faster
        # than unrolling it by 2 (28.3 against 26.8 TFLOP/s) and NVRTC took less
        # (RESULTS.md, Kernels, seventh session)
        return ["#pragma unroll",
                f"for (int r = 0; r < {rm}; ++r)",
                "  #pragma unroll",
                f"  for (int c = 0; c < {rn}; ++c) s[r][c] = 0.f;",
                "#pragma unroll 1",
                f"for (int dd = 0; dd < {self.dp}; dd += 4) {{",
                f"  float4 qa[{rm}], kb[{rn}];",
                "  #pragma unroll",
                f"  for (int r = 0; r < {rm}; ++r) qa[r] = *reinterpret_cast<const float4*>("
                f"&Qs[(ty * {rm} + r) * {lq} + dd]);",
                "  #pragma unroll",
                f"  for (int c = 0; c < {rn}; ++c) kb[c] = *reinterpret_cast<const float4*>("
                f"&Ks[(tx + 16 * c) * {lq} + dd]);",
                "  #pragma unroll",
                f"  for (int r = 0; r < {rm}; ++r) {{",
                "    #pragma unroll",
                f"    for (int c = 0; c < {rn}; ++c) {{",
                *("      " + f for f in fma),
                "    }",
                "  }",
                "}"]

    def online_softmax(self) -> list[str]:
        """Scale, mask, the running max (a half-warp shuffle tree) and the rescaling of
        the accumulators; the scores become unnormalized probabilities."""
        rm, rn, n = self.rm, self.rn, self.n
        ragged = n % self.bn != 0
        # accy's NaN-propagating max, one max.NaN (accy.target.cuda.fminmax_helpers):
        # the scores only have the max subtracted in exp, where ±0 make no difference
        mx_step = "accy_fmaxf(mx, o_)"
        lines = ["#pragma unroll",
                 f"for (int r = 0; r < {rm}; ++r) {{",
                 "  #pragma unroll",
                 f"  for (int c = 0; c < {rn}; ++c) {{",
                 f"    float t_ = {_scaled('s[r][c]', self.match)};"]
        if ragged:
            lines.append(f"    if (n0 + tx + 16 * c >= {n}) t_ = -INFINITY;")
        lines += ["    s[r][c] = t_;",
                  "  }",
                  "  float mx = s[r][0];",
                  "  #pragma unroll",
                  f"  for (int c = 1; c < {rn}; ++c) {{ const float o_ = s[r][c]; "
                  f"mx = {mx_step}; }}",
                  "  #pragma unroll",
                  "  for (int o = 8; o > 0; o >>= 1) { const float o_ = "
                  f"__shfl_xor_sync(0xffffffffu, mx, o); mx = {mx_step}; }}",
                  f"  {{ const float o_ = m_run[r]; mx = {mx_step}; }}",
                  f"  const float alpha = {self.exp}(m_run[r] - mx);",
                  "  m_run[r] = mx;",
                  "  float ls = 0.f;",
                  "  #pragma unroll",
                  f"  for (int c = 0; c < {rn}; ++c) {{ s[r][c] = {self.exp}(s[r][c] - mx); "
                  "ls += s[r][c]; }",
                  "  l_run[r] = l_run[r] * alpha + ls;",
                  "  #pragma unroll",
                  f"  for (int x = 0; x < {4 * self.groups}; ++x) acc[r][x] *= alpha;",
                  "}"]
        return lines

    def write_p(self) -> list[str]:
        """The probabilities, transposed (``Ps[key][row]``), over K's tile."""
        rm, lp = self.rm, self.lp
        w = min(rm, 4)
        vt = _vec_type(w)
        lines = ["#pragma unroll", f"for (int c = 0; c < {self.rn}; ++c) {{"]
        for r0 in range(0, rm, w):
            if w == 1:
                val = f"s[{r0}][c]"
            else:
                val = f"make_{vt}({', '.join(f's[{r0 + i}][c]' for i in range(w))})"
            lines.append(f"  *reinterpret_cast<{vt}*>(&Ps[(tx + 16 * c) * {lp} + ty * {rm} + "
                         f"{r0}]) = {val};")
        lines.append("}")
        return lines

    def pv(self) -> list[str]:
        """acc[r][g·4 + x] += Σ_key P[key][row r] · V[key][g·64 + tx·4 + x]."""
        rm, lp, dvp = self.rm, self.lp, self.dvp
        w = min(rm, 4)
        vt = _vec_type(w)
        lines = ["#pragma unroll 4",
                 f"for (int j = 0; j < {self.bn}; ++j) {{",
                 f"  float pr[{rm}];"]
        for r0 in range(0, rm, w):
            lines.append(f"  {{ const {vt} p_ = *reinterpret_cast<const {vt}*>(&Ps[j * {lp} + "
                         f"ty * {rm} + {r0}]);")
            lines.append("    " + " ".join(
                f"pr[{r0 + i}] = p_{'.' + _LANES[i] if w > 1 else ''};" for i in range(w)) + " }")
        for g in range(self.groups):
            col = f"{g * 64} + tx * 4"
            guard = dvp % 64 != 0 and g == self.groups - 1
            ind = "    " if guard else "  "
            if guard:
                lines.append(f"  if ({col} < {dvp}) {{")
            lines.append(f"{ind}const float4 vb{g} = *reinterpret_cast<const float4*>(&Vs[j * "
                         f"{dvp} + {col}]);")
            lines.append(f"{ind}#pragma unroll")
            lines.append(f"{ind}for (int r = 0; r < {rm}; ++r) {{")
            lines += [f"{ind}  acc[r][{4 * g + x}] = fmaf(pr[r], vb{g}.{_LANES[x]}, "
                      f"acc[r][{4 * g + x}]);" for x in range(4)]
            lines.append(f"{ind}}}")
            if guard:
                lines.append("  }")
        lines.append("}")
        return lines

    def out_name(self) -> str:
        return f"{self.k.sym_name}_out"

    def live(self, col: str) -> str | None:
        """How many of the four output columns from ``col`` of row ``i`` the kernel writes
        (an expression), or None where every row and column is inside the output."""
        row = f"i < {self.m}" if self.m % self.bm else None
        if self.dv % 64 == 0:
            cols = None
        elif self.vec == 4:
            cols = f"{col} < {self.dv}"
        else:
            cols = f"{self.dv} - ({col}) < 4 ? {self.dv} - ({col}) : 4"
        if self.vec == 4:
            conds = [c for c in (row, cols) if c is not None]
            return f"({' && '.join(conds)}) ? 4 : 0" if conds else None
        if row is None:
            return cols
        return f"{row} ? {cols or 4} : 0"

    def out_helper(self) -> str:
        """The end of a row's four output columns: the row's partial sums summed across
        its half-warp, the columns divided by the sum and stored. Once a kernel, not
        inlined (``__noinline__``): its divisions, their slow path and the stores are
        code NVRTC would otherwise spell for every row and group after the key loop; one
        division, rolled over the four lanes, is the same ``a / l`` for each."""
        guarded = self.live("0") is not None
        head = f"__device__ __noinline__ void {self.out_name()}(float* dst, float4 a, float l" \
            + (", const int live)" if guarded else ")")
        lines = [head + " {",
                 "  #pragma unroll",
                 "  for (int o = 8; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);"]
        if guarded:
            lines.append("  if (live <= 0) return;")
        lines += ["  #pragma unroll 1",
                  "  for (int x = 0; x < 4; ++x) a = make_float4(a.y, a.z, a.w, a.x / l);"]
        if self.vec == 4:
            lines.append("  *reinterpret_cast<float4*>(dst) = a;")
        else:
            lines += [f"  {'if (live > ' + str(x) + ') ' if guarded and x else ''}dst[{x}] = "
                      f"a.{_LANES[x]};" for x in range(4)]
        return "\n".join([*lines, "}"])

    def finish(self) -> list[str]:
        """Each output row through :meth:`out_helper`, a call a group of 64 columns."""
        rm, dv = self.rm, self.dv
        lines = ["#pragma unroll",
                 f"for (int r = 0; r < {rm}; ++r) {{",
                 f"  const int i = m0 + ty * {rm} + r;"]
        for g in range(self.groups):
            col = f"{g * 64} + tx * 4"
            live = self.live(col)
            vals = ", ".join(f"acc[r][{4 * g + x}]" for x in range(4))
            lines.append(f"  {self.out_name()}(Og + (long long)i * {dv} + {col}, "
                         f"make_float4({vals}), l_run[r]{', ' + live if live else ''});")
        lines.append("}")
        return lines

    # ------------------------------------------------------------------ all
    def emit(self) -> str:
        t = self.threads
        decl, load, store = self.tile_loads()
        body = [
            "extern __shared__ __align__(16) float accy_smem[];",
            "float* Qs = accy_smem;",
            f"float* Ks = accy_smem + {self.q_floats};",
            "float* Ps = Ks;  // the probabilities reuse K's tile",
            f"float* Vs = Ks + {self.k_floats};",
            "const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;",
            f"const long long b = blockIdx.x / {self.mt};",
            f"const int m0 = (blockIdx.x % {self.mt}) * {self.bm};",
            f"const float* Qg = {self.q} + b * {self.m * self.d}LL;",
            f"const float* Kg = {self.kin} + b * {self.n * self.d}LL;",
            f"const float* Vg = {self.v} + b * {self.n * self.dv}LL;",
            f"float* Og = {self.o} + b * {self.m * self.dv}LL;",
            *self.q_load(),
            f"float s[{self.rm}][{self.rn}];",
            f"float acc[{self.rm}][{4 * self.groups}];",
            f"float m_run[{self.rm}], l_run[{self.rm}];",
            "#pragma unroll",
            f"for (int r = 0; r < {self.rm}; ++r) {{",
            "  m_run[r] = -INFINITY; l_run[r] = 0.f;",
            "  #pragma unroll",
            f"  for (int x = 0; x < {4 * self.groups}; ++x) acc[r][x] = 0.f;",
            "}",
            *decl,
        ]
        if self.prefetch:
            body += ["{", "  const int n0 = 0;", *("  " + x for x in load), "}"]
        body += ["#pragma unroll 1",
                 f"for (int kt = 0; kt < {self.tiles}; ++kt) {{",
                 f"  const int n0 = kt * {self.bn};",
                 "  if (kt > 0) __syncthreads();  // the last tile's P·V is done with Ps, Vs"]
        if not self.prefetch:
            body += ["  " + x for x in load]
        body += ["  " + x for x in store]
        body.append("  __syncthreads();")
        if self.prefetch:
            body += [f"  if (kt + 1 < {self.tiles}) {{",
                     f"    const int n0 = (kt + 1) * {self.bn};",
                     *("    " + x for x in load),
                     "  }"]
        body += ["  " + x for x in self.scores()]
        body += ["  " + x for x in self.online_softmax()]
        body.append("  __syncthreads();  // every thread is done reading Ks")
        body += ["  " + x for x in self.write_p()]
        body.append("  __syncthreads();")
        body += ["  " + x for x in self.pv()]
        body.append("}")
        body += self.finish()
        # two blocks an SM: at 256 threads, 128 registers a thread
        head = (f"extern \"C\" __global__ void __launch_bounds__({t}, 2) "
                f"{self.k.sym_name}({', '.join(self.params)}) {{")
        return "\n".join([head, *("  " + x for x in body), "}"])


def emit_attention_cuda(k: KernelFuncOp, ins: list[str], outs: list[str], params: list[str],
                        fast_math: bool) -> tuple[str, list[str]]:
    """The ``flash`` kernel (see the module docstring); ``params`` is its parameter list."""
    flash = _Flash(k, ins, outs, params, fast_math)
    return flash.emit(), [f"// {k.sym_name}'s helpers", flash.out_helper()]


__all__ = ["emit_attention_c", "emit_attention_cuda"]
