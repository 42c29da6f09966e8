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
    one worker per GPU).

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
    from distributed import Client
    from tqdm import tqdm

    from accy.distributed import quiet
    from accy.distributed.batch import (
        check_scheduler_address,
        check_store_url,
        local_workers,
    )
    from accy.distributed.state import unpin
    from accy.paths import check_writable_file
    from accy.store import default_store_url
    from accy.sweep import MAX_VARIANTS, load_sweeps
    from accy.tune.report import format_table, problem_lines, write_html
    from accy.tune.tuner import tune

    def warn(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    variants = load_sweeps(list(sweeps), MAX_VARIANTS if max_variants is None else max_variants)
    if not variants:
        raise AccyError("the sweep files define no variant")
    store_url = cache or default_store_url()
    if scheduler:
        check_scheduler_address(scheduler)
    check_store_url(store_url, local=not scheduler)
    for path, what in ((report, "the report"), (html, "the HTML page")):
        if path:
            check_writable_file(path, what)
    with contextlib.ExitStack() as stack:
        if scheduler:
            try:
                client = stack.enter_context(Client(scheduler, timeout="10s"))
            except (OSError, TimeoutError, ValueError, TypeError) as e:
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise AccyError(f"cannot reach the Dask scheduler at {scheduler}: {first}") \
                    from None
        else:
            quiet.install()
            cluster = stack.enter_context(
                tune_cluster(local_workers(workers, force_workers, warn)))
            client = stack.enter_context(Client(cluster))
            stack.callback(_unpin, client, unpin)
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
    return 1  # unreachable (ExitStack does not swallow), for the type checker


def _write_json(path: str, data: dict[str, Any]) -> None:
    import json

    from accy.files import write_atomic

    try:
        write_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    except OSError as e:
        raise AccyError(f"cannot write the report to {path}: {e.strerror or e}") from None


def _unpin(client: Any, unpin: Callable[[Any], None]) -> None:
    try:
        unpin(client)
    except Exception:  # noqa: BLE001 - best effort before shutdown
        pass
