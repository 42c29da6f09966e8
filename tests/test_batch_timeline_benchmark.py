"""``benchmarks/batch_timeline.py``'s figures of one batch."""

from __future__ import annotations

import pytest


@pytest.fixture
def timeline(benchmark_script):  # type: ignore[no-untyped-def]
    return benchmark_script("batch_timeline")


def test_concurrency_is_the_mean_count_of_computing_workers_per_step(timeline):
    computes = [(0.0, 0.1), (0.05, 0.1), (0.12, 0.13)]
    assert timeline.concurrency(computes, 0.15) == [1.0, 2.0, 0.2]


def test_a_last_partial_step_is_averaged_over_its_own_length(timeline):
    assert timeline.concurrency([(0.0, 0.12)], 0.12) == [1.0, 1.0, 1.0]
    assert timeline.concurrency([], 0.07) == [0.0, 0.0]
