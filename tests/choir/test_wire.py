"""The wire form: every graph round-trips with its locations, and anything that is not a
valid encoding decodes to an equal module or fails with ``WireFormatError`` only."""

from __future__ import annotations

import io
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accy.choir.attributes import (
    BF16,
    F16,
    F32,
    I1,
    I32,
    ArrayAttr,
    BoolAttr,
    DenseArrayAttr,
    DenseElementsAttr,
    DictAttr,
    FloatAttr,
    IntegerAttr,
    OpaqueType,
    StringAttr,
    SymbolRefAttr,
    TensorType,
    TypeAttr,
    UnitAttr,
)
from accy.choir.builtin import ModuleOp
from accy.choir.fuzz import pack_body
from accy.choir.ir import Block, Operation, Region
from accy.choir.location import Location
from accy.choir.parser import parse_file
from accy.choir.printer import print_op
from accy.choir.wire import MAGIC, WIRE_VERSION, decode, encode
from accy.errors import WireFormatError

GRAPHS = sorted((Path(__file__).resolve().parents[2] / "graphs").glob("*.mlir"))
IDS = [p.name for p in GRAPHS]
ENCODINGS = [encode(parse_file(str(p))) for p in GRAPHS]


def text_of(op: Operation) -> str:
    return print_op(op, debuginfo=True)


@pytest.mark.parametrize("path", GRAPHS, ids=IDS)
def test_every_graph_round_trips_with_its_locations(path: Path) -> None:
    module = parse_file(str(path))
    data = encode(module)
    again = decode(data)
    assert isinstance(again, ModuleOp)
    assert text_of(again) == text_of(module)
    assert print_op(again) == print_op(module)
    assert encode(again) == data
    ops, ops_again = list(module.walk()), list(again.walk())
    assert [o.loc for o in ops] == [o.loc for o in ops_again]
    assert all(o.loc.file == str(path) and o.loc.line > 0 for o in ops_again)
    args = [a.loc for o in ops_again for r in o.regions for b in r.blocks for a in b.args]
    assert args and all(loc.line > 0 for loc in args)


def test_decoded_module_is_independent_of_the_original() -> None:
    module = parse_file(str(GRAPHS[0]))
    before = text_of(module)
    again = decode(encode(module))
    for op in again.walk():
        op.attributes["touched"] = UnitAttr()
    assert text_of(module) == before


def test_every_attribute_and_type_kind_round_trips() -> None:
    t = TensorType((2, 3), F32)
    attrs = {
        "int": IntegerAttr(-7, I32),
        "big": IntegerAttr((1 << 63) - 1),
        "f32": FloatAttr(1e-5, F32),
        "f16": FloatAttr(65504.0, F16),
        "bf16": FloatAttr(3.140625, BF16),
        "nan": FloatAttr(float("nan"), F32),
        "negzero": FloatAttr(-0.0, F32),
        "inf": FloatAttr(float("-inf"), F32),
        "str": StringAttr('quote " and \\ and \n and é'),
        "bool": BoolAttr(False),
        "unit": UnitAttr(),
        "type": TypeAttr(OpaqueType("memory.arena<16>")),
        "arr": DenseArrayAttr((1, 0, -5)),
        "dense": DenseElementsAttr(t, tuple(np.linspace(-1, 1, 6).tolist())),
        "splat": DenseElementsAttr(t, (2.5,)),
        "bools": DenseElementsAttr(TensorType((3,), I1), (True, False, True)),
        "f16s": DenseElementsAttr(TensorType((2,), F16), (0.5, -1.0)),
        "bf16s": DenseElementsAttr(TensorType((2,), BF16), (0.5, 3.0)),
        "list": ArrayAttr((IntegerAttr(1), StringAttr("x"), ArrayAttr(()))),
        "dict": DictAttr((("b", UnitAttr()), ("a", SymbolRefAttr("main")))),
    }
    module = ModuleOp.build(Location("w.mlir", 1, 1))
    op = Operation.create("test.all", [], [t], attrs, {"p": IntegerAttr(3)},
                          [Region([Block([t], [Location("w.mlir", 2, 9)])])],
                          Location("w.mlir", 2, 3))
    module.body.append(op)
    (again,) = decode(encode(module)).body.ops
    assert again.attributes == attrs
    assert again.properties == {"p": IntegerAttr(3)}
    assert again.result_types == (t,)
    assert again.regions[0].blocks[0].args[0].loc == Location("w.mlir", 2, 9)
    assert str(again.attributes["negzero"].value) == "-0.0"  # type: ignore[attr-defined]


def test_a_value_used_before_its_definition_cannot_be_encoded() -> None:
    t = TensorType((4,), F32)
    block = Block([t])
    a = Operation.create("test.a", [block.args[0]], [t])
    b = Operation.create("test.b", [a.result], [t])
    block.append(b)
    block.append(a)
    module = ModuleOp(regions=[Region([block])])
    with pytest.raises(WireFormatError, match="not defined before its use"):
        encode(module)


# ------------------------------------------------------------------ header checks


def _split(data: bytes) -> tuple[list, list]:
    """Format 2's two objects: the header and the module's body."""
    head, body = msgpack.Unpacker(io.BytesIO(data), raw=False)
    return head, body


def _join(head: object, body: object) -> bytes:
    return msgpack.packb(head, use_bin_type=True) + msgpack.packb(body, use_bin_type=True)


def test_wrong_magic_is_named() -> None:
    data = msgpack.packb([b"chair", WIRE_VERSION, [], []], use_bin_type=True) + b"\x90"
    with pytest.raises(WireFormatError, match="bad magic"):
        decode(data)


def test_wrong_version_is_named() -> None:
    head, body = _split(ENCODINGS[0])
    head[1] = WIRE_VERSION + 1
    with pytest.raises(WireFormatError) as info:
        decode(_join(head, body))
    assert str(info.value) == (f"unsupported choir wire version {WIRE_VERSION + 1} "
                               f"(this accy reads versions 1 and {WIRE_VERSION})")


def _inline(op: list, locs: list) -> list:
    """Format 1's body: the format 2 body with its location table put back inline, in
    the order the table lists them (an op's, then its blocks' arguments', pre-order)."""
    loc = locs.pop(0)
    regions = []
    for region in op[5]:
        blocks = []
        for types, arg_locs, ops in region:
            filled = [locs.pop(0) for _ in arg_locs]
            blocks.append([types, filled, [_inline(o, locs) for o in ops]])
        regions.append(blocks)
    return [*op[:5], regions, loc]


@pytest.mark.parametrize("which", range(len(GRAPHS)), ids=IDS)
def test_format_1_still_reads_as_the_same_module(which: int) -> None:
    (magic, _, files, locs), body = _split(ENCODINGS[which])
    old = msgpack.packb([magic, 1, files, _inline(body, list(locs))], use_bin_type=True)
    again = decode(old)
    assert text_of(again) == text_of(decode(ENCODINGS[which]))
    assert encode(again) == ENCODINGS[which]


def test_the_canonical_form_is_format_1_without_locations() -> None:
    """Fingerprints carry over from format 1: the canonical bytes are its encoding with
    every location nil."""
    from accy.choir.wire import canonical_bytes

    module = parse_file(str(GRAPHS[0]))
    (magic, _, _, locs), body = _split(encode(module))
    assert any(loc is not None for loc in locs)
    nil = _inline(body, [None] * len(locs))
    assert canonical_bytes(module) == msgpack.packb([magic, 1, [], nil], use_bin_type=True)


@pytest.mark.parametrize("change, message", [
    (lambda h, b: (h[:3] + [h[3][:-1]], b), "location table too short"),
    (lambda h, b: (h[:3] + [h[3] + [None]], b), "location table too long"),
    (lambda h, b: (h[:3] + [{}], b), "location table"),
    (lambda h, b: (h, b[:6] + [[0, 1, 1]]), "inline location in a format 2 body"),
    (lambda h, b: (h[:3] + [[[7, 1, 1]] + h[3][1:]], b), "location file index"),
])
def test_a_bad_location_table_is_named(change, message: str) -> None:
    head, body = _split(ENCODINGS[0])
    with pytest.raises(WireFormatError, match=message):
        decode(_join(*change(head, body)))


def test_format_2_needs_its_module_and_format_1_no_more() -> None:
    head, body = _split(ENCODINGS[0])
    with pytest.raises(WireFormatError, match="no module after the header"):
        decode(msgpack.packb(head, use_bin_type=True))
    old = msgpack.packb([MAGIC, 1, head[2], _inline(body, list(head[3]))], use_bin_type=True)
    with pytest.raises(WireFormatError, match="trailing data"):
        decode(old + b"\xc0")


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x00", msgpack.packb({"a": 1}),
                                  msgpack.packb([MAGIC, WIRE_VERSION, []]),
                                  msgpack.packb([MAGIC, WIRE_VERSION, [1], []]),
                                  pack_body(["x"] * 7)],
                         ids=["empty", "reserved-byte", "int", "map", "short-header",
                              "bad-file-table", "bad-op-name"])
def test_malformed_headers(data: bytes) -> None:
    with pytest.raises(WireFormatError, match="malformed choir wire data"):
        decode(data)


def test_not_bytes_is_an_error() -> None:
    with pytest.raises(WireFormatError, match="must be bytes"):
        decode("choir")  # type: ignore[arg-type]


@pytest.mark.parametrize("depth", [10_000, 100_000])
def test_deeply_nested_msgpack_is_rejected(depth: int) -> None:
    data = b"\x91" * depth + b"\xc0"  # [[[…[nil]…]]]
    with pytest.raises(WireFormatError):
        decode(data)


def test_deeply_nested_regions_are_rejected() -> None:
    op: list = ["test.leaf", [], [], [], [], [], None]
    for _ in range(200):
        op = ["test.r", [], [], [], [], [[[[], [], [op]]]], None]
    data = pack_body(op)
    with pytest.raises(WireFormatError, match="nested too deeply"):
        decode(data)


def test_deeply_nested_attributes_are_rejected() -> None:
    attr: list = [4]
    for _ in range(200):
        attr = [8, [attr]]
    op = ["test.a", [], [], [["a", attr]], [], [], None]
    with pytest.raises(WireFormatError, match="nested too deeply"):
        decode(pack_body(op))


def test_huge_length_prefixes_fail_fast() -> None:
    for data in (b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff"):
        with pytest.raises(WireFormatError):
            decode(data)


def test_dense_elements_claiming_more_bytes_than_given() -> None:
    op = ["test.c", [], [], [["v", [7, [0, [4], "f32"], False, b"\x00" * 12]]], [], [], None]
    with pytest.raises(WireFormatError, match="dense elements size"):
        decode(pack_body(op))


def test_dense_elements_too_large_to_hold() -> None:
    op = ["test.c", [], [], [["v", [7, [0, [1 << 20, 1 << 20], "f32"], True, b"\x00" * 4]]],
          [], [], None]
    with pytest.raises(WireFormatError, match="dense elements too large"):
        decode(pack_body(op))


def test_operand_reference_out_of_range() -> None:
    op = ["builtin.module", [], [], [], [], [[[[], [], [["test.a", [5], [], [], [], [], None]]]]],
          None]
    with pytest.raises(WireFormatError, match="operand reference"):
        decode(pack_body(op))


def test_every_prefix_of_a_small_encoding_is_rejected() -> None:
    data = min(ENCODINGS, key=len)
    for n in range(len(data)):
        with pytest.raises(WireFormatError):
            decode(data[:n])


# ---------------------------------------------------------------------- fuzzing


def _decode_or_wire_error(data: bytes) -> Operation | None:
    """Decode; only a WireFormatError may escape (pytest reports anything else), and
    promptly: these inputs are small, so anything slow is a hang in the making."""
    start = time.perf_counter()
    try:
        return decode(data)
    except WireFormatError:
        return None
    finally:
        assert time.perf_counter() - start < 5.0, f"decoding {len(data)} bytes took too long"


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes(data: bytes) -> None:
    _decode_or_wire_error(data)


@FUZZ
@given(st.sampled_from(range(len(ENCODINGS))), st.floats(0, 1, exclude_max=True))
def test_random_truncations(which: int, fraction: float) -> None:
    data = ENCODINGS[which]
    assert _decode_or_wire_error(data[:int(len(data) * fraction)]) is None


@FUZZ
@given(st.data())
def test_random_single_byte_corruptions(data: st.DataObject) -> None:
    which = data.draw(st.sampled_from(range(len(ENCODINGS))))
    original = ENCODINGS[which]
    at = data.draw(st.integers(0, len(original) - 1))
    byte = data.draw(st.integers(0, 255).filter(lambda b: b != original[at]))
    corrupt = original[:at] + bytes([byte]) + original[at + 1:]
    decoded = _decode_or_wire_error(corrupt)
    if decoded is not None:
        # whatever decodes is a module we can print and encode again, consistently
        assert text_of(decode(encode(decoded))) == text_of(decoded)


@FUZZ
@given(st.data())
def test_random_corruptions_of_the_decoded_structure(data: st.DataObject) -> None:
    """Replace one node of the msgpack tree with an arbitrary msgpack value."""
    which = data.draw(st.sampled_from(range(len(ENCODINGS))))
    tree = list(_split(ENCODINGS[which]))
    leaves = st.one_of(st.none(), st.booleans(), st.integers(-2, 1 << 40), st.floats(),
                       st.text(max_size=8), st.binary(max_size=8))
    value = data.draw(st.recursive(leaves, lambda c: st.lists(c, max_size=4), max_leaves=8))
    node = tree
    while isinstance(node, list) and node:
        i = data.draw(st.integers(0, len(node) - 1))
        if not isinstance(node[i], list) or not node[i] or data.draw(st.booleans()):
            node[i] = value
            break
        node = node[i]
    decoded = _decode_or_wire_error(_join(*tree))
    if decoded is not None:
        assert text_of(decode(encode(decoded))) == text_of(decoded)


@pytest.mark.parametrize("stage", ["semantic", "tensor", "kernel", "target"])
def test_one_walk_encodes_and_fingerprints_as_the_two_encoders_do(stage: str) -> None:
    """What a stage product written to the store uses (``Product.to_wire``): the wire
    bytes and the canonical fingerprint of every graph, at an early and a late stage."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "preparation"))
    from stage_programs import graph, graph_shapes

    from accy.choir.wire import encode_and_fingerprint, fingerprint
    from accy.pipeline import prepare_through
    from accy.preparation.options import RunOptions

    for path in GRAPHS:
        sm = graph(path.stem)
        module = sm.module if stage == "semantic" else prepare_through(
            sm, stage, RunOptions.parse("cuda:sm_90"), graph_shapes(sm)).product.module
        assert encode_and_fingerprint(module) == (encode(module), fingerprint(module)), path
