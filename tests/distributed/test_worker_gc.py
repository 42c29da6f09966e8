"""accy's GC policy for its worker processes (:func:`accy.distributed.tune_worker_gc`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import dask
import pytest

from accy.distributed import WORKER_GC_THRESHOLDS, tune_worker_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_the_policy_freezes_what_lives_and_raises_the_thresholds(restored_gc):
    gc.unfreeze()
    assert tune_worker_gc() == WORKER_GC_THRESHOLDS
    assert gc.get_threshold() == WORKER_GC_THRESHOLDS
    assert gc.get_freeze_count() > 0


@pytest.mark.parametrize("value, expect", [("100 5 5", (100, 5, 5)), ("100,5,5", (100, 5, 5)),
                                           ([300, 2, 3], (300, 2, 3))])
def test_the_config_names_the_thresholds(restored_gc, value, expect):
    with dask.config.set({"accy.worker-gc": value}):
        assert tune_worker_gc() == expect
    assert gc.get_threshold() == expect


@pytest.mark.parametrize("off", [False, "false", "off"])
def test_the_config_can_leave_the_collector_alone(restored_gc, off):
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()
    with dask.config.set({"accy.worker-gc": off}):
        assert tune_worker_gc() is None
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


@pytest.mark.parametrize("bad", ["1 2", [0, 1, 1], "a b c"])
def test_a_bad_config_is_an_error_that_says_so(restored_gc, bad):
    before = gc.get_threshold()
    with dask.config.set({"accy.worker-gc": bad}), pytest.raises(ValueError, match="three"):
        tune_worker_gc()
    assert gc.get_threshold() == before
