"""The local cluster's processes start with Dask's scratch-folder timing warning
filtered (``accy.distributed.quiet.python_warnings``)."""

from __future__ import annotations

import os
import subprocess
import sys

import dask.config

from accy.distributed.quiet import SCRATCH_WARNING, python_warnings

WARN = (f"import warnings; warnings.warn({SCRATCH_WARNING + '. (1.17s) This is often due'!r}, "
        "UserWarning); warnings.warn('another warning', UserWarning)")


def _stderr(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    if env_value is not None:
        env["PYTHONWARNINGS"] = env_value
    return subprocess.run([sys.executable, "-c", WARN], env=env, capture_output=True,
                          text=True, check=True).stderr


def test_the_filter_drops_that_warning_in_a_new_process_and_nothing_else() -> None:
    assert SCRATCH_WARNING in _stderr(None)  # Python shows it unfiltered
    quiet = _stderr(python_warnings())
    assert SCRATCH_WARNING not in quiet and "another warning" in quiet
    assert "another warning" in _stderr(python_warnings("default"))  # the user's kept


def test_the_local_cluster_spawns_its_workers_with_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """What the nannies read as they spawn (``pre-spawn-environ``), captured as the local
    cluster is built."""
    import distributed

    from accy.distributed.local import local_cluster

    seen: dict[str, object] = {}

    def fake(*args: object, **kwargs: object) -> str:
        seen.update(dask.config.get("distributed.nanny.pre-spawn-environ"))
        return "cluster"

    monkeypatch.setattr(distributed, "SpecCluster", fake)
    monkeypatch.setenv("PYTHONWARNINGS", "default")
    assert local_cluster(1, devices=[]) == "cluster"
    assert seen["PYTHONWARNINGS"] == python_warnings("default")
    assert "MALLOC_TRIM_THRESHOLD_" in seen  # Dask's own entries stay
