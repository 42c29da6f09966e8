"""The Python API behind the command line: load, check, lower, run.

Example
-------
>>> import numpy as np, tempfile, os
>>> from accy.api import run_program
>>> # run_program("graphs/softmax.mlir", ["x.npy"], "out", reference=True)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from accy.errors import AccyError
from accy.paths import check_writable_file, ensure_output_dir
from accy.preparation.options import RunOptions
from accy.preparation.products import Product, SemanticModule, TargetJob
from accy.preparation.report import write_report_file

if TYPE_CHECKING:
    from accy.choir.passes import Reproducer
    from accy.tune.database import TunedChoice


def load_program(path: str, shapes: Mapping[int, tuple[int, ...]] | None = None) \
        -> SemanticModule:
    """Parse and verify a program file (an ONNX model imports with ``shapes`` bound)."""
    from accy.frontends import load_program as load

    return load(path, shapes)


def check_program(path: str, options: RunOptions | None = None,
                  shapes: Mapping[int, tuple[int, ...]] | None = None) -> SemanticModule:
    """Parse, verify and run the contract stage (shape and dtype checks, folding)."""
    from accy.pipeline import prepare_through

    sm = load_program(path, shapes)
    prepare_through(sm, "contract", options or RunOptions(), shapes or {})
    return sm


def load_product(path: str, stage: str,
                 shapes: Mapping[int, tuple[int, ...]] | None = None) -> Product:
    """A dumped product of ``stage`` (``accy opt --to STAGE`` output), parsed and verified."""
    from accy.choir.parser import parse_file
    from accy.pipeline import stage as lookup

    if stage == "semantic":
        return load_program(path, shapes)
    product = lookup(stage).product(parse_file(path), {"source": path})
    product.verify()
    return product  # type: ignore[no-any-return]


def lower_to(path: str, stage: str, options: RunOptions | None = None,
             shapes: Mapping[int, tuple[int, ...]] | None = None,
             start: str = "semantic") -> Product:
    """The product of ``stage`` for the program at ``path`` (``semantic`` = the input).

    ``start`` says what the file holds: the program (``semantic``), or a dumped
    product of that stage, from which the stages after it run (``accy opt --from``).
    """
    from accy.pipeline import prepare_through

    product = load_product(path, start, shapes)
    if stage == start:
        return product
    return prepare_through(product, stage, options or RunOptions(), shapes or {}).product


def emit_source(path: str, options: RunOptions | None = None,
                shapes: Mapping[int, tuple[int, ...]] | None = None) -> str:
    """The target's translation unit for the program, launch table in comments."""
    from accy.preparation.passes.target import launch_table_comment

    product = lower_to(path, "target", options, shapes)
    assert isinstance(product, TargetJob)
    return product.source + launch_table_comment(product.module)


def variant_id(path: str, options: RunOptions, shapes: Mapping[int, tuple[int, ...]]) -> str:
    """The readable id of one variant: ``softmax[target=host,arg0=8x4096,kernel.block_size=128]``."""
    from accy.sweep import Variant

    return Variant(path, str(options.target), dict(shapes), options.assignments()).id


def apply_tuned(sm: SemanticModule, options: RunOptions,
                shapes: Mapping[int, tuple[int, ...]], store_url: str | None = None) \
        -> tuple[RunOptions, TunedChoice]:
    """``options`` with the tuned winner's (``--tuned``): from the tuning database in
    ``store_url`` (default: the default store), for this program, shapes and target.
    Options that differ from the defaults in ``options`` win over the tuned ones.

    Raises
    ------
    AccyError
        Nothing was tuned for this program, shapes, target and accy version.
    """
    from accy.store import default_store_url
    from accy.tune.database import tuned_options

    url = store_url or default_store_url()
    choice = tuned_options(sm, str(options.target), shapes, url)
    if choice is None:
        shown = variant_id(sm.meta.get("source", "program"), RunOptions(options.target), shapes)
        raise AccyError(f"--tuned: no tuning of {shown} for this accy version in {url} "
                        f"(run accy tune on a sweep of it first)")
    return RunOptions.parse(options.target, {**choice.options, **options.assignments()}), choice


def compile_program(path: str, options: RunOptions | None = None,
                    shapes: Mapping[int, tuple[int, ...]] | None = None, *,
                    cache_dir: str | None = None, report_path: str | None = None,
                    load: bool = True, tuned: bool = False) -> dict:
    """One refresh through a :class:`FragmentCompilerCache`; returns the variant's report entry.

    With ``cache_dir``, stage products and compiled fragments are kept in a
    persistent store there, so a second process reuses them. With ``tuned``, the
    options come from the tuning database (:func:`apply_tuned`, in ``cache_dir``'s
    store or the default one) and the entry's ``tuned`` says so.
    """
    from accy.executable.cache import FragmentCompilerCache
    from accy.preparation.cache import PreparationFailed
    from accy.preparation.report import variant_json
    from accy.preparation.stages import PreparationRequest
    from accy.store import ArtifactStore, default_max_bytes

    options = options or RunOptions()
    shapes = dict(shapes or {})
    if report_path:
        check_writable_file(report_path, "the report")
    sm = load_program(path, shapes)
    choice = None
    if tuned:
        options, choice = apply_tuned(sm, options, shapes, cache_dir)
    store = ArtifactStore(cache_dir, default_max_bytes()) if cache_dir else None
    cache = FragmentCompilerCache(store=store, load=load)
    vid = variant_id(path, options, shapes)
    request = PreparationRequest(source=path, variant=vid, options=options, shapes=shapes)
    try:
        update = cache.refresh_from_semantic_module(sm, request)
    except PreparationFailed as e:
        entry = variant_json(vid, "failed", e.report, e.failure)
        if choice is not None:
            entry["tuned"] = choice.to_json()
        if report_path:
            write_report_file(report_path, [entry])
        raise
    entry = variant_json(vid, "ok", update.report)
    if choice is not None:
        entry["tuned"] = choice.to_json()
    if report_path:
        write_report_file(report_path, [entry])
    return entry


NPY_MAGIC = b"\x93NUMPY"
"""The first bytes of every ``.npy`` file."""


def read_npy(path: str) -> np.ndarray:
    """The array in the ``.npy`` file at ``path``, checked before anything is allocated.

    The header is read first: a file that is not a ``.npy`` (an ``.npz``
    archive, text, an empty file), an array of Python objects, or a header
    whose shape needs more bytes than the file holds is an :class:`AccyError`
    naming the file, not a pickle warning or a huge allocation.

    Example
    -------
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "x.npy")
    >>> np.save(p, np.ones((2, 3), np.float32))
    >>> read_npy(p).shape
    (2, 3)
    """
    fmt = np.lib.format
    try:
        with open(path, "rb") as f:
            magic = f.read(len(NPY_MAGIC))
            if magic != NPY_MAGIC:
                raise AccyError(f"cannot read input {path}: {_not_npy(magic)}")
            f.seek(0)
            try:
                version = fmt.read_magic(f)
                shape, fortran, dtype = (fmt.read_array_header_1_0(f) if version == (1, 0)
                                         else fmt.read_array_header_2_0(f))
            except (ValueError, EOFError, SyntaxError, TypeError) as e:
                raise AccyError(f"cannot read input {path}: not a valid .npy header "
                                f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") \
                    from None
            if dtype.hasobject:
                raise AccyError(f"cannot read input {path}: it holds Python objects "
                                f"(dtype {dtype}); accy reads numeric arrays only")
            need = int(np.prod(shape, dtype=object)) * dtype.itemsize
            have = os.fstat(f.fileno()).st_size - f.tell()
            if need > have:
                raise AccyError(f"cannot read input {path}: its header declares shape "
                                f"{tuple(shape)} of {dtype} ({need} bytes) but the file holds "
                                f"{have} bytes of data (truncated or corrupt)")
            f.seek(0)
            return np.load(f, allow_pickle=False)  # type: ignore[no-any-return]
    except OSError as e:
        raise AccyError(f"cannot read input {path}: {e.strerror or e}") from None
    except (ValueError, EOFError) as e:
        raise AccyError(f"cannot read input {path}: {e}") from None


def _not_npy(start: bytes) -> str:
    if not start:
        return "the file is empty (not a .npy file)"
    if start.startswith(b"PK"):
        return ("it is a .npz archive, not a .npy file "
                "(save each argument with np.save, one --input per argument)")
    return "not a .npy file (it does not start with the NumPy magic string)"


def load_inputs(paths: Sequence[str]) -> list[np.ndarray]:
    """The arrays of the ``--input`` files, in order (see :func:`read_npy`)."""
    return [read_npy(p) for p in paths]


def check_input_dtypes(sm: SemanticModule, arrays: Sequence[np.ndarray], *,
                       cast: bool = False) -> list[np.ndarray]:
    """``arrays`` checked against the dtypes of the program's arguments.

    An input whose dtype is not the argument's is an error, unless ``cast``,
    which converts it (never complex to real: that would drop the imaginary part).
    """
    from accy.choir.attributes import TensorType, numpy_dtype

    args = sm.entry().function_type.inputs
    if len(arrays) != len(args):
        return list(arrays)  # the run (or the reference) says how many it takes
    out = []
    for i, (a, t) in enumerate(zip(arrays, args)):
        if not isinstance(t, TensorType):
            out.append(a)
            continue
        want = numpy_dtype(t.element)
        if a.dtype != want:
            if not cast:
                raise AccyError(f"input {i} has dtype {a.dtype} but argument {i} is {t} "
                                f"(needs {want}; --cast converts it)")
            if np.iscomplexobj(a) and want.kind != "c":
                raise AccyError(f"input {i} is {a.dtype}: casting it to {want} would drop "
                                f"the imaginary part")
            a = a.astype(want)
        out.append(a)
    return out


def bind_shapes_from_inputs(sm: SemanticModule, arrays: Sequence[np.ndarray],
                            shapes: Mapping[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
    """``--shape`` bindings completed from the inputs' shapes."""
    from accy.choir.attributes import TensorType

    args = sm.entry().function_type.inputs
    if len(arrays) != len(args):
        raise AccyError(f"the program takes {len(args)} input(s), got {len(arrays)} --input")
    out = dict(shapes)
    for i, (a, t) in enumerate(zip(arrays, args)):
        if isinstance(t, TensorType) and not t.is_static and i not in out:
            out[i] = tuple(a.shape)
    return out


def save_results(results: Sequence[np.ndarray], output_dir: str) -> list[str]:
    """Write ``result0.npy``, ``result1.npy``, … into ``output_dir``; return their paths."""
    ensure_output_dir(output_dir)
    paths = []
    for i, r in enumerate(results):
        p = os.path.join(output_dir, f"result{i}.npy")
        try:
            np.save(p, np.asarray(r))
        except OSError as e:
            raise AccyError(f"cannot write {p}: {e.strerror or e}") from None
        paths.append(p)
    return paths


def run_program(path: str, inputs: Sequence[str], output_dir: str,
                options: RunOptions | None = None,
                shapes: Mapping[int, tuple[int, ...]] | None = None, *,
                reference: bool = False, cast: bool = False, tuned: bool = False,
                on_tuned: Callable[[TunedChoice], None] | None = None) -> list[str]:
    """Run the program on ``.npy`` inputs; write ``resultN.npy`` files; return their paths.

    Each input's dtype must be its argument's; ``cast`` converts those that are not.
    With ``tuned`` the options come from the tuning database (:func:`apply_tuned`)
    and ``on_tuned`` is told the choice.
    """
    ensure_output_dir(output_dir)
    arrays = load_inputs(inputs)
    from accy.frontends import is_frontend_file

    if is_frontend_file(path):  # one --input per graph input; shape inputs bind at import
        from accy.frontends.onnx import import_onnx_with_inputs

        sm, arrays = import_onnx_with_inputs(path, arrays)
    else:
        sm = load_program(path)
    arrays = check_input_dtypes(sm, arrays, cast=cast)
    if reference:
        from accy.reference import run_reference

        results = run_reference(sm.module, arrays)
    else:
        from accy.executable.cache import FragmentCompilerCache
        from accy.preparation.stages import PreparationRequest

        options = options or RunOptions()
        bound = bind_shapes_from_inputs(sm, arrays, shapes or {})
        if tuned:
            options, choice = apply_tuned(sm, options, bound)
            if on_tuned is not None:
                on_tuned(choice)
        cache = FragmentCompilerCache()
        update = cache.refresh_from_semantic_module(
            sm, PreparationRequest(source=path, options=options, shapes=bound))
        if update.fragment is None:
            raise AccyError(f"cannot run a {options.target} fragment here: no GPU "
                            f"(use --target host, or --reference)")
        results = [np.asarray(r) if not hasattr(r, "get") else r.get()
                   for r in update.fragment(*arrays)]
    return save_results(results, output_dir)


def check_reproducer(repro: Reproducer) -> None:
    """A reproducer that names a pipeline, pass or pass options accy does not have is
    an :class:`AccyError` (a replay would otherwise "no longer fail" or crash)."""
    import dataclasses

    from accy.choir.passes import PASS_REGISTRY
    from accy.pipeline import PREPARATION_NAMES, load_passes

    load_passes()
    cls = PASS_REGISTRY.get(repro.pass_name)
    if cls is None:
        raise AccyError(f"unknown pass '{repro.pass_name}' in reproducer")
    # a stage's pass replays under its stage's pipeline name (passes declared
    # elsewhere — a plugin's, a test's — name their own pipelines)
    if cls.__module__.startswith("accy.preparation.passes.") \
            and repro.pipeline not in PREPARATION_NAMES:
        raise AccyError(f"unknown pipeline '{repro.pipeline}' in the reproducer "
                        f"(accy's are {', '.join(PREPARATION_NAMES)})")
    known = [f.name for f in dataclasses.fields(cls) if f.init] \
        if dataclasses.is_dataclass(cls) else []
    unknown = sorted(k for k in repro.pass_options if k not in known)
    if unknown:
        raise AccyError(f"the reproducer gives pass '{repro.pass_name}' unknown option(s) "
                        f"{', '.join(unknown)} (it takes "
                        f"{', '.join(known) if known else 'no options'})")
    try:
        cls(**repro.pass_options)
    except (TypeError, ValueError) as e:
        raise AccyError(f"the reproducer's options for pass '{repro.pass_name}' are not "
                        f"valid: {e}") from None

