"""The ``accy`` command (INTERFACE.md).

Exit codes: 0 success; 1 a user error (bad program, bad option, failed
compile) printed as one ``error:`` line (``FILE:LINE:COL: error: …`` where
there is a location) and no traceback; 2 a usage error. ``ACCY_DEBUG=1``
shows tracebacks of internal errors.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import click

from accy.errors import AccyError


def _stage_choices() -> tuple[str, ...]:
    from accy.pipeline import PREPARATION_NAMES

    return ("semantic", *PREPARATION_NAMES)


STAGE_CHOICES = _stage_choices()
"""``semantic`` (the input program) and the preparation stages, from the stage table."""


def _shared(f):  # type: ignore[no-untyped-def]
    """Options shared by check, opt, emit, run and compile."""
    f = click.option("--target", "target", default="host", show_default=True,
                     help="host | cuda | cuda:sm_XX")(f)
    f = click.option("--shape", "shapes", multiple=True, metavar="argN=AxB",
                     help="Bind the ? dims of an argument (repeatable).")(f)
    f = click.option("--option", "options", multiple=True, metavar="STAGE.NAME=VALUE",
                     help="Set a stage option (repeatable).")(f)
    return f


def _cluster(f):  # type: ignore[no-untyped-def]
    """Options of the commands that run sweeps on a cluster (batch, tune)."""
    for option in reversed((
        click.option("--scheduler", help="Address of a running Dask scheduler (default: a "
                     "local cluster)."),
        click.option("--workers", type=click.IntRange(1, 256),
                     help="Workers of the local cluster (default: one per core but one, "
                     "at least 2; at most one per core)."),
        click.option("--force-workers", is_flag=True,
                     help="Start --workers N even when N is more than the cores here."),
        click.option("--no-progress", is_flag=True, help="No progress bars."),
        click.option("--max-variants", type=click.IntRange(1), default=100_000,
                     show_default=True, help="Refuse sweeps that define more variants than "
                     "this (counted up front)."))):
        f = option(f)
    return f


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="accy")
def cli() -> None:
    """accy: compile tensor programs (choir, MLIR generic syntax) to kernels."""


def _request(target: str, shapes: Sequence[str], options: Sequence[str]):  # type: ignore[no-untyped-def]
    from accy.preparation.options import RunOptions, parse_shapes

    return RunOptions.parse(target, options), parse_shapes(shapes)


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@_shared
def check(files: tuple[str, ...], target: str, shapes: tuple[str, ...],
          options: tuple[str, ...]) -> None:
    """Parse, verify and run the contract-stage checks on each FILE."""
    from accy.api import check_program

    run_options, bound = _request(target, shapes, options)
    failed = 0
    for path in files:
        try:
            check_program(path, run_options, bound)
        except AccyError as e:
            failed += 1
            _print_error(e)
    if failed:
        raise SystemExit(1)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--to", "to", type=click.Choice(STAGE_CHOICES), default="semantic",
              show_default=True, help="Print the IR after this stage.")
@click.option("--from", "start", type=click.Choice(STAGE_CHOICES), default="semantic",
              show_default=True,
              help="FILE holds this stage's product (an earlier --to dump): resume after it.")
@click.option("--debuginfo", is_flag=True, help="Print loc(...) on every op.")
@_shared
def opt(file: str, to: str, start: str, debuginfo: bool, target: str, shapes: tuple[str, ...],
        options: tuple[str, ...]) -> None:
    """Print the IR of FILE after stage --to, in MLIR generic form."""
    from accy.api import lower_to

    if STAGE_CHOICES.index(to) < STAGE_CHOICES.index(start):
        raise click.UsageError(f"--to {to} comes before --from {start}")
    run_options, bound = _request(target, shapes, options)
    product = lower_to(file, to, run_options, bound, start=start)
    click.echo(product.text(debuginfo), nl=False)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--input", "inputs", multiple=True, type=click.Path(dir_okay=False),
              help="A .npy file per function argument, in order.")
@click.option("--output-dir", required=True, type=click.Path(file_okay=False),
              help="Where result0.npy, result1.npy, … are written.")
@click.option("--reference", is_flag=True, help="Run the NumPy reference interpreter.")
@click.option("--cast", is_flag=True,
              help="Convert inputs whose dtype is not their argument's (else an error).")
@click.option("--tuned", is_flag=True,
              help="Use the options accy tune chose for this program, shapes and target.")
@_shared
def run(file: str, inputs: tuple[str, ...], output_dir: str, reference: bool, cast: bool,
        tuned: bool, target: str, shapes: tuple[str, ...], options: tuple[str, ...]) -> None:
    """Compile, load and run FILE on .npy inputs (or interpret it with --reference)."""
    from accy.api import run_program

    run_options, bound = _request(target, shapes, options)
    paths = run_program(file, list(inputs), output_dir, run_options, bound, reference=reference,
                        cast=cast, tuned=tuned and not reference,
                        on_tuned=lambda c: click.echo(c.describe(), err=True))
    for p in paths:
        click.echo(p)


@cli.command(name="import")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False),
              help="Write the semantic module here instead of standard output.")
@click.option("--debuginfo", is_flag=True, help="Print loc(...) on every op (the ONNX node).")
def import_(model: str, output: str | None, debuginfo: bool) -> None:
    """Import an ONNX MODEL and print its semantic module (MLIR generic form)."""
    from accy.frontends.onnx import import_onnx

    text = import_onnx(model).text(debuginfo)
    if output:
        from accy.files import write_atomic

        write_atomic(output, text)
    else:
        click.echo(text, nl=False)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@_shared
def emit(file: str, target: str, shapes: tuple[str, ...], options: tuple[str, ...]) -> None:
    """Print the generated kernel source for the target (launch table in comments)."""
    from accy.api import emit_source

    run_options, bound = _request(target, shapes, options)
    click.echo(emit_source(file, run_options, bound), nl=False)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--cache", "cache_dir", type=click.Path(file_okay=False),
              help="Persistent store folder: a second process reuses its products.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="Write the JSON report (every receipt) here.")
@click.option("--tuned", is_flag=True,
              help="Use the options accy tune chose (from the --cache store, else the default).")
@_shared
def compile(file: str, cache_dir: str | None, report_path: str | None, tuned: bool,
            target: str, shapes: tuple[str, ...], options: tuple[str, ...]) -> None:
    """One refresh of FILE through the fragment compiler cache."""
    from accy.api import compile_program

    run_options, bound = _request(target, shapes, options)
    variant = compile_program(file, run_options, bound, cache_dir=cache_dir,
                              report_path=report_path, tuned=tuned)
    click.echo(f"{variant['id']}: {variant['status']}")
    if variant.get("tuned"):
        click.echo(f"  {variant['tuned']['note']}")
    for r in variant["stages"]:
        state = "skipped (" + r["skipped"] + ")" if r.get("skipped") else \
            ("reused" + (f" from {r['source']}" if r.get("source") else "") if r["reused"]
             else "ran")
        click.echo(f"  {r['stage']:<9} {r['key'][:16]}  {state:<20} "
                   f"{r['elapsed_ns'] / 1e6:9.3f} ms")
    if report_path:
        click.echo(f"report: {report_path}")


@cli.command()
@click.argument("sweeps", nargs=-1, required=True, type=click.Path(dir_okay=False))
@_cluster
@click.option("--cache", "cache_dir", help="Artifact store: a folder or fsspec URL.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="Write the JSON report here.")
@click.option("--explain", "explain_misses", is_flag=True,
              help="Say why each stage that ran missed its published entry.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False),
              help="Write a self-contained HTML page of the stage timings.")
@click.option("--keep-open", type=click.FloatRange(0), metavar="SECONDS",
              help="Keep the local cluster (and its dashboard) up this long after the batch.")
@click.option("--tuned", is_flag=True,
              help="Compile each variant with the options accy tune chose (on the tuned axes).")
def batch(sweeps: tuple[str, ...], scheduler: str | None, workers: int | None,
          force_workers: bool, cache_dir: str | None, report_path: str | None,
          explain_misses: bool, html_path: str | None, keep_open: float | None,
          no_progress: bool, max_variants: int, tuned: bool) -> None:
    """Recompile every variant of the SWEEP files on a Dask cluster."""
    if scheduler and workers:
        raise click.UsageError("--scheduler and --workers exclude each other")
    from accy.distributed.batch import batch_main

    code = batch_main(sweeps, scheduler=scheduler, workers=workers, cache=cache_dir,
                      report=report_path, explain_misses=explain_misses, html=html_path,
                      keep_open=keep_open, echo=click.echo, progress=not no_progress,
                      force_workers=force_workers, max_variants=max_variants, tuned=tuned)
    if code:
        raise SystemExit(code)


@cli.command()
@click.argument("sweeps", nargs=-1, required=True, type=click.Path(dir_okay=False))
@_cluster
@click.option("--cache", "cache_dir",
              help="Artifact store (a folder or fsspec URL): stages, binaries, tuning database.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="Write the JSON tuning report here.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False),
              help="Write a self-contained HTML page of the timings.")
@click.option("--reps", type=click.IntRange(1, 1000), default=7, show_default=True,
              help="Timed repeats per variant (median, min and max are reported).")
@click.option("--retune", is_flag=True, help="Measure again even where a stored "
              "measurement of the unchanged group exists.")
@click.option("--check", "check", type=click.IntRange(-1), default=3, show_default=True,
              help="Variants besides the winner checked against the reference (-1: all).")
@click.option("--detail", is_flag=True, help="Print every variant's time, not only winners.")
def tune(sweeps: tuple[str, ...], scheduler: str | None, workers: int | None,
         force_workers: bool, cache_dir: str | None, report_path: str | None,
         html_path: str | None, reps: int, retune: bool, check: int, detail: bool,
         no_progress: bool, max_variants: int) -> None:
    """Find the fastest correct variant of each program, target and shapes of the SWEEPs."""
    if scheduler and workers:
        raise click.UsageError("--scheduler and --workers exclude each other")
    from accy.tune.command import tune_main

    code = tune_main(sweeps, scheduler=scheduler, workers=workers, cache=cache_dir,
                     report=report_path, html=html_path, reps=reps, retune=retune,
                     check=check, echo=click.echo, progress=not no_progress,
                     force_workers=force_workers, max_variants=max_variants, detail=detail)
    if code:
        raise SystemExit(code)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, exists=False))
def repro(file: str) -> None:
    """Replay a captured failure reproducer."""
    from accy.api import check_reproducer
    from accy.choir.passes import Reproducer
    from accy.pipeline import replay

    r = Reproducer.read(file)
    check_reproducer(r)
    click.echo(f"replaying pipeline '{r.pipeline}', pass '{r.pass_name}' "
               f"(captured: {r.message})", err=True)
    replay(r)
    click.echo("the reproducer no longer fails")


def _print_error(e: BaseException) -> None:
    text = str(e)
    if not (isinstance(e, AccyError) and e.loc is not None and e.loc.known):
        text = f"error: {text}"
    click.echo(text.splitlines()[0] if text else "error", err=True)
    rest = text.splitlines()[1:]
    if rest and os.environ.get("ACCY_DEBUG"):
        click.echo("\n".join(rest), err=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: returns the exit code (0 ok, 1 user error, 2 usage error)."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="accy",
                 standalone_mode=False)
    except click.exceptions.Exit as e:
        return int(e.exit_code or 0)
    except click.exceptions.Abort as e:
        if isinstance(e.__cause__, KeyboardInterrupt):  # click turns Ctrl-C into Abort
            click.echo("error: interrupted", err=True)
            return 130
        click.echo("error: aborted", err=True)
        return 1
    except click.UsageError as e:
        e.show()
        return 2
    except click.ClickException as e:
        e.show()
        return 1
    except AccyError as e:
        _print_error(e)
        return 1
    except SystemExit as e:
        return int(e.code or 0) if isinstance(e.code, int) or e.code is None else 1
    except KeyboardInterrupt:
        click.echo("error: interrupted", err=True)
        return 130
    except Exception as e:  # an accy bug: one line unless ACCY_DEBUG is set
        if os.environ.get("ACCY_DEBUG"):
            raise
        first = str(e).splitlines()[0] if str(e) else ""
        click.echo(f"error: internal error: {type(e).__name__}: {first} "
                   f"(set ACCY_DEBUG=1 for a traceback)", err=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
