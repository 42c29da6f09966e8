"""Programs for the stage tests: small inline modules and the example graphs."""

from __future__ import annotations

from pathlib import Path

from accy.choir.attributes import TensorType
from accy.preparation.products import SemanticModule

GRAPHS = sorted((Path(__file__).resolve().parents[2] / "graphs").glob("*.mlir"))


def program_text(args: list[str], results: list[str], body: str) -> str:
    """A module whose ``main`` takes ``args`` as ``%a0, %a1, …``; ``body`` starts on line 4."""
    sig = f"({', '.join(args)}) -> " + (results[0] if len(results) == 1
                                       else f"({', '.join(results)})")
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(args))
    return (f'"builtin.module"() ({{\n'
            f'  "func.func"() <{{function_type = {sig}, sym_name = "main"}}> ({{\n'
            f'  ^bb0({params}):\n'
            f'{body}\n'
            f'  }}) : () -> ()\n'
            f'}}) : () -> ()\n')


def program(args: list[str], results: list[str], body: str,
            file: str = "p.mlir") -> SemanticModule:
    """The verified :class:`SemanticModule` of :func:`program_text`."""
    return SemanticModule.from_text(program_text(args, results, body), file)


def offset_matmul(m: int, k: int, n: int) -> SemanticModule:
    """A matmul whose A is an intermediate placed after a 12-byte buffer (and a second
    result, so that buffer lives): with ``memory.alignment=4`` A starts at arena byte
    12, where a float4 load faults; with 16 or more it is aligned. Run unfused."""
    a, b, c = f"tensor<{m}x{k}xf32>", f"tensor<{k}x{n}xf32>", f"tensor<{m}x{n}xf32>"
    return program(["tensor<3xf32>", a, b], [c, "tensor<3xf32>"], f"""\
    %0 = "semantic.exp"(%a0) : (tensor<3xf32>) -> tensor<3xf32>
    %1 = "semantic.exp"(%a1) : ({a}) -> {a}
    %2 = "semantic.matmul"(%1, %a2) : ({a}, {b}) -> {c}
    %3 = "semantic.add"(%0, %0) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
    "func.return"(%2, %3) : ({c}, tensor<3xf32>) -> ()""")


def matmul(m: int, n: int, k: int, element: str, batch: tuple[int, ...] = (),
           epilogue: bool = False, op: str = "relu") -> SemanticModule:
    """``a @ b``, or with ``epilogue`` ``op(a @ b + bias)`` (a row vector of n)."""
    pre = "".join(f"{d}x" for d in batch)
    a, b, c = (f"tensor<{pre}{m}x{k}x{element}>", f"tensor<{pre}{k}x{n}x{element}>",
               f"tensor<{pre}{m}x{n}x{element}>")
    v = f"tensor<{n}x{element}>"
    body = f'    %0 = "semantic.matmul"(%a0, %a1) : ({a}, {b}) -> {c}\n'
    if epilogue:
        body += (f'    %1 = "semantic.add"(%0, %a2) : ({c}, {v}) -> {c}\n'
                 f'    %2 = "semantic.{op}"(%1) : ({c}) -> {c}\n'
                 f'    "func.return"(%2) : ({c}) -> ()')
        return program([a, b, v], [c], body)
    return program([a, b], [c], body + f'    "func.return"(%0) : ({c}) -> ()')


def graph(name: str, element: str | None = None) -> SemanticModule:
    """``graphs/<name>.mlir`` (every f32 tensor made ``element`` when given)."""
    path = GRAPHS[0].parent / f"{name}.mlir"
    if element is None:
        return SemanticModule.from_file(str(path))
    return SemanticModule.from_text(with_element(path.read_text(), element), str(path))


def with_element(text: str, element: str) -> str:
    """``text`` with every f32 tensor type made ``element`` (as the benchmark does)."""
    import re

    return re.sub(r"(tensor<(?:[0-9?]+x)*)f32>", rf"\g<1>{element}>", text)


def graph_shapes(sm: SemanticModule, size: int = 8) -> dict[int, tuple[int, ...]]:
    """Every argument's shape with its ``?`` dims bound to ``size``."""
    out = {}
    for i, t in enumerate(sm.entry().function_type.inputs):
        assert isinstance(t, TensorType)
        out[i] = tuple(size if d is None else d for d in t.shape)
    return out


def filecheck(text: str, *checks: str) -> None:
    """Each check must appear after the previous one; ``NOT: x`` means x appears nowhere."""
    pos = 0
    for c in checks:
        if c.startswith("NOT:"):
            assert c[4:].strip() not in text, f"{c!r} found in\n{text}"
            continue
        i = text.find(c, pos)
        assert i >= 0, f"{c!r} not found after offset {pos} in\n{text}"
        pos = i + len(c)


def attention_text(batch: tuple[int, ...], m: int, n: int, d: int, dv: int, *,
                   k_rows: bool = True, scale: str = "mul", axis: int = -1,
                   element: str = "f32", return_scores: bool = False,
                   k_batch: tuple[int, ...] | None = None) -> str:
    """``softmax(q·kᵀ·c)·v`` in the semantic dialect, the forms the fusion covers and not.

    ``k_rows``: K is ``[..., N, D]`` and transposed in the program, else given as
    ``[..., D, N]``; ``scale``: ``mul`` (scores · 0.125), ``lmul`` (0.125 · scores),
    ``div`` (scores / 8), ``none``; ``axis``: the softmax's; ``return_scores``: the
    scaled scores are a second result; ``k_batch``: K's batch dims (broadcast)."""
    def t(*dims: int) -> str:
        return "tensor<" + "".join(f"{x}x" for x in dims) + f"{element}>"

    kb = batch if k_batch is None else k_batch
    r = len(batch) + 2
    perm = ", ".join(str(i) for i in (*range(r - 2), r - 1, r - 2))
    q, k, v = t(*batch, m, d), t(*kb, n, d) if k_rows else t(*kb, d, n), t(*batch, n, dv)
    kt, s, o = t(*kb, d, n), t(*batch, m, n), t(*batch, m, dv)
    lines = []
    if k_rows:
        lines.append(f'    %kt = "semantic.transpose"(%a1) {{permutation = array<i64: {perm}>}} '
                     f': ({k}) -> {kt}')
    kname = "%kt" if k_rows else "%a1"
    lines.append(f'    %s = "semantic.matmul"(%a0, {kname}) : ({q}, {kt}) -> {s}')
    sc = f"tensor<{element}>"
    if scale == "none":
        scores = "%s"
    else:
        value = "8.000000e+00" if scale == "div" else "1.250000e-01"
        lines.append(f'    %c = "semantic.constant"() {{value = dense<{value}> : {sc}}} : () -> {sc}')
        op = "div" if scale == "div" else "mul"
        a, b, ta, tb = ("%c", "%s", sc, s) if scale == "lmul" else ("%s", "%c", s, sc)
        lines.append(f'    %ss = "semantic.{op}"({a}, {b}) : ({ta}, {tb}) -> {s}')
        scores = "%ss"
    lines.append(f'    %p = "semantic.softmax"({scores}) {{axis = {axis} : i64}} : ({s}) -> {s}')
    lines.append(f'    %o = "semantic.matmul"(%p, %a2) : ({s}, {v}) -> {o}')
    if return_scores:
        lines.append(f'    "func.return"(%o, {scores}) : ({o}, {s}) -> ()')
    else:
        lines.append(f'    "func.return"(%o) : ({o}) -> ()')
    return program_text([q, k, v], [o, s] if return_scores else [o],
                        "\n".join(x for x in lines if x))


def attention(batch: tuple[int, ...], m: int, n: int, d: int, dv: int, **kw) -> SemanticModule:  # type: ignore[no-untyped-def]
    """The verified module of :func:`attention_text`."""
    return SemanticModule.from_text(attention_text(batch, m, n, d, dv, **kw), "attention.mlir")
