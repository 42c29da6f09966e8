"""The Python API behind the command line: load, check, lower, run.

Example
-------
>>> import numpy as np, tempfile, os
>>> from accy.api import run_program
>>> # run_program("graphs/softmax.mlir", ["x.npy"], "out", reference=True)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from accy.errors import AccyError
from accy.preparation.options import RunOptions
from accy.preparation.products import Product, SemanticModule


def load_program(path: str) -> SemanticModule:
    """Parse and verify a program file."""
    return SemanticModule.from_file(path)


def check_program(path: str, options: RunOptions | None = None,
                  shapes: Mapping[int, tuple[int, ...]] | None = None) -> SemanticModule:
    """Parse, verify and run the contract stage (shape and dtype checks, folding)."""
    from accy.pipeline import prepare_through

    sm = load_program(path)
    prepare_through(sm, "contract", options or RunOptions(), shapes or {})
    return sm


def load_product(path: str, stage: str) -> Product:
    """A dumped product of ``stage`` (``accy opt --to STAGE`` output), parsed and verified."""
    from accy.choir.parser import parse_file
    from accy.pipeline import stage as lookup

    if stage == "semantic":
        return load_program(path)
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

    product = load_product(path, start)
    if stage == start:
        return product
    return prepare_through(product, stage, options or RunOptions(), shapes or {}).product


def emit_source(path: str, options: RunOptions | None = None,
                shapes: Mapping[int, tuple[int, ...]] | None = None) -> str:
    """The target's translation unit for the program, launch table in comments."""
    from accy.preparation.passes.target import launch_table_comment

    product = lower_to(path, "target", options, shapes)
    source = product.module.attributes["target.source"].value  # type: ignore[attr-defined]
    return source + launch_table_comment(product.module)


def variant_id(path: str, options: RunOptions, shapes: Mapping[int, tuple[int, ...]]) -> str:
    """The readable id of one variant: ``softmax[target=host,arg0=8x4096,kernel.block_size=128]``."""
    from accy.sweep import Variant

    return Variant(path, str(options.target), dict(shapes), options.assignments()).id


def compile_program(path: str, options: RunOptions | None = None,
                    shapes: Mapping[int, tuple[int, ...]] | None = None, *,
                    cache_dir: str | None = None, report_path: str | None = None,
                    load: bool = True) -> dict:
    """One refresh through a :class:`FragmentCompilerCache`; returns the variant's report entry.

    With ``cache_dir``, stage products and compiled fragments are kept in a
    persistent store there, so a second process reuses them.
    """
    from accy.executable.cache import FragmentCompilerCache
    from accy.preparation.cache import PreparationFailed
    from accy.preparation.report import variant_json, write_report
    from accy.preparation.stages import PreparationRequest
    from accy.store import ArtifactStore, default_max_bytes

    options = options or RunOptions()
    shapes = dict(shapes or {})
    sm = load_program(path)
    store = ArtifactStore(cache_dir, default_max_bytes()) if cache_dir else None
    cache = FragmentCompilerCache(store=store, load=load)
    vid = variant_id(path, options, shapes)
    request = PreparationRequest(source=path, variant=vid, options=options, shapes=shapes)
    try:
        update = cache.refresh_from_semantic_module(sm, request)
    except PreparationFailed as e:
        entry = variant_json(vid, "failed", e.report, e.failure)
        if report_path:
            write_report(report_path, [entry])
        raise
    entry = variant_json(vid, "ok", update.report)
    if report_path:
        write_report(report_path, [entry])
    return entry


def load_inputs(paths: Sequence[str]) -> list[np.ndarray]:
    arrays = []
    for p in paths:
        try:
            arrays.append(np.load(p, allow_pickle=False))
        except (OSError, ValueError) as e:
            raise AccyError(f"cannot read input {p}: {e}") from None
    return arrays


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
    os.makedirs(output_dir, exist_ok=True)
    paths = []
    for i, r in enumerate(results):
        p = os.path.join(output_dir, f"result{i}.npy")
        np.save(p, np.asarray(r))
        paths.append(p)
    return paths


def run_program(path: str, inputs: Sequence[str], output_dir: str,
                options: RunOptions | None = None,
                shapes: Mapping[int, tuple[int, ...]] | None = None, *,
                reference: bool = False) -> list[str]:
    """Run the program on ``.npy`` inputs; write ``resultN.npy`` files; return their paths."""
    arrays = load_inputs(inputs)
    from accy.frontends import is_frontend_file

    if is_frontend_file(path):  # one --input per graph input; shape inputs bind at import
        from accy.frontends.onnx import import_onnx_with_inputs

        sm, arrays = import_onnx_with_inputs(path, arrays)
    else:
        sm = load_program(path)
    if reference:
        from accy.reference import run_reference

        results = run_reference(sm.module, arrays)
    else:
        from accy.executable.cache import FragmentCompilerCache
        from accy.preparation.stages import PreparationRequest

        options = options or RunOptions()
        bound = bind_shapes_from_inputs(sm, arrays, shapes or {})
        cache = FragmentCompilerCache()
        update = cache.refresh_from_semantic_module(
            sm, PreparationRequest(source=path, options=options, shapes=bound))
        if update.fragment is None:
            raise AccyError(f"cannot run a {options.target} fragment here: no GPU "
                            f"(use --target host, or --reference)")
        results = [np.asarray(r) if not hasattr(r, "get") else r.get()
                   for r in update.fragment(*arrays)]
    return save_results(results, output_dir)
