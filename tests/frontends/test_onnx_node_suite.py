"""The ONNX node-test suite, in CI: every case imports or raises a typed accy error,
and every case in ``onnx_expected_pass.txt`` still passes through the compiled host path.

The cases come from the installed onnx package (``collect_testcases``, sorted:
deterministic). Each supported case is compiled for the host target with the
system C compiler and run in-process on its data sets; its outputs must match
the shipped ones at the case's own tolerances (see ``onnx_suite.py``). A case
that newly passes is only reported (add it to the list); one on the list that
no longer passes fails the suite. Regenerate the list with
``ACCY_ONNX_WRITE_EXPECTED=1 python3 -m pytest tests/frontends/test_onnx_node_suite.py``.
"""

from __future__ import annotations

import collections
import os

import pytest

pytest.importorskip("onnx")

from onnx_suite import EXPECTED, collect, import_case, missing_ops, run_case  # noqa: E402


def _expected() -> set[str]:
    with open(EXPECTED) as f:
        return {line.strip() for line in f if line.strip() and not line.startswith("#")}


@pytest.fixture(scope="module")
def outcomes():  # type: ignore[no-untyped-def]
    out = []
    for case in collect():
        sm, o = import_case(case)
        if sm is not None:
            o = run_case(case, sm, o)
        out.append(o)
    counts = collections.Counter(o.status for o in out)
    supported = counts["passed"] + counts["failed"]
    print(f"\nONNX node tests: passed {counts['passed']} / supported {supported} / "
          f"total {len(out)}; top missing ops: {missing_ops(out).most_common(10)}")
    return out


def test_every_node_test_imports_or_raises_a_typed_error(outcomes) -> None:  # type: ignore[no-untyped-def]
    assert len(outcomes) > 1000
    bugs = [(o.name, o.reason) for o in outcomes if o.status == "traceback"]
    assert bugs == []
    internal = [(o.name, o.reason) for o in outcomes if "internal error" in o.reason]
    assert internal == []


def test_unsupported_errors_name_op_node_and_opset(outcomes) -> None:  # type: ignore[no-untyped-def]
    for o in outcomes:
        if o.status == "unsupported":
            assert "opset" in o.reason and "\n" not in o.reason, (o.name, o.reason)
            assert "ONNX node '" in o.reason or "ONNX graph '" in o.reason, (o.name, o.reason)


def test_expected_node_tests_pass(outcomes) -> None:  # type: ignore[no-untyped-def]
    passed = {o.name for o in outcomes if o.status == "passed"}
    if os.environ.get("ACCY_ONNX_WRITE_EXPECTED"):
        with open(EXPECTED, "w") as f:
            f.write("# ONNX node tests that pass through accy's compiled host path "
                    "(onnx==1.23.2)\n")
            f.writelines(f"{n}\n" for n in sorted(passed))
    expected = _expected()
    new = sorted(passed - expected)
    if new:
        print(f"\nnewly passing ({len(new)}): {', '.join(new)}")
    reasons = {o.name: f"{o.status}: {o.reason}" for o in outcomes}
    regressed = {n: reasons.get(n, "not collected") for n in sorted(expected - passed)}
    assert regressed == {}


def test_node_test_import_is_fast(outcomes) -> None:  # type: ignore[no-untyped-def]
    times = sorted(o.import_s for o in outcomes if o.status in ("passed", "failed"))
    p95 = times[int(0.95 * (len(times) - 1))]
    print(f"\nimport of a supported node test: median {1e3 * times[len(times) // 2]:.2f} ms, "
          f"p95 {1e3 * p95:.2f} ms, max {1e3 * times[-1]:.2f} ms")
    assert p95 <= 0.050
