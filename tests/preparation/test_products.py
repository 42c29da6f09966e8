"""Products on the wire: a deferred read-back decodes (and verifies) only when used."""

from __future__ import annotations

from pathlib import Path

import pytest

from accy.preparation.products import Product, SemanticModule, StoredProductBroken

GRAPHS = Path(__file__).resolve().parents[2] / "graphs"


def test_a_deferred_product_answers_fingerprint_and_wire_without_decoding():
    sm = SemanticModule.from_file(str(GRAPHS / "softmax.mlir"))
    wire = sm.to_wire()
    p = Product.from_wire(wire, (sm.fingerprint(), None))
    assert p.deferred and isinstance(p, SemanticModule)
    assert p.fingerprint() == sm.fingerprint()
    assert p.to_wire() == wire and p.deferred  # still not decoded
    assert p.text() == sm.text() and not p.deferred  # first use decodes


def test_a_broken_deferred_product_says_so_once_used_and_calls_back():
    import msgpack

    sm = SemanticModule.from_file(str(GRAPHS / "softmax.mlir"))
    magic, stage, meta, _ = msgpack.unpackb(sm.to_wire(), raw=False)
    broken = msgpack.packb([magic, stage, meta, b"\x00nope"], use_bin_type=True)
    dropped: list[bool] = []
    p = Product.from_wire(broken, (sm.fingerprint(), lambda: dropped.append(True)))
    assert p.fingerprint() == sm.fingerprint()  # keying needs no decode
    with pytest.raises(StoredProductBroken, match="does not decode and verify"):
        p.module  # noqa: B018
    assert dropped == [True]
