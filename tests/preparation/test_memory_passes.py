"""Memory stage: plan-buffers (liveness, reuse, in-place, aliases, alignment).

Inputs come from the real pipelines (contract … memory). Every plan of every
graph is checked by :func:`check_plan`: buffers whose lifetimes overlap in
launch order never overlap in bytes, except an in-place output and the input
it overwrites, at the one launch where that input dies.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from stage_programs import GRAPHS, graph_shapes, program

from accy.choir.attributes import ArrayAttr, DenseArrayAttr, DictAttr, IntegerAttr
from accy.dialects.dispatch import RegionOp
from accy.pipeline import prepare_through
from accy.preparation.options import RunOptions
from accy.preparation.products import SemanticModule


def memory(sm: SemanticModule, opts=(), shapes=None):
    return prepare_through(sm, "memory", RunOptions.parse("host", list(opts)), shapes or {})


def _plain(a):
    if isinstance(a, IntegerAttr):
        return a.value
    if isinstance(a, DenseArrayAttr):
        return tuple(a.values)
    return getattr(a, "value", a)


@dataclass
class Plan:
    buffers: dict[int, dict]
    arena_bytes: int
    launches: list[tuple[tuple[int, ...], tuple[int, ...]]]
    """Per region, in launch order: (input buffer ids, output buffer ids)."""
    lifetimes: dict[int, tuple[int, int]]
    """Per arena buffer: [first def, last use] in body-op order (aliases count as uses)."""


def read_plan(result) -> Plan:
    func = result.product.entry()
    bufs_attr = func.attr("memory.buffers")
    assert isinstance(bufs_attr, ArrayAttr)
    buffers = {}
    for d in bufs_attr.values:
        assert isinstance(d, DictAttr)
        b = {k: _plain(v) for k, v in d.entries}
        buffers[b["id"]] = b
    assert sorted(buffers) == list(range(len(buffers)))

    def root(i: int) -> int:
        while "alias_of" in buffers[i]:
            i = buffers[i]["alias_of"]
        return i

    buf_of = {a: i for i, a in enumerate(func.body.args)}
    assert all(buffers[i]["kind"] == "arg" and buffers[i]["index"] == i for i in buf_of.values())
    lifetimes: dict[int, list[int]] = {}
    launches = []
    for idx, op in enumerate(func.body.ops):
        reads = [buf_of[v] for v in op.operands]
        for r in {root(i) for i in reads}:
            if r in lifetimes:
                lifetimes[r][1] = max(lifetimes[r][1], idx)
        if isinstance(op, RegionOp):
            ins = tuple(op.attr("memory.inputs").values)
            outs = tuple(op.attr("memory.outputs").values)
            assert list(ins) == reads
            launches.append((ins, outs))
            for v, i in zip(op.results, outs):
                buf_of[v] = i
                if buffers[i]["kind"] == "arena":
                    lifetimes[i] = [idx, idx]
        elif op.op_name == "prim.reshape":
            i = op.attr("memory.buffer").value
            assert buffers[i]["kind"] == "alias"
            assert buffers[i]["alias_of"] == buf_of[op.operands[0]]
            buf_of[op.results[0]] = i
    for k, v in enumerate(func.return_op.operands):
        # the result's own buffer, or a view of it (a returned reshape of a region output)
        b = buffers[root(buf_of[v])]
        assert b["kind"] == "result" and b["index"] == k
        assert b["shape"] == tuple(v.type.shape)
    results = [b["index"] for b in buffers.values() if b["kind"] == "result"]
    assert sorted(results) == list(range(len(func.return_op.operands)))
    return Plan(buffers, func.attr("memory.arena_bytes").value, launches,
                {i: (a, b) for i, (a, b) in lifetimes.items()})


def check_plan(result, alignment: int) -> Plan:
    """Every invariant of a buffer plan; returns it for further checks."""
    p = read_plan(result)
    arena = {i: b for i, b in p.buffers.items() if b["kind"] == "arena"}
    for b in p.buffers.values():
        n = 1
        for d in b["shape"]:
            n *= d
        assert b["bytes"] == n * {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i1": 1,
                                  "i32": 4, "i64": 8}[b["dtype"]]
        if b["kind"] == "arena":
            assert b["offset"] % alignment == 0 and b["alignment"] == alignment
            assert b["offset"] + b["bytes"] <= p.arena_bytes
        else:
            assert "offset" not in b
    assert p.arena_bytes % alignment == 0
    for (i, a), (j, b) in itertools.combinations(arena.items(), 2):
        (da, la), (db, lb) = p.lifetimes[i], p.lifetimes[j]
        if da > lb or db > la:
            continue  # lifetimes disjoint in time
        if b.get("inplace_of") == i and la == db or a.get("inplace_of") == j and lb == da:
            assert a["offset"] == b["offset"]
            continue  # written in place over an input that dies at that launch
        disjoint = a["offset"] + a["bytes"] <= b["offset"] or \
            b["offset"] + b["bytes"] <= a["offset"]
        assert disjoint, f"buffers {i} {p.lifetimes[i]} and {j} {p.lifetimes[j]} overlap: " \
                         f"{a} {b}"
    return p


def inplace(p: Plan) -> dict[int, int]:
    return {i: b["inplace_of"] for i, b in p.buffers.items() if "inplace_of" in b}


T = "tensor<4x8xf32>"
Q = "tensor<4x4xf32>"


# ------------------------------------------------------------------ the buffers


def test_arguments_results_and_the_arena():
    sm = program([T, "tensor<8xf32>"], [T, "tensor<4x1xf32>"], f"""\
    %0 = "semantic.add"(%a0, %a1) : ({T}, tensor<8xf32>) -> {T}
    %1 = "semantic.exp"(%0) : ({T}) -> {T}
    %2 = "semantic.reduce_sum"(%1) {{axes = array<i64: 1>, keepdims = true}} : ({T}) -> tensor<4x1xf32>
    "func.return"(%1, %2) : ({T}, tensor<4x1xf32>) -> ()""")
    r = memory(sm, ["dispatch.fuse=false"])
    p = check_plan(r, 256)
    kinds = [(b["kind"], b.get("index"), b["shape"]) for b in p.buffers.values()]
    assert kinds == [("arg", 0, (4, 8)), ("arg", 1, (8,)), ("arena", None, (4, 8)),
                     ("result", 0, (4, 8)), ("result", 1, (4, 1))]
    assert p.buffers[2]["strides"] == (8, 1) and p.buffers[2]["dtype"] == "f32"
    assert p.arena_bytes == 256
    assert p.launches == [((0, 1), (2,)), ((2,), (3,)), ((3,), (4,))]
    text = r.product.text()
    assert 'memory.arena_bytes = 256 : i64' in text and "memory.buffers = [{" in text
    assert r.pass_stats["plan-buffers"]["buffers"] == 5


@pytest.mark.parametrize("alignment", [1, 64, 256, 1024])
def test_arena_offsets_are_aligned(alignment):
    sm = program([T], [T], f"""\
    %0 = "semantic.reduce_sum"(%a0) {{axes = array<i64: 1>, keepdims = true}} : ({T}) -> tensor<4x1xf32>
    %1 = "semantic.exp"(%a0) : ({T}) -> {T}
    %2 = "semantic.reduce_max"(%1) {{axes = array<i64: 1>, keepdims = true}} : ({T}) -> tensor<4x1xf32>
    %3 = "semantic.sub"(%1, %2) : ({T}, tensor<4x1xf32>) -> {T}
    %4 = "semantic.div"(%3, %0) : ({T}, tensor<4x1xf32>) -> {T}
    "func.return"(%4) : ({T}) -> ()""")
    r = memory(sm, ["dispatch.fuse=false", "memory.inplace=false",
                    f"memory.alignment={alignment}"])
    p = check_plan(r, alignment)
    offsets = [b["offset"] for b in p.buffers.values() if b["kind"] == "arena"]
    assert len(offsets) == 4
    # four buffers live at once (sum, exp, max, sub): the arena holds them side by side
    sizes = [16, 128, 16, 128]
    assert p.arena_bytes == sum(-(-s // alignment) * alignment for s in sizes)


def test_disjoint_lifetimes_share_bytes_only_with_reuse():
    sm = program([T], ["tensor<4x1xf32>"], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.reduce_sum"(%0) {{axes = array<i64: 1>, keepdims = true}} : ({T}) -> tensor<4x1xf32>
    %2 = "semantic.neg"(%a0) : ({T}) -> {T}
    %3 = "semantic.reduce_max"(%2) {{axes = array<i64: 1>, keepdims = true}} : ({T}) -> tensor<4x1xf32>
    %4 = "semantic.add"(%1, %3) : (tensor<4x1xf32>, tensor<4x1xf32>) -> tensor<4x1xf32>
    "func.return"(%4) : (tensor<4x1xf32>) -> ()""")
    opts = ["dispatch.fuse=false", "memory.inplace=false"]
    reuse = check_plan(memory(sm, opts), 256)
    fresh = check_plan(memory(sm, opts + ["memory.reuse=false"]), 256)
    # %0 dies at the first reduction, before %2 is made: with reuse %2 takes its bytes
    exp, neg = 1, 3
    assert reuse.lifetimes[exp][1] < reuse.lifetimes[neg][0]
    assert reuse.buffers[exp]["offset"] == reuse.buffers[neg]["offset"]
    assert fresh.buffers[exp]["offset"] != fresh.buffers[neg]["offset"]
    assert len({b["offset"] for b in fresh.buffers.values() if b["kind"] == "arena"}) == 4
    assert fresh.arena_bytes > reuse.arena_bytes
    assert reuse.arena_bytes == 3 * 256 and fresh.arena_bytes == 4 * 256


def test_a_freed_block_is_split_and_neighbours_coalesce():
    # two 64-byte rows statistics die together; a 128-byte buffer then fits their union
    W = "tensor<4x32xf32>"
    sm = program([W], ["tensor<4x1xf32>"], f"""\
    %0 = "semantic.reduce_sum"(%a0) {{axes = array<i64: 1>, keepdims = true}} : ({W}) -> tensor<4x1xf32>
    %1 = "semantic.reduce_max"(%a0) {{axes = array<i64: 1>, keepdims = true}} : ({W}) -> tensor<4x1xf32>
    %2 = "semantic.add"(%0, %1) : (tensor<4x1xf32>, tensor<4x1xf32>) -> tensor<4x1xf32>
    %3 = "semantic.exp"(%2) : (tensor<4x1xf32>) -> tensor<4x1xf32>
    "func.return"(%3) : (tensor<4x1xf32>) -> ()""")
    p = check_plan(memory(sm, ["dispatch.fuse=false", "memory.alignment=16",
                               "memory.inplace=false"]), 16)
    assert [b["offset"] for b in p.buffers.values() if b["kind"] == "arena"] == [0, 16, 32]
    assert p.arena_bytes == 48


# ------------------------------------------------------------------- in place


def chain(n_ops: list[str], t: str = T) -> SemanticModule:
    lines = [f'    %{i} = "semantic.{n}"(%{"a0" if i == 0 else i - 1}) : ({t}) -> {t}'
             for i, n in enumerate(n_ops)]
    lines.append(f'    "func.return"(%{len(n_ops) - 1}) : ({t}) -> ()')
    return program([t], [t], "\n".join(lines))


def test_an_elementwise_region_writes_over_an_input_that_dies_there():
    r = memory(chain(["exp", "neg", "abs", "tanh"]), ["dispatch.fuse=false"])
    p = check_plan(r, 256)
    # exp (2) → neg (3) in place → abs (4) in place → tanh (result 5)
    assert inplace(p) == {3: 1, 4: 3} or inplace(p) == {2: 1, 3: 2}
    arena = [b for b in p.buffers.values() if b["kind"] == "arena"]
    assert len({b["offset"] for b in arena}) == 1 and p.arena_bytes == 256
    assert r.pass_stats["plan-buffers"]["inplace"] == 2
    assert not inplace(check_plan(memory(chain(["exp", "neg", "abs", "tanh"]),
                                         ["dispatch.fuse=false", "memory.inplace=false"]),
                                  256))


def test_never_in_place_over_a_function_argument():
    p = check_plan(memory(chain(["exp", "neg"]), ["dispatch.fuse=false"]), 256)
    assert not inplace(p)
    assert all(b["kind"] != "arena" for b in p.buffers.values() if b["kind"] == "arg")


def test_never_in_place_over_an_input_used_later():
    sm = program([T], [T], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.neg"(%0) : ({T}) -> {T}
    %2 = "semantic.abs"(%1) : ({T}) -> {T}
    %3 = "semantic.add"(%2, %0) : ({T}, {T}) -> {T}
    "func.return"(%3) : ({T}) -> ()""")
    p = check_plan(memory(sm, ["dispatch.fuse=false"]), 256)
    exp = 1
    assert exp not in inplace(p).values()
    assert p.buffers[exp]["kind"] == "arena"
    assert inplace(p) == {3: 2}  # abs over neg: neg dies at abs


def test_never_in_place_over_an_input_read_through_a_transpose():
    sm = program([Q], [Q], f"""\
    %0 = "semantic.exp"(%a0) : ({Q}) -> {Q}
    %1 = "semantic.transpose"(%0) {{permutation = array<i64: 1, 0>}} : ({Q}) -> {Q}
    %2 = "semantic.sub"(%0, %1) : ({Q}, {Q}) -> {Q}
    %3 = "semantic.neg"(%2) : ({Q}) -> {Q}
    "func.return"(%3) : ({Q}) -> ()""")
    p = check_plan(memory(sm, ["dispatch.fuse=false"]), 256)
    assert 1 not in inplace(p).values()


def test_never_in_place_over_an_input_read_through_a_broadcast():
    sm = program(["tensor<1x8xf32>"], [T], f"""\
    %0 = "semantic.exp"(%a0) : (tensor<1x8xf32>) -> tensor<1x8xf32>
    %1 = "semantic.broadcast_to"(%0) : (tensor<1x8xf32>) -> {T}
    %2 = "semantic.neg"(%1) : ({T}) -> {T}
    %3 = "semantic.abs"(%2) : ({T}) -> {T}
    "func.return"(%3) : ({T}) -> ()""")
    p = check_plan(memory(sm, ["dispatch.fuse=false"]), 256)
    assert 1 not in inplace(p).values()


def test_never_in_place_when_the_input_is_read_elsewhere_through_a_transpose():
    # the second region computes exp(a) at its own element *and* at the transposed one:
    # writing its output over a would clobber elements still to be read
    sm = program([Q], [Q], f"""\
    %0 = "semantic.neg"(%a0) : ({Q}) -> {Q}
    %1 = "semantic.abs"(%0) : ({Q}) -> {Q}
    %2 = "semantic.exp"(%1) : ({Q}) -> {Q}
    %3 = "semantic.transpose"(%2) {{permutation = array<i64: 1, 0>}} : ({Q}) -> {Q}
    %4 = "semantic.sub"(%2, %3) : ({Q}, {Q}) -> {Q}
    %5 = "semantic.neg"(%4) : ({Q}) -> {Q}
    "func.return"(%5) : ({Q}) -> ()""")
    r = memory(sm, ["dispatch.max_region_ops=2"])
    p = check_plan(r, 256)
    second = p.launches[1]
    assert [op.op_name for op in r.product.entry().body.ops[1].body.ops][:3] == [
        "prim.exp", "prim.transpose", "prim.sub"]
    assert second[0][0] not in inplace(p).values()


def test_never_in_place_over_an_input_that_another_input_aliases():
    # the add reads a directly and through reshape + transpose (a view of a's bytes)
    R = "tensor<8x4xf32>"
    sm = program([T, R], [Q], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.reshape"(%0) : ({T}) -> {R}
    %2 = "semantic.transpose"(%1) {{permutation = array<i64: 1, 0>}} : ({R}) -> {T}
    %3 = "semantic.add"(%0, %2) : ({T}, {T}) -> {T}
    %4 = "semantic.matmul"(%3, %a1) : ({T}, {R}) -> {Q}
    "func.return"(%4) : ({Q}) -> ()""")
    p = check_plan(memory(sm), 256)
    assert not inplace(p)


def test_in_place_needs_the_same_element_type():
    H = "tensor<4x8xf16>"
    sm = program([T], [H], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.cast"(%0) : ({T}) -> {H}
    %2 = "semantic.neg"(%1) : ({H}) -> {H}
    "func.return"(%2) : ({H}) -> ()""")
    p = check_plan(memory(sm, ["dispatch.fuse=false"]), 256)
    assert not inplace(p)


# -------------------------------------------------------------------- aliases


def test_a_reshape_aliases_its_input():
    sm = program([T], ["tensor<8x4xf32>"], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.reshape"(%0) : ({T}) -> tensor<8x4xf32>
    %2 = "semantic.neg"(%1) : (tensor<8x4xf32>) -> tensor<8x4xf32>
    "func.return"(%2) : (tensor<8x4xf32>) -> ()""")
    r = memory(sm)
    p = check_plan(r, 256)
    assert p.buffers[2] == {"alias_of": 1, "bytes": 128, "dtype": "f32", "id": 2,
                            "kind": "alias", "shape": (8, 4), "strides": (4, 1)}
    assert p.launches == [((0,), (1,)), ((2,), (3,))]
    assert '"prim.reshape"(%0) {memory.buffer = 2 : i64}' in r.product.text()
    # the alias's reader keeps the aliased buffer alive
    assert p.lifetimes[1] == (0, 2)


def test_a_reshape_of_an_argument_aliases_the_argument():
    sm = program([T], ["tensor<32xf32>"], f"""\
    %0 = "semantic.reshape"(%a0) : ({T}) -> tensor<32xf32>
    %1 = "semantic.exp"(%0) : (tensor<32xf32>) -> tensor<32xf32>
    "func.return"(%1) : (tensor<32xf32>) -> ()""")
    p = check_plan(memory(sm), 256)
    assert p.buffers[1]["kind"] == "alias" and p.buffers[1]["alias_of"] == 0
    assert p.arena_bytes == 0


def test_a_returned_reshape_makes_its_region_output_a_view_of_the_result():
    """A row sum returned without its kept axis: the reduction writes the result buffer
    (its 4×1 output a view of the 4-element result), no arena buffer and no copy."""
    sm = program([T], ["tensor<4xf32>", "tensor<4xf32>"], f"""\
    %0 = "semantic.reduce_sum"(%a0) {{axes = array<i64: 1>, keepdims = false}} : ({T}) -> tensor<4xf32>
    %1 = "semantic.reduce_max"(%a0) {{axes = array<i64: 1>, keepdims = false}} : ({T}) -> tensor<4xf32>
    "func.return"(%1, %0) : (tensor<4xf32>, tensor<4xf32>) -> ()""")
    p = check_plan(memory(sm), 256)
    ((ins, outs),) = p.launches
    assert ins == (0,)
    for out, index in zip(outs, (1, 0)):  # the sum is result 1, the max result 0
        view = p.buffers[out]
        assert view["kind"] == "alias" and view["shape"] == (4, 1)
        assert p.buffers[view["alias_of"]] == {
            "bytes": 16, "dtype": "f32", "id": view["alias_of"], "index": index,
            "kind": "result", "shape": (4,), "strides": (1,)}
    assert p.arena_bytes == 0


# --------------------------------------------------------------- every graph


OPTION_SETS = [
    [], ["dispatch.fuse=false"], ["dispatch.fuse=false", "memory.reuse=false"],
    ["dispatch.fuse=false", "memory.inplace=false"], ["dispatch.max_region_ops=2"],
    ["memory.alignment=64"], ["dispatch.fuse=false", "memory.alignment=1024"],
]


@pytest.mark.parametrize("path", GRAPHS, ids=[p.stem for p in GRAPHS])
def test_no_two_live_buffers_overlap_in_any_graph(path):
    sm = SemanticModule.from_file(str(path))
    shapes = graph_shapes(sm)
    for opts in OPTION_SETS:
        alignment = next((int(o.split("=")[1]) for o in opts if "alignment" in o), 256)
        p = check_plan(memory(sm, opts, shapes), alignment)
        if "memory.reuse=false" in opts:
            arena = [b for b in p.buffers.values() if b["kind"] == "arena"
                     and "inplace_of" not in b]
            assert len({b["offset"] for b in arena}) == len(arena)


def test_the_checker_catches_an_overlap():
    sm = program([T], [T], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.reduce_sum"(%0) {{axes = array<i64: 1>, keepdims = true}} : ({T}) -> tensor<4x1xf32>
    %2 = "semantic.div"(%0, %1) : ({T}, tensor<4x1xf32>) -> {T}
    "func.return"(%2) : ({T}) -> ()""")
    r = memory(sm, ["dispatch.fuse=false"])
    check_plan(r, 256)
    func = r.product.entry()
    entries = []
    for d in func.attr("memory.buffers").values:
        e = dict(d.entries)
        if e["kind"].value == "arena":
            e["offset"] = IntegerAttr(0)
        entries.append(DictAttr(tuple(e.items())))
    func.attributes["memory.buffers"] = ArrayAttr(tuple(entries))
    with pytest.raises(AssertionError, match="overlap"):
        check_plan(r, 256)


def test_the_memory_plan_reads_nothing_of_the_kernel_options():
    sm = SemanticModule.from_file(str(GRAPHS[0].parent / "softmax.mlir"))
    a = memory(sm, [], {0: (8, 64)})
    b = memory(sm, ["kernel.block_size=64"], {0: (8, 64)})
    assert a.key == b.key and a.product.fingerprint() == b.product.fingerprint()
    assert a.plan_fingerprint == b.plan_fingerprint
