"""The ``accy`` command line (INTERFACE.md): exit codes, one-line errors, and what each
command prints or writes. Most tests call :func:`accy.cli.main` in process; the exit-code
contract and the persistent cache are also checked in real ``python -m accy`` processes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from accy.choir.parser import parse_file, parse_module
from accy.choir.printer import print_op
from accy.cli import STAGE_CHOICES, main
from accy.reference import run_reference

ROOT = Path(__file__).resolve().parents[1]
GRAPHS_DIR = ROOT / "graphs"
GRAPHS = sorted(GRAPHS_DIR.glob("*.mlir"))
SOFTMAX = str(GRAPHS_DIR / "softmax.mlir")
DYNAMIC = str(GRAPHS_DIR / "dynamic.mlir")
MLIR_OPT = "mlir-opt-19"
LOCATED = re.compile(r"^(?P<file>.+):(?P<line>\d+):(?P<col>\d+): error: (?P<message>.+)$")

BAD_PROGRAM = '''"builtin.module"() ({
  "func.func"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<4xf32>):
    %0 = "semantic.softmax"(%x) {axis = 3 : i64} : (tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%0) : (tensor<4xf32>) -> ()
  }) : () -> ()
}) : () -> ()
'''


def accy(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``accy argv`` in process: (exit code, stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    """stderr is exactly one ``error:`` line (located or not) and no traceback."""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("error: ") or LOCATED.match(line), line
    return line


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def save(tmp_path: Path, name: str, array: np.ndarray) -> str:
    path = str(tmp_path / name)
    np.save(path, array)
    return path


# --------------------------------------------------------------------------- check


@pytest.mark.parametrize("path", GRAPHS, ids=[p.name for p in GRAPHS])
def test_check_is_clean_on_every_graph(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert accy(capsys, "check", str(path)) == (0, "", "")


def test_check_takes_several_files(capsys: pytest.CaptureFixture[str]) -> None:
    assert accy(capsys, "check", *map(str, GRAPHS)) == (0, "", "")


def test_check_of_a_malformed_program(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "bad.mlir", BAD_PROGRAM)
    code, out, err = accy(capsys, "check", path)
    assert code == 1 and out == ""
    line = one_error_line(err)
    assert line == f"{path}:4:5: error: 'semantic.softmax' axis 3 is out of range for rank 1"


def test_check_of_a_parse_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "syntax.mlir", BAD_PROGRAM.replace("(%x)", "(%y)"))
    code, _, err = accy(capsys, "check", path)
    assert code == 1
    m = LOCATED.match(one_error_line(err))
    assert m and (m["file"], m["line"], m["col"]) == (path, "4", "29")
    assert m["message"] == "use of undefined value '%y'"


def test_check_reports_each_bad_file_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) \
        -> None:
    bad = write(tmp_path, "bad.mlir", BAD_PROGRAM)
    empty = write(tmp_path, "empty.mlir", "")
    code, _, err = accy(capsys, "check", SOFTMAX, bad, empty)
    assert code == 1
    lines = err.splitlines()
    assert [LOCATED.match(line)["file"] for line in lines] == [bad, empty]  # type: ignore[index]
    assert lines[1] == f"{empty}:1:1: error: empty file: expected a 'builtin.module'"


def test_check_of_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.mlir")
    code, _, err = accy(capsys, "check", missing)
    assert code == 1
    assert one_error_line(err).startswith(f"{missing}:1:1: error: cannot read file:")


def test_check_runs_the_contract_stage(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = accy(capsys, "check", SOFTMAX, "--shape", "arg0=8")
    assert code == 1
    line = one_error_line(err)
    assert "pipeline 'contract', pass 'specialize-shapes'" in line
    assert LOCATED.match(line)


# ----------------------------------------------------------------------------- opt


@pytest.mark.parametrize("path", GRAPHS, ids=[p.name for p in GRAPHS])
def test_opt_to_semantic_prints_text_that_reparses(path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = accy(capsys, "opt", str(path), "--to", "semantic")
    assert (code, err) == (0, "")
    assert print_op(parse_module(out, "stdout")) == out == print_op(parse_file(str(path)))


def test_opt_defaults_to_semantic(capsys: pytest.CaptureFixture[str]) -> None:
    assert accy(capsys, "opt", SOFTMAX) == accy(capsys, "opt", SOFTMAX, "--to", "semantic")


def test_opt_debuginfo_prints_locations(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = accy(capsys, "opt", SOFTMAX, "--debuginfo")
    assert code == 0
    assert f'"semantic.softmax"(%arg0) {{axis = -1 : i64}} : (tensor<?x?xf32>) -> ' \
           f'tensor<?x?xf32> loc("{SOFTMAX}":5:5)' in out
    assert print_op(parse_module(out), debuginfo=True) == out


@pytest.mark.parametrize("stage", STAGE_CHOICES)
def test_opt_to_every_stage(stage: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = accy(capsys, "opt", SOFTMAX, "--to", stage, "--shape", "arg0=8x4096")
    assert (code, err) == (0, "")
    assert print_op(parse_module(out, "stdout")) == out
    if stage != "semantic":
        assert not re.search(r"tensor<[^>]*\?", out)  # every dim bound
    if shutil.which(MLIR_OPT) is None:
        pytest.skip(f"{MLIR_OPT} is not installed")
    proc = subprocess.run([MLIR_OPT, "--allow-unregistered-dialect", "-mlir-print-op-generic"],
                          input=out, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert print_op(parse_module(proc.stdout, "mlir-opt")) == out


def test_opt_to_contract_without_shapes_keeps_dynamic_dims(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = accy(capsys, "opt", SOFTMAX, "--to", "contract")
    assert code == 0
    assert "tensor<?x?xf32>" in out


def test_opt_to_tensor_without_shapes_names_the_shape_option(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = accy(capsys, "opt", DYNAMIC, "--to", "tensor")
    assert code == 1 and out == ""
    line = one_error_line(err)
    assert "--shape arg0=" in line
    assert LOCATED.match(line)


# ------------------------------------------------------------------------- options


def test_unknown_option_lists_the_known_names(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = accy(capsys, "check", SOFTMAX, "--option", "kernel.bogus=1")
    assert code == 1
    line = one_error_line(err)
    assert line.startswith("error: unknown option 'kernel.bogus' (known: ")
    assert "kernel.block_size" in line and "kernel.vector_width" in line


def test_unknown_option_stage(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = accy(capsys, "opt", SOFTMAX, "--option", "linker.fast=1")
    assert code == 1
    assert one_error_line(err).startswith("error: unknown option 'linker.fast' (stages: contract")


@pytest.mark.parametrize("assignment, message", [
    ("kernel.block_size=3", "kernel.block_size must be a power of two, got 3"),
    ("kernel.block_size=big", "kernel.block_size takes an integer, got 'big'"),
    ("memory.reuse=maybe", "memory.reuse takes true or false, got 'maybe'"),
    ("kernel.block_size", "option 'kernel.block_size' must look like STAGE.NAME=VALUE"),
])
def test_bad_option_value(assignment: str, message: str,
                          capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = accy(capsys, "check", SOFTMAX, "--option", assignment)
    assert code == 1
    assert one_error_line(err) == f"error: {message}"


@pytest.mark.parametrize("target, message", [
    ("gpu", "unknown target 'gpu' (expected host, cuda or cuda:sm_XX)"),
    ("cuda:90", "bad CUDA arch '90' (expected e.g. sm_90)"),
])
def test_bad_target(target: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = accy(capsys, "check", SOFTMAX, "--target", target)
    assert code == 1
    assert one_error_line(err) == f"error: {message}"


@pytest.mark.parametrize("shape, message", [
    ("arg0=8by4", "--shape value '8by4' for arg0 must look like 8192x4096"),
    ("x=8x4", "--shape key 'x' must be argN (e.g. arg0=8192x4096)"),
    ("arg0=8x-4", "--shape value '8x-4' for arg0 must look like 8192x4096"),
])
def test_bad_shape_syntax(shape: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = accy(capsys, "opt", SOFTMAX, "--to", "contract", "--shape", shape)
    assert code == 1
    assert one_error_line(err) == f"error: {message}"


def test_shape_given_twice(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = accy(capsys, "check", SOFTMAX, "--shape", "arg0=1x2", "--shape", "arg0=1x2")
    assert code == 1
    assert one_error_line(err) == "error: --shape given twice for arg0"


# ------------------------------------------------------------------- usage errors


@pytest.mark.parametrize("argv", [
    ["frobnicate"],
    ["check"],
    ["opt"],
    ["opt", SOFTMAX, "--to", "llvm"],
    ["run", SOFTMAX],
    ["check", SOFTMAX, "--no-such-flag"],
], ids=["unknown-command", "check-no-file", "opt-no-file", "bad-stage", "run-no-output-dir",
        "unknown-flag"])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = accy(capsys, *argv)
    assert code == 2
    assert "Traceback" not in err and "Usage:" in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = accy(capsys, "--help")
    assert code == 0
    for command in ("check", "opt", "emit", "run", "compile", "batch", "repro"):
        assert command in out


# ----------------------------------------------------------------------------- run


def test_run_reference_writes_the_reference_results(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 7)).astype(np.float32)
    b = rng.normal(size=7).astype(np.float32)
    out_dir = tmp_path / "out"
    code, out, err = accy(capsys, "run", DYNAMIC, "--input", save(tmp_path, "x.npy", x),
                          "--input", save(tmp_path, "b.npy", b), "--output-dir", str(out_dir),
                          "--reference")
    assert (code, err) == (0, "")
    assert out.split() == [str(out_dir / "result0.npy"), str(out_dir / "result1.npy")]
    want = run_reference(parse_file(DYNAMIC), [x, b])
    for i, w in enumerate(want):
        got = np.load(out_dir / f"result{i}.npy")
        assert got.dtype == w.dtype and got.shape == w.shape
        np.testing.assert_array_equal(got, w)


@pytest.mark.parametrize("name, shapes", [
    ("softmax.mlir", [(8, 64)]),
    ("dynamic.mlir", [(6, 10), (10,)]),
    ("layernorm.mlir", None),
])
def test_run_compiled_on_the_host_matches_the_reference(
        name: str, shapes: list[tuple[int, ...]] | None, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = str(GRAPHS_DIR / name)
    module = parse_file(path)
    args = module.entry().function_type.inputs
    shapes = shapes or [tuple(4 if d is None else d for d in t.shape) for t in args]  # type: ignore[attr-defined]
    rng = np.random.default_rng(1)
    inputs = []
    for i, shape in enumerate(shapes):
        inputs += ["--input", save(tmp_path, f"in{i}.npy",
                                   rng.normal(size=shape).astype(np.float32))]
    ref, host = tmp_path / "ref", tmp_path / "host"
    assert accy(capsys, "run", path, *inputs, "--output-dir", str(ref), "--reference")[0] == 0
    code, _, err = accy(capsys, "run", path, *inputs, "--output-dir", str(host))
    assert (code, err) == (0, "")
    n = len(module.entry().function_type.results)
    for i in range(n):
        want, got = np.load(ref / f"result{i}.npy"), np.load(host / f"result{i}.npy")
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not (host / f"result{n}.npy").exists()


@pytest.mark.parametrize("extra, message", [
    ([], "error: the program takes 2 input(s), got 1 --input"),
    (["--reference"], "error: function 'main' takes 2 arguments but 1 inputs were given"),
], ids=["compiled", "reference"])
def test_run_with_the_wrong_number_of_inputs(extra: list[str], message: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    x = save(tmp_path, "x.npy", np.ones((2, 3), np.float32))
    code, out, err = accy(capsys, "run", DYNAMIC, "--input", x, "--output-dir",
                          str(tmp_path / "o"), *extra)
    assert code == 1 and out == ""
    assert one_error_line(err) == message
    assert not (tmp_path / "o" / "result0.npy").exists()


def test_run_with_an_input_of_the_wrong_shape(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    x = save(tmp_path, "x.npy", np.ones((2, 3), np.float32))
    code, _, err = accy(capsys, "run", SOFTMAX, "--input", x, "--output-dir", str(tmp_path),
                        "--shape", "arg0=4x4")
    assert code == 1
    assert one_error_line(err) == ("error: input 0 has shape (2, 3) but the fragment was "
                                   "compiled for (4, 4)")


def test_run_with_an_unreadable_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path, "x.npy", "not numpy")
    code, _, err = accy(capsys, "run", SOFTMAX, "--input", bad, "--output-dir", str(tmp_path))
    assert code == 1
    assert one_error_line(err).startswith(f"error: cannot read input {bad}")


# ---------------------------------------------------------------------------- emit


def test_emit_cuda_is_one_translation_unit_that_nvrtc_compiles(
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="NVRTC (CuPy) is not installed")
    from accy.executable.device import compile_cuda

    code, out, err = accy(capsys, "emit", SOFTMAX, "--target", "cuda:sm_90", "--shape",
                          "arg0=8x4096")
    assert (code, err) == (0, "")
    assert "// launch table" in out
    assert "#include" not in out  # self-contained: NVRTC gets no include paths
    assert compile_cuda(out, "sm_90")[:4] == b"\x7fELF"


def test_emit_host_is_c_that_the_host_compiler_compiles(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from accy.executable.device import compile_host

    code, out, err = accy(capsys, "emit", SOFTMAX, "--shape", "arg0=8x4096")
    assert (code, err) == (0, "")
    assert "// launch table" in out
    so = compile_host(out, str(tmp_path / "ws"))
    assert os.path.getsize(so) > 0


def test_emit_without_shapes_names_the_shape_option(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = accy(capsys, "emit", SOFTMAX)
    assert code == 1
    assert "--shape arg0=" in one_error_line(err)


# ------------------------------------------------------------------------- compile


RECEIPT_KEYS = {"stage", "key", "reused", "elapsed_ns", "plan_fingerprint", "pass_stats"}
RECEIPT_STAGES = ["contract", "tensor", "dispatch", "memory", "kernel", "target", "compile",
                  "load"]


def check_report_shape(report: dict, variant_id: str) -> dict:
    assert set(report) == {"variants", "summary"}
    (variant,) = report["variants"]
    assert variant["id"] == variant_id and variant["status"] == "ok"
    assert "failure" not in variant
    assert [r["stage"] for r in variant["stages"]] == RECEIPT_STAGES
    for r in variant["stages"]:
        assert RECEIPT_KEYS <= set(r)
        assert re.fullmatch(r"[0-9a-f]+", r["key"])
        assert isinstance(r["reused"], bool) and isinstance(r["elapsed_ns"], int)
        assert r["elapsed_ns"] >= 0
        assert r["plan_fingerprint"] is None or re.fullmatch(r"[0-9a-f]+", r["plan_fingerprint"])
        assert isinstance(r["pass_stats"], dict)
    plans = {r["stage"]: r["plan_fingerprint"] for r in variant["stages"]}
    assert all(plans[s] is not None for s in ("dispatch", "memory", "kernel"))
    summary = report["summary"]
    assert summary["variants"] == 1
    assert {"stage_runs", "reuses"} <= set(summary)
    return variant


def test_compile_twice_in_two_processes_reuses_every_stage_from_the_store(
        tmp_path: Path) -> None:
    cache, reports = tmp_path / "cache", [tmp_path / "r1.json", tmp_path / "r2.json"]
    vid = "softmax[target=host,arg0=8x64]"
    for report in reports:
        proc = subprocess.run(
            [sys.executable, "-m", "accy", "compile", SOFTMAX, "--shape", "arg0=8x64",
             "--cache", str(cache), "--report", str(report)],
            cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines()[0] == f"{vid}: ok"
        assert f"report: {report}" in proc.stdout
    first, second = (json.loads(r.read_text()) for r in reports)
    v1, v2 = check_report_shape(first, vid), check_report_shape(second, vid)
    assert not any(r["reused"] for r in v1["stages"])
    assert first["summary"]["stage_runs"] == len(RECEIPT_STAGES)
    assert v1["stages"][0]["pass_stats"]  # the contract stage ran passes
    for r in v2["stages"]:
        if r["stage"] == "load":  # a new process always loads its fragment itself
            assert r["reused"] is False
            continue
        assert r["reused"] is True and r.get("source") == "store", r
        assert r["pass_stats"] == {}
    # same keys both times: reuse is decided by content, not by process
    assert [r["key"] for r in v1["stages"]] == [r["key"] for r in v2["stages"]]
    assert second["summary"]["reuses"] == len(RECEIPT_STAGES) - 1


def test_compile_failure_is_one_error_line(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = accy(capsys, "compile", SOFTMAX, "--report", str(tmp_path / "r.json"))
    assert code == 1
    assert "--shape arg0=" in one_error_line(err)
    report = json.loads((tmp_path / "r.json").read_text())
    (variant,) = report["variants"]
    assert variant["status"] == "failed"
    assert variant["failure"]["pass"] == "require-static-shapes"


# --------------------------------------------------------------- real processes


def test_exit_code_contract_in_a_real_process(tmp_path: Path) -> None:
    bad = write(tmp_path, "bad.mlir", BAD_PROGRAM)

    def accy_process(*argv: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "ACCY_DEBUG"}
        return subprocess.run([sys.executable, "-m", "accy", *argv], cwd=tempfile.gettempdir(),
                              env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                              text=True, timeout=120)

    ok = accy_process("check", SOFTMAX)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "", "")
    user = accy_process("check", bad)
    assert user.returncode == 1
    assert one_error_line(user.stderr) == (f"{bad}:4:5: error: 'semantic.softmax' axis 3 is out "
                                           f"of range for rank 1")
    option = accy_process("opt", SOFTMAX, "--option", "kernel.nope=1")
    assert option.returncode == 1 and one_error_line(option.stderr).startswith("error: ")
    usage = accy_process("frobnicate")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr
    assert "No such command 'frobnicate'" in usage.stderr
