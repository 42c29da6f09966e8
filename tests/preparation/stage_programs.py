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
