"""Fixtures for the distributed tests: local clusters that preload accy."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from distributed import Client, LocalCluster

import accy.distributed as ad
from accy.distributed.state import unpin


@contextlib.contextmanager
def _local_cluster(processes: bool = False, n_workers: int = 2,
                   **kwargs: Any) -> Iterator[tuple[LocalCluster, Client]]:
    with LocalCluster(processes=processes, n_workers=n_workers, threads_per_worker=1,
                      dashboard_address=":0", **ad.local_cluster_kwargs(), **kwargs) \
            as cluster, Client(cluster) as client:
        try:
            yield cluster, client
        finally:
            # Release the pinned keys first: no lost-key warnings while closing.
            with contextlib.suppress(Exception):
                unpin(client)


@pytest.fixture
def make_cluster() -> Callable[..., contextlib.AbstractContextManager[tuple[LocalCluster,
                                                                            Client]]]:
    """``with make_cluster(processes=False, n_workers=2) as (cluster, client):`` — a
    ``LocalCluster`` preloading accy (single-thread workers, dashboard on a free
    port) and a client on it; pinned keys are released before it closes."""
    return _local_cluster


@pytest.fixture
def cluster() -> Iterator[tuple[LocalCluster, Client]]:
    """An in-process cluster: two single-thread workers sharing this process (so a
    monkeypatch in the test applies inside the workers too)."""
    with _local_cluster() as pair:
        yield pair


@pytest.fixture
def repro_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Reproducers of failing passes land here (stage tasks read ``ACCY_REPRO_DIR``)."""
    path = tmp_path / "repro"
    monkeypatch.setenv("ACCY_REPRO_DIR", str(path))
    return path
