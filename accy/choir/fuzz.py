"""Mutation fuzzing of the choir text parser and the wire decoder.

Both entry points must turn any input into a module or a typed accy error
(:class:`~accy.errors.AccyError`); anything else escaping is a bug. A run
mutates real programs (byte flips, deletions, duplications, splices, deep
nesting, huge literals) and real wire blobs (flips, truncations, crafted
bombs), and for every accepted input also checks that print → parse → print
is a fixed point and that fingerprint and the wire form work.

The test suite runs a few hundred inputs; ``benchmarks/fuzz_parser.py`` runs
100,000 of each.

Example
-------
>>> seeds = ['"builtin.module"() ({\\n}) : () -> ()\\n']
>>> tally = Tally()
>>> for text in text_mutations(seeds, 20, seed=1):
...     check_text(text, tally)
>>> tally.untyped
0
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import msgpack

from accy.choir.parser import parse_module
from accy.choir.printer import print_op
from accy.choir.verifier import verify
from accy.choir.wire import INLINE_VERSION, MAGIC, WIRE_VERSION, decode, encode, fingerprint
from accy.errors import AccyError

# ------------------------------------------------------------------------ tallies


@dataclass
class Tally:
    """Counts of one fuzz run, with a few examples of each kind of failure."""

    inputs: int = 0
    accepted: int = 0
    """Inputs that parsed (or decoded) and then printed, fingerprinted and encoded."""
    typed_errors: int = 0
    """Inputs rejected with an :class:`~accy.errors.AccyError`."""
    untyped: int = 0
    """Inputs that made any other exception escape: bugs."""
    roundtrip_mismatches: int = 0
    """Accepted inputs whose print → parse → print was not a fixed point: bugs."""
    examples: list[dict[str, str]] = field(default_factory=list)
    max_examples: int = 10

    def bug(self, kind: str, data: str | bytes, detail: str) -> None:
        if len(self.examples) < self.max_examples:
            shown = data if isinstance(data, str) else data.hex()
            self.examples.append({"kind": kind, "input": shown[:400], "error": detail[-800:]})

    def as_dict(self) -> dict[str, object]:
        return {"inputs": self.inputs, "accepted": self.accepted,
                "typed_errors": self.typed_errors, "untyped": self.untyped,
                "roundtrip_mismatches": self.roundtrip_mismatches, "examples": self.examples}


def _untyped(tally: Tally, data: str | bytes) -> None:
    tally.untyped += 1
    tally.bug("untyped", data, traceback.format_exc(limit=6))


def _accepted_module_checks(m: object, tally: Tally, data: str | bytes) -> None:
    """Print, re-parse, fingerprint and wire-encode an accepted module; verify it."""
    text = print_op(m)  # type: ignore[arg-type]
    again = print_op(parse_module(text, "<fuzz>"))
    if again != text:
        tally.roundtrip_mismatches += 1
        tally.bug("roundtrip", data, f"printed:\n{text[:300]}\nreprinted:\n{again[:300]}")
    fingerprint(m)  # type: ignore[arg-type]
    decode(encode(m))  # type: ignore[arg-type]
    verify(m)  # type: ignore[arg-type]


def check_text(text: str, tally: Tally) -> None:
    """Parse one input; count how it ended (never raises)."""
    tally.inputs += 1
    try:
        m = parse_module(text, "<fuzz>")
    except AccyError:
        tally.typed_errors += 1
        return
    except Exception:  # noqa: BLE001  (the point: anything untyped is a finding)
        _untyped(tally, text)
        return
    tally.accepted += 1
    try:
        _accepted_module_checks(m, tally, text)
    except AccyError:
        pass  # e.g. a verify error: the module parsed, the program is not valid
    except Exception:  # noqa: BLE001
        _untyped(tally, text)


def check_wire(data: bytes, tally: Tally) -> None:
    """Decode one input; count how it ended (never raises)."""
    tally.inputs += 1
    try:
        m = decode(data)
    except AccyError:
        tally.typed_errors += 1
        return
    except Exception:  # noqa: BLE001
        _untyped(tally, data)
        return
    tally.accepted += 1
    try:
        fingerprint(m)
        decode(encode(m))
        print_op(m)
    except AccyError:
        pass
    except Exception:  # noqa: BLE001
        _untyped(tally, data)


# ---------------------------------------------------------------------- mutations

TOKENS = (
    "(" * 1000, "[" * 1000, "{" * 300, "<" * 300, "9" * 4301, "0x" + "F" * 5000,
    "18446744073709551616", "-9223372036854775809", "99999999999999999999999 : i64",
    "1.0e999", "0x7FC00001 : f32", "0x7F800001", "tensor<²xf32>", "tensor<٣xf32>",
    "tensor<10000000000000000000000000000000000000000xf32>", "tensor<4xindex>",
    "tensor<9223372036854775807x9223372036854775807xf32>", "tensor<?x?xi1>",
    "dense<1.0> : tensor<100000x100000xf32>", 'dense<"0xFF"> : tensor<1xbf16>',
    'dense<"0x0000803F"> : tensor<1000000000000xf32>', "dense<> : tensor<0x4xf32>",
    "dense<[[1, 2], [3]]> : tensor<2x2xi32>", "dense<[true, false]> : tensor<2xi1>",
    '"caf\\C3\\A9"', '"\\FF\\FE"', '"\\"', "\\", '"', "%0:0", "%0:99999", "%0#9", "^bb1:",
    "^bb0(%a: f32):", "loc(", "loc(unknown)", '#loc = loc("a":1:2)', "#loc1", "@f", "!x<",
    "array<i64: 1, 2, 99999999999999999999>", "array<f32: 1.0>", "unit", "none", "->",
    "() -> ()", "(f32) -> (f32, f32)", "\n", "//", "\x00", "\u2028", "é", "٣", "\ud800",
)


VALUES = (
    "0x7FC00001 : f32", "0x7F800001 : f32", "0xFFF8000000000123 : f64", "0x7E01 : f16",
    "0x7FC1 : bf16", "-0.0 : f32", "1.0e-45 : f32", "65504.0 : f16", "3.4e38 : bf16", "1e400",
    "9223372036854775807 : i64", "18446744073709551615 : i64", "-128 : i8", "255 : i8",
    "true", "false : i1", "1 : i1", "unit", "@sym", '@"quoted sym"', '"caf\\C3\\A9"',
    '"\\00\\01\\7F\\C2\\85"', '"tab\\tnl\\n q\\" bs\\\\"', '"€ ٣ ²"', "array<i64>",
    "array<i32: -1, 2147483647>", "array<i1: true>", "[1, [2.5, [\"x\"]]]", "{a, b = @x, c = {}}",
    "dense<[1, -2, 9223372036854775807]> : tensor<3xindex>", "dense<> : tensor<0x3xf32>",
    "dense<[[], []]> : tensor<2x0xi32>", 'dense<"0x0000803F"> : tensor<1000000xf32>',
    'dense<"0x0000C07F0100C07F"> : tensor<2xf32>', 'dense<"0x01"> : tensor<3xi1>',
    "dense<[0x7FC00001, -0.0, 1.0e-45]> : tensor<3xf32>", "dense<0x7E01> : tensor<2x2xf16>",
    "dense<[true, false]> : tensor<2xi1>", "dense<1.5> : tensor<100000x100000xbf16>",
    "dense<[[1, 2], [3, 4]]> : tensor<2x2xi8>", "dense<255> : tensor<4xi8>", "tensor<4xindex>",
    "tensor<?x0x9223372036854775807xi1>", "(tensor<f32>) -> (tensor<f32>, none)", "!x.y<a<b>>",
    "none", "index", "f64",
)


def _substitute_value(text: str, rng: random.Random) -> str:
    """Replace one attribute value (after ``= `` up to its ``,`` or ``}``) with a literal."""
    starts = [k + 3 for k in range(len(text) - 3) if text.startswith(" = ", k)
              and text[k + 3:k + 4] != '"' or False]
    if not starts:
        return text
    a = rng.choice(starts)
    b = a
    while b < len(text) and text[b] not in ",}\n":
        b += 1
    return text[:a] + rng.choice(VALUES) + text[b:]


def _mutate_text(text: str, rng: random.Random, seeds: Sequence[str]) -> str:
    n = len(text)
    i = rng.randrange(n + 1)
    j = min(n, i + rng.choice((1, 1, 2, 4, 16, 64, 256)))
    kind = rng.randrange(9)
    if kind >= 7:  # a valid but unusual attribute value in place of a real one
        return _substitute_value(text, rng)
    if kind == 0:  # flip a character
        c = rng.choice('()[]{}<>:,%#^@!"\\=-x?0123456789.eE+ \nabcfi') if rng.random() < .9 \
            else chr(rng.randrange(0x80, 0x3000))
        return text[:i] + c + text[i + 1:]
    if kind == 1:  # delete a span
        return text[:i] + text[j:]
    if kind == 2:  # duplicate a span
        return text[:j] + text[i:j] + text[j:]
    if kind == 3:  # insert an interesting token
        return text[:i] + rng.choice(TOKENS) + text[i:]
    if kind == 4:  # splice in a piece of another program
        other = rng.choice(seeds)
        a = rng.randrange(len(other) + 1)
        return text[:i] + other[a:a + rng.randrange(1, 400)] + text[j:]
    if kind == 5:  # replace a number with a huge one
        for k in range(i, n):
            if text[k].isdigit():
                e = k
                while e < n and text[e].isdigit():
                    e += 1
                return text[:k] + rng.choice(("9" * rng.randrange(18, 5000), "18446744073709551616",
                                              "0", "4294967296", "9223372036854775808")) + text[e:]
        return text
    # deep nesting around a span
    d = rng.choice((50, 199, 200, 201, 1000, 5000))
    o, c = rng.choice((("(", ")"), ("[", "]"), ("{", "}"), ("<", ">")))
    return text[:i] + o * d + text[i:j] + c * d + text[j:]


def text_mutations(seeds: Sequence[str], count: int, seed: int = 0) -> Iterator[str]:
    """``count`` mutants of the ``seeds`` programs, 1–4 mutations each."""
    rng = random.Random(seed)
    for _ in range(count):
        text = rng.choice(seeds)
        for _ in range(rng.randrange(1, 5)):
            text = _mutate_text(text, rng, seeds)
        yield text


def _slots(op: object) -> int:
    """How many locations an encoded op (format 1's lists) holds: the op's own and its
    blocks' arguments', recursively (lenient: a crafted op may be malformed)."""
    if not (isinstance(op, list) and len(op) == 7 and isinstance(op[5], list)):
        return 1
    n = 1
    for region in op[5]:
        for block in region if isinstance(region, list) else ():
            if isinstance(block, list) and len(block) == 3:
                n += len(block[1]) if isinstance(block[1], list) else 0
                n += sum(_slots(o) for o in block[2]) if isinstance(block[2], list) else 0
    return n


def pack_body(body: object, files: list[str] | None = None, version: int = WIRE_VERSION) -> bytes:
    """A crafted body (format 1's inline lists, every location nil) in ``version``'s form."""
    if version == INLINE_VERSION:
        return msgpack.packb([MAGIC, INLINE_VERSION, files or [], body], use_bin_type=True)
    return msgpack.packb([MAGIC, WIRE_VERSION, files or [], [None] * _slots(body)],
                         use_bin_type=True) + msgpack.packb(body, use_bin_type=True)


def _const(ty: object, splat: bool, payload: bytes) -> list[object]:
    return ["builtin.module", [], [], [], [], [[[[], [], [
        ["test.c", [], [], [["v", [7, ty, splat, payload]]], [], [], None]]]]], None]


def wire_bombs() -> list[bytes]:
    """Crafted hostile blobs: huge declared sizes and shapes, deep nesting, odd ints."""
    big = [0, [1 << 20, 1 << 20, 1 << 20], "f32"]
    nested: object = [4]
    for _ in range(500):
        nested = [8, [nested]]
    deep_type: object = "f32"
    for _ in range(500):
        deep_type = [1, [deep_type], []]
    bodies = [
        _const([0, [100000, 100000], "f32"], True, b"\x00\x00\x80\x3f"),  # 10^10 splat
        _const([0, [1 << 31, 1 << 31], "f32"], True, b"\x00" * 4),
        _const(big, True, b"\x00" * 4),
        _const(big, False, b"\x00" * 4),
        _const([0, [1 << 28], "f32"], False, b"\x00" * 4),
        _const([0, [(1 << 64) - 1], "f32"], True, b"\x00" * 4),
        _const([0, [(1 << 63) - 1, (1 << 63) - 1], "i1"], True, b"\x01"),
        _const([0, [4], "bf16"], False, b"\x00" * 7),
        _const([0, [4], "index"], False, b"\x01" * 32),
        ["test.c", [], [], [["v", [0, (1 << 64) - 1, "i8"]]], [], [], None],
        ["test.c", [], [], [["v", [1, 1.0, "i32"]]], [], [], None],
        ["test.c", [], [], [["v", [6, "f32", [1, 2]]]], [], [], None],
        ["test.c", [], [], [["v", nested]], [], [], None],
        ["test.c", [], [deep_type], [], [], [], None],
    ]
    return [pack_body(b, version=v) for b in bodies for v in (WIRE_VERSION, INLINE_VERSION)] + [
        b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff",
        b"\x94\xa5choir\x01\x90\xdc\xff\xff", b"\x94\xa5choir\x01\x90" + b"\x91" * 100000,
        b"\x94\xc4\x05choir\x02\x90\x90\xdc\xff\xff",  # a body claiming 64K ops
        b"\x94\xc4\x05choir\x02\x90\x90" + b"\x91" * 100000,
        b"\x94\xc4\x05choir\x02\x90\xdd\xff\xff\xff\xff",  # a table claiming 4G
        b"\x94\xc4\x05choir\x02\x90\x90",  # no body
    ]


def _mutate_wire(data: bytes, rng: random.Random) -> bytes:
    n = len(data)
    i = rng.randrange(n + 1)
    j = min(n, i + rng.choice((1, 1, 2, 4, 16, 64)))
    kind = rng.randrange(6)
    if kind == 0:
        return data[:i] + bytes([rng.randrange(256)]) + data[i + 1:]
    if kind == 1:
        return data[:i] + data[j:]
    if kind == 2:
        return data[:j] + data[i:j] + data[j:]
    if kind == 3:
        return data[:i]
    if kind == 4:  # a msgpack length prefix claiming a lot
        return data[:i] + rng.choice((b"\xdd\xff\xff\xff\xff", b"\xc6\x7f\xff\xff\xff",
                                      b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff", b"\xdc\xff\xff",
                                      b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x01")) + data[j:]
    return data[:i] + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9))) + data[i:]


def wire_mutations(seeds: Sequence[bytes], count: int, seed: int = 0) -> Iterator[bytes]:
    """The crafted bombs, then ``count`` mutants of the ``seeds`` blobs (1–3 mutations each)."""
    rng = random.Random(seed)
    yield from wire_bombs()
    for _ in range(count):
        data = rng.choice(seeds)
        for _ in range(rng.randrange(1, 4)):
            data = _mutate_wire(data, rng)
        yield data
