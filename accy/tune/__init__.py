"""``accy tune``: find the fastest correct variant per program, shapes and device.

Users recompile many variants mostly to pick the fastest one for a shape on
a GPU (Triton's ``@autotune``, Inductor's max-autotune, TVM MetaSchedule's
tuning database). ``accy tune SWEEP.yaml`` groups a sweep's variants by
(program, target, shapes), compiles them all as ``accy batch`` does, times
each group's fragments on one device of the cluster (CUDA events around
back-to-back launches on a GPU, the monotonic clock on the host; median of
``--reps`` repeats), checks the fastest against the reference interpreter
before choosing it, and records the winner in the artifact store.
``accy compile/run/batch --tuned`` then compile with the winner's options.

- :mod:`.tuner` — :func:`tune`, :func:`group_variants`, :func:`choose_timers`.
- :mod:`.timing` — the worker task: inputs, warm-up, timing, checking.
- :mod:`.database` — record keys, :class:`TuningDatabase`, :func:`tuned_options`.
- :mod:`.report` — the JSON report, the text table, the HTML page.
- :mod:`.command` — ``accy tune`` and :func:`tune_cluster` (a local cluster
  declaring the ``CPU_TIMER``/``GPU_TIMER`` resources).

Example
-------
>>> from accy.tune.tuner import group_variants
>>> from accy.sweep import load_sweep
>>> [g.id for g in group_variants(load_sweep("graphs/sweeps/softmax.yaml"))][:2]
['softmax[target=host,arg0=1024x1024]', 'softmax[target=host,arg0=8192x4096]']
"""

from __future__ import annotations

# The database is what compile/run/batch --tuned read; the tuner (which drives a
# batch) is imported from accy.tune.tuner, so reading a tuned choice never imports
# the batch machinery.
from accy.tune.database import TunedChoice, TuningDatabase, apply_tuning, tuned_options

__all__ = ["tuned_options", "TunedChoice", "TuningDatabase", "apply_tuning"]
