"""``accy tune``: the command, and the local cluster it starts (:func:`tune_cluster`)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from accy.errors import AccyError


@contextlib.contextmanager
def tune_cluster(workers: int = 2, *, processes: bool = True) -> Iterator[Any]:
    """accy's local cluster (:func:`accy.distributed.local.local_cluster`): it declares
    the timer resources tuning needs (``CPU_TIMER`` on every worker, ``GPU_TIMER`` on
    :data:`~accy.distributed.local.TIMERS_PER_GPU` workers per GPU).

    Example
    -------
    >>> from distributed import Client
    >>> with tune_cluster(1, processes=False) as c, Client(c) as cl:
    ...     sorted(cl.scheduler_info()["workers"].popitem()[1]["resources"])
    ['CPU_TIMER']
    """
    from accy.distributed.local import local_cluster

    cluster = local_cluster(workers, processes=processes,
                            devices=None if processes else [])
    try:
        yield cluster
    finally:
        cluster.close()


def tune_main(sweeps: Sequence[str], *, scheduler: str | None, workers: int | None,
              cache: str | None, report: str | None, html: str | None, reps: int,
              retune: bool, check: int, echo: Callable[[str], None], progress: bool = True,
              force_workers: bool = False, max_variants: int | None = None,
              detail: bool = False) -> int:
    """``accy tune``: returns the exit code (0: every group has a winner and no variant
    failed or was wrong; 1 otherwise; the report and the database are written either way).
    """
    from tqdm import tqdm

    from accy.distributed.batch import check_inputs, connect, shut_down
    from accy.tune.report import format_table, problem_lines, write_html
    from accy.tune.tuner import tune

    # the same checks, cluster (GPU_TIMER/CPU_TIMER declared) and shutdown as accy batch
    variants, store_url = check_inputs(sweeps, scheduler, cache, report, html, max_variants)
    client, cluster = connect(scheduler, workers, force_workers)
    try:
        compiled = tqdm(total=len(variants), unit="variant", desc="compile",
                        disable=not progress, file=sys.stderr, dynamic_ncols=True)
        timed = tqdm(unit="group", desc="time", disable=not progress, file=sys.stderr,
                     dynamic_ncols=True)
        result = tune(client, variants, store_url=store_url, reps=reps, retune=retune,
                      check=check, on_compiled=lambda o: compiled.update(1),
                      on_group=lambda g: timed.update(1))
        compiled.close()
        timed.close()
        echo(format_table(result.groups, detail=detail))
        for line in problem_lines(result.groups):
            echo(line)
        data = result.report()
        s = data["summary"]
        echo(f"{s['groups']} groups: {s['tuned']} tuned, {s['reused']} from the database, "
             f"{s['failed']} without a winner; {s['variants']} variants, {s['wrong']} wrong, "
             f"{s['variant_failures']} failed; {s['wall_s']:.2f} s")
        if report:
            _write_json(report, data)
            echo(f"report: {report}")
        if html:
            try:
                write_html(html, data)
            except OSError as e:
                raise AccyError(f"cannot write the HTML page to {html}: "
                                f"{e.strerror or e}") from None
            echo(f"html: {html}")
        return 1 if result.failed else 0
    finally:
        shut_down(client, cluster)


def _write_json(path: str, data: dict[str, Any]) -> None:
    import json

    from accy.files import write_atomic

    try:
        write_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    except OSError as e:
        raise AccyError(f"cannot write the report to {path}: {e.strerror or e}") from None


