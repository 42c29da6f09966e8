"""Bounded fuzzing of the parser and the wire decoder: only typed accy errors escape.

A few seconds each in CI; ``benchmarks/fuzz_parser.py`` runs the long version.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest

from accy.choir.fuzz import (
    Tally,
    check_text,
    check_wire,
    text_mutations,
    wire_bombs,
    wire_mutations,
)
from accy.choir.parser import parse_module
from accy.choir.wire import encode

GRAPHS = sorted((Path(__file__).resolve().parents[2] / "graphs").glob("*.mlir"))
SEEDS = [p.read_text() for p in GRAPHS]


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _assert_clean(tally: Tally) -> None:
    assert tally.untyped == 0 and tally.roundtrip_mismatches == 0, tally.examples
    assert tally.inputs == tally.accepted + tally.typed_errors + tally.untyped


@pytest.mark.parametrize("seed", [0, 1])
def test_mutated_programs_give_a_module_or_a_parse_error(seed: int) -> None:
    tally = Tally()
    for text in text_mutations(SEEDS, 600, seed=seed):
        check_text(text, tally)
    _assert_clean(tally)
    assert tally.accepted > 0 and tally.typed_errors > 0  # the mutations reach both ends


def test_mutated_wire_blobs_and_bombs_stay_typed_and_bounded() -> None:
    blobs = [encode(parse_module(s)) for s in SEEDS]
    before = _rss_mib()
    tally = Tally()
    slowest = 0.0
    for data in wire_mutations(blobs, 3000, seed=0):
        start = time.perf_counter()
        check_wire(data, tally)
        slowest = max(slowest, time.perf_counter() - start)
    _assert_clean(tally)
    assert slowest < 1.0
    assert _rss_mib() - before < 200  # a 10^10-element splat is one value, never 40 GB


def test_every_bomb_is_rejected_or_held_in_constant_space() -> None:
    tally = Tally()
    for data in wire_bombs():
        start = time.perf_counter()
        check_wire(data, tally)
        assert time.perf_counter() - start < 1.0
    _assert_clean(tally)
    assert tally.accepted >= 1  # the 10^10 splat decodes (and fingerprints, and prints)
