"""The ONNX node-test suite (``onnx.backend.test.case.node``) through accy's host path.

Shared by ``test_onnx_node_suite.py``, ``test_onnx_gpu.py`` and
``python3 tests/frontends/onnx_suite.py [NAME-PART] [--target cuda:sm_90] [--sample N]``
(which prints the counts and the top missing ops; ``--sample N`` runs every
k-th case of the expected-pass list, at least N of them). Each test case is imported
with its first data set's values bound (graph inputs that only feed shape
operands), compiled for the host target (the system C compiler) and run on
every data set; outputs are compared with the shipped ones at the case's own
tolerances (ONNX's rtol=1e-3, atol=1e-7 by default), dtypes exactly.
"""

from __future__ import annotations

import collections
import os
import re
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from accy.errors import AccyError


@dataclass
class Outcome:
    name: str
    ops: tuple[str, ...]
    status: str
    """``passed``, ``failed`` (imported but wrong or not compiling), ``unsupported``
    (a typed accy error on import) or ``traceback`` (anything else: a bug)."""
    reason: str = ""
    import_s: float = 0.0
    extra: dict = field(default_factory=dict)


def collect() -> list:
    """Every node test case of the installed onnx package, sorted by name."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    return sorted(cases, key=lambda c: c.name)


def _as_array(v):  # type: ignore[no-untyped-def]
    """A data-set value as an array accy takes (bf16 is held as float32 in accy)."""
    if type(v).__name__ == "TensorProto":
        from onnx import numpy_helper

        v = numpy_helper.to_array(v)
    if not isinstance(v, (np.ndarray, np.generic)):
        return v
    a = np.asarray(v)
    return a.astype(np.float32) if a.dtype.name == "bfloat16" else a


def import_case(case):  # type: ignore[no-untyped-def]
    """(semantic module or None, outcome of the import)."""
    from accy.frontends.onnx import import_onnx

    ops = tuple(sorted({n.op_type for n in case.model.graph.node}))
    names = [i.name for i in case.model.graph.input]
    first = case.data_sets[0][0] if case.data_sets else []
    values = {n: _as_array(v) for n, v in zip(names, first)
              if isinstance(_as_array(v), np.ndarray)}
    t = time.perf_counter()
    try:
        sm = import_onnx(case.model, file=f"{case.name}.onnx", input_values=values)
    except AccyError as e:
        return None, Outcome(case.name, ops, "unsupported", str(e).splitlines()[0],
                             time.perf_counter() - t)
    except Exception as e:  # noqa: BLE001 — counted, and the suite asserts there are none
        return None, Outcome(case.name, ops, "traceback", f"{type(e).__name__}: {e}",
                             time.perf_counter() - t)
    return sm, Outcome(case.name, ops, "imported", "", time.perf_counter() - t)


def _compare(out: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> str:
    ref = np.asarray(ref)
    out = np.asarray(out)
    if ref.dtype.name == "bfloat16":  # accy returns bf16 results held in float32
        ref = ref.astype(np.float32)
    if ref.dtype != out.dtype:
        return f"dtype {out.dtype}, expected {ref.dtype}"
    if ref.shape != out.shape:
        return f"shape {out.shape}, expected {ref.shape}"
    if ref.dtype.kind == "f":
        if not np.allclose(out.astype(np.float64), ref.astype(np.float64), rtol=rtol,
                           atol=atol, equal_nan=True):
            err = np.nanmax(np.abs(out.astype(np.float64) - ref.astype(np.float64))) \
                if out.size else 0.0
            return f"values differ (max abs err {err:.3g})"
    elif not np.array_equal(out, ref):
        return "values differ"
    return ""


def run_case(case, sm, outcome: Outcome, compiled: bool = True,  # type: ignore[no-untyped-def]
             target: str = "host") -> Outcome:
    """Run an imported case on every data set (compiled for ``target``, or the reference)."""
    from accy.api import bind_shapes_from_inputs

    names = [i.name for i in case.model.graph.input]
    args = sm.meta["onnx_arguments"]
    fragment = None
    try:
        for inputs, outputs in case.data_sets:
            by_name = dict(zip(names, (_as_array(v) for v in inputs)))
            arrays = [np.require(by_name[a], requirements='C') for a in args]
            if compiled:
                if fragment is None:
                    from accy.executable.cache import FragmentCompilerCache
                    from accy.preparation.options import RunOptions
                    from accy.preparation.stages import PreparationRequest

                    shapes = bind_shapes_from_inputs(sm, arrays, {})
                    update = FragmentCompilerCache().refresh_from_semantic_module(
                        sm, PreparationRequest(source=case.name,
                                               options=RunOptions.parse(target), shapes=shapes))
                    fragment = update.fragment
                results = [np.asarray(r) for r in fragment(*arrays)]
            else:
                from accy.reference import run_reference

                results = run_reference(sm.module, arrays)
            if len(results) != len(outputs):
                outcome.status, outcome.reason = "failed", "result count differs"
                return outcome
            for k, (o, r) in enumerate(zip(results, outputs)):
                why = _compare(o, _as_array(r), case.rtol, case.atol)
                if why:
                    outcome.status, outcome.reason = "failed", f"output {k}: {why}"
                    return outcome
    except AccyError as e:
        outcome.status, outcome.reason = "failed", str(e).splitlines()[0][:300]
        return outcome
    except Exception as e:  # noqa: BLE001 — a compile/run bug; reported as a failure
        outcome.status, outcome.reason = "failed", f"{type(e).__name__}: {e}"[:300]
        return outcome
    outcome.status = "passed"
    return outcome


def missing_ops(outcomes: list[Outcome]) -> collections.Counter:
    """Unsupported ops by the number of node tests they block (the op named in the error)."""
    c: collections.Counter = collections.Counter()
    for o in outcomes:
        if o.status == "unsupported":
            m = re.search(r"\((\w+), opset", o.reason)
            key = m.group(1) if m else ("dtype" if "dtype" in o.reason else "graph")
            c[key] += 1
    return c


EXPECTED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "onnx_expected_pass.txt")


def expected_pass() -> list[str]:
    """The checked-in names of the cases that pass on the host, sorted."""
    with open(EXPECTED) as f:
        return sorted(line.strip() for line in f if line.strip() and not line.startswith("#"))


def sample(n: int) -> set[str]:
    """Every k-th expected-pass case, k chosen so that at least ``n`` are taken."""
    names = expected_pass()
    step = max(1, len(names) // max(1, n))
    return set(names[::step])


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="the ONNX node tests through accy")
    parser.add_argument("only", nargs="?", help="run only the cases whose name contains this")
    parser.add_argument("--target", default="host")
    parser.add_argument("--sample", type=int, default=0,
                        help="run a deterministic sample of at least N expected-pass cases")
    args = parser.parse_args()
    cases = collect()
    chosen = sample(args.sample) if args.sample else None
    outcomes = []
    t0 = time.perf_counter()
    for case in cases:
        if args.only and args.only not in case.name:
            continue
        if chosen is not None and case.name not in chosen:
            continue
        sm, o = import_case(case)
        if sm is not None:
            o = run_case(case, sm, o, target=args.target)
        outcomes.append(o)
        if o.status == "failed":
            print(f"FAIL {o.name}: {o.reason}", flush=True)
    counts = collections.Counter(o.status for o in outcomes)
    supported = counts["passed"] + counts["failed"]
    imp = sorted(o.import_s for o in outcomes if o.status in ("passed", "failed"))
    print(f"[{args.target}] passed {counts['passed']} / supported {supported} / "
          f"total {len(outcomes)} "
          f"(tracebacks {counts['traceback']}) in {time.perf_counter() - t0:.0f} s")
    if imp:
        print(f"import ms: median {1e3 * imp[len(imp) // 2]:.2f}, "
              f"max {1e3 * imp[-1]:.2f}")
    print("top missing:", missing_ops(outcomes).most_common(25))


if __name__ == "__main__":
    main()
