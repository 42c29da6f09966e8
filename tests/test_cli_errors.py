"""Every bad input is one clean ``error:`` line (exit 1) or a usage error (exit 2), never
a traceback or an "internal error": inputs, output paths, sweeps, batch options,
reproducers, and a bounded fuzz of ``accy check`` over mutated example programs."""

from __future__ import annotations

import json
import logging
import random
import re
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from accy.cli import main

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = sorted((ROOT / "graphs").glob("*.mlir"))
SOFTMAX = str(ROOT / "graphs" / "softmax.mlir")


def accy(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def error_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``accy argv``: exit 1, nothing on stdout, exactly one ``error:`` line on stderr."""
    code, out, err = accy(capsys, *argv)
    assert "Traceback" not in out + err and "internal error" not in err, err
    assert (code, out) == (1, ""), (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    h = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}".encode()
    h += b" " * (63 - (len(h) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h


# ---------------------------------------------------------------- accy run inputs


def run_with(capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, data: bytes | None,
             *extra: str, array: np.ndarray | None = None) -> str:
    p = tmp_path / name
    if array is not None:
        np.save(p, array)
    else:
        p.write_bytes(data or b"")
    return error_line(capsys, "run", SOFTMAX, "--input", str(p), "--output-dir",
                      str(tmp_path / "out"), *extra)


def test_an_npz_input_is_named_as_such(capsys, tmp_path):
    p = tmp_path / "x.npz"
    np.savez(p, a=np.ones((2, 3), np.float32))
    assert error_line(capsys, "run", SOFTMAX, "--input", str(p), "--output-dir",
                      str(tmp_path / "o")) == (
        f"error: cannot read input {p}: it is a .npz archive, not a .npy file (save each "
        f"argument with np.save, one --input per argument)")


def test_an_empty_npy_is_not_aborted(capsys, tmp_path):
    assert run_with(capsys, tmp_path, "e.npy", b"") == \
        f"error: cannot read input {tmp_path / 'e.npy'}: the file is empty (not a .npy file)"


def test_a_text_file_named_npy_is_not_called_pickled(capsys, tmp_path):
    assert run_with(capsys, tmp_path, "t.npy", b"hello world\n") == (
        f"error: cannot read input {tmp_path / 't.npy'}: not a .npy file (it does not start "
        f"with the NumPy magic string)")


def test_a_header_larger_than_the_file_is_refused_before_allocating(capsys, tmp_path):
    t0 = time.perf_counter()
    line = run_with(capsys, tmp_path, "h.npy", npy_header((100000, 100000)) + b"\0" * 16)
    assert line == (f"error: cannot read input {tmp_path / 'h.npy'}: its header declares shape "
                    f"(100000, 100000) of float32 (40000000000 bytes) but the file holds 16 "
                    f"bytes of data (truncated or corrupt)")
    assert time.perf_counter() - t0 < 5


def test_an_object_array_is_refused_without_pickle_advice(capsys, tmp_path):
    line = run_with(capsys, tmp_path, "o.npy", None, array=np.array([{"a": 1}], dtype=object))
    assert line == (f"error: cannot read input {tmp_path / 'o.npy'}: it holds Python objects "
                    f"(dtype object); accy reads numeric arrays only")
    assert "allow_pickle" not in line


@pytest.mark.parametrize("dtype", [np.float64, np.complex64, np.int32])
@pytest.mark.parametrize("extra", [[], ["--reference"]], ids=["compiled", "reference"])
def test_a_wrong_dtype_is_an_error_without_cast(capsys, tmp_path, dtype, extra):
    line = run_with(capsys, tmp_path, "x.npy", None, *extra, array=np.ones((4, 8), dtype))
    assert line == (f"error: input 0 has dtype {np.dtype(dtype)} but argument 0 is "
                    f"tensor<?x?xf32> (needs float32; --cast converts it)")
    assert not (tmp_path / "out" / "result0.npy").exists()


def test_cast_converts_a_real_dtype_but_never_drops_an_imaginary_part(capsys, tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.arange(32, dtype=np.float64).reshape(4, 8))
    code, out, err = accy(capsys, "run", SOFTMAX, "--input", str(x), "--output-dir",
                          str(tmp_path / "o"), "--cast")
    assert (code, err) == (0, "")
    got = np.load(tmp_path / "o" / "result0.npy")
    want = np.exp(np.arange(32.0).reshape(4, 8) - np.arange(32.0).reshape(4, 8).max(1, keepdims=True))
    np.testing.assert_allclose(got, want / want.sum(1, keepdims=True), rtol=1e-5)
    assert got.dtype == np.float32
    assert run_with(capsys, tmp_path, "c.npy", None, "--cast",
                    array=np.ones((4, 8), np.complex64)) == \
        "error: input 0 is complex64: casting it to float32 would drop the imaginary part"


# ---------------------------------------------------------------- output paths


def test_an_output_dir_under_a_file_is_one_line_before_any_work(capsys, tmp_path):
    (tmp_path / "f").write_text("")
    x = tmp_path / "x.npy"
    np.save(x, np.ones((4, 8), np.float32))
    assert error_line(capsys, "run", SOFTMAX, "--input", str(x), "--output-dir",
                      str(tmp_path / "f" / "out")) == \
        f"error: cannot create the output folder {tmp_path / 'f' / 'out'}: {tmp_path / 'f'} " \
        f"is a file, not a folder"


def test_a_report_under_a_file_is_one_line_before_the_compile(capsys, tmp_path):
    (tmp_path / "f").write_text("")
    report = tmp_path / "f" / "r.json"
    assert error_line(capsys, "compile", SOFTMAX, "--shape", "arg0=4x8", "--report",
                      str(report)) == \
        f"error: cannot write the report to {report}: {tmp_path / 'f'} is a file, not a folder"


# ---------------------------------------------------------------- sweeps and batch options


def sweep(tmp_path: Path, text: str | bytes, name: str = "s.yaml") -> str:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return str(p)


def test_a_python_yaml_tag_is_one_line(capsys, tmp_path):
    s = sweep(tmp_path, f"programs: [{SOFTMAX}]\n"
                        "shapes: [{arg0: !!python/object:os.system 'echo hi'}]\n")
    assert error_line(capsys, "batch", s) == (
        f"{s}:2:17: error: unsupported YAML value (could not determine a constructor for the "
        f"tag 'tag:yaml.org,2002:python/object:os.system'); a sweep holds plain strings, "
        f"numbers and lists")


def test_a_sweep_that_is_not_utf8_is_one_line(capsys, tmp_path):
    s = sweep(tmp_path, b"programs: [\xff\xfe]\n")
    assert error_line(capsys, "batch", s) == \
        f"error: {s}: the sweep file is not UTF-8 text (byte 11 is 0xff)"


def test_a_sweep_past_max_variants_says_how_many_before_expanding(capsys, tmp_path):
    shapes = ", ".join(f"{{arg0: {i}x4}}" for i in range(1, 1281))
    s = sweep(tmp_path, f"programs: [{SOFTMAX}]\nshapes: [{shapes}]\n"
                        f"targets: [{', '.join(['host'] * 1000)}]\n")
    t0 = time.perf_counter()
    assert error_line(capsys, "batch", s) == (
        f"error: {s}: the sweep defines 1280000 variants, more than the limit of 100000 "
        f"(raise it with --max-variants)")
    assert time.perf_counter() - t0 < 10
    small = sweep(tmp_path, f"programs: [{SOFTMAX}]\nshapes: [{{arg0: 1x4}}, {{arg0: 2x4}}]\n",
                  "small.yaml")
    assert error_line(capsys, "batch", small, small, "--max-variants", "3") == (
        "error: the sweep files define 4 variants in all, more than the limit of 3 "
        "(raise it with --max-variants)")


@pytest.mark.parametrize("address, message", [
    ("not a url", "not a Dask scheduler address (expected tcp://HOST:PORT or tls://HOST:PORT)"),
    ("http://127.0.0.1:8787", "Dask has no 'http' comm (expected tcp:// or tls://; the "
                              "dashboard's http:// address is not the scheduler's)"),
    ("tcp://127.0.0.1", "no port (e.g. tcp://127.0.0.1:8786)"),
    ("tls://127.0.0.1:1", "TLS needs certificates: set distributed.comm.tls.ca-file, "
                          ".client.cert and .client.key in the Dask config (or "
                          "DASK_DISTRIBUTED__COMM__TLS__* variables)"),
])
def test_a_bad_scheduler_address_is_one_line(capsys, tmp_path, address, message):
    s = sweep(tmp_path, f"programs: [{SOFTMAX}]\n")
    assert error_line(capsys, "batch", s, "--scheduler", address) == \
        f"error: --scheduler {address}: {message}"


@pytest.mark.parametrize("cache, message", [
    ("f", "{tmp}/f is a file, not a folder"),
    ("f/sub", "{tmp}/f is a file, not a folder"),
    ("nosuchproto://bucket/x", "not a usable store URL: Protocol not known: nosuchproto"),
])
def test_a_bad_cache_is_one_line_before_a_cluster_starts(capsys, tmp_path, monkeypatch, cache,
                                                         message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("")
    s = sweep(tmp_path, f"programs: [{SOFTMAX}]\n")
    t0 = time.perf_counter()
    assert error_line(capsys, "batch", s, "--cache", cache) == \
        f"error: --cache {cache}: {message.format(tmp=tmp_path)}"
    assert time.perf_counter() - t0 < 5  # no cluster was started


def test_a_report_path_under_a_file_fails_the_batch_up_front(capsys, tmp_path):
    (tmp_path / "f").write_text("")
    s = sweep(tmp_path, f"programs: [{SOFTMAX}]\n")
    assert error_line(capsys, "batch", s, "--report", str(tmp_path / "f" / "r.json")) == \
        f"error: cannot write the report to {tmp_path / 'f' / 'r.json'}: {tmp_path / 'f'} " \
        f"is a file, not a folder"


def test_workers_are_capped_at_the_cores_unless_forced(monkeypatch):
    from accy.distributed import batch

    monkeypatch.setattr(batch, "available_cores", lambda: 2)
    said: list[str] = []
    assert batch.local_workers(64, False, said.append) == 2
    assert said == ["warning: --workers 64 is more than the 2 core(s) here; starting 2 "
                    "(--force-workers starts 64)"]
    assert batch.local_workers(64, True, said.append) == 64
    assert batch.local_workers(2, False, said.append) == 2
    assert batch.local_workers(None, False, said.append) == 2
    assert len(said) == 1


# ---------------------------------------------------------------- the workers' logs


def compute_failed(key: object, exception: str) -> logging.LogRecord:
    return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1,
                             "Compute Failed\nKey:       %s\nState:     %s\nTask:  %s\n"
                             "Exception: %r\nTraceback: %r\n",
                             (key, "executing", "<Task ...>", exception, "  File ..."), None)


def test_the_log_filter_drops_accy_task_failures_and_heartbeats_only(monkeypatch):
    from distributed.comm.core import CommClosedError

    from accy.distributed.quiet import AccyLogFilter

    monkeypatch.delenv("ACCY_DEBUG", raising=False)
    f = AccyLogFilter()
    stage = compute_failed(("accy_tensor", "8ca1"), 'StageFailed("x.mlir:4:8: error: …")')
    assert not f.filter(stage)
    assert f.filter(compute_failed(("inc", "1"), "ZeroDivisionError('x')"))  # not accy's task
    try:
        raise CommClosedError("in <TCP (closed) ConnectionPool.heartbeat_worker>")
    except CommClosedError:
        import sys

        beat = logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1,
                                 "Failed to communicate with scheduler during heartbeat.",
                                 (), sys.exc_info())
    assert not f.filter(beat)
    assert f.filter(logging.LogRecord("distributed.worker", logging.WARNING, __file__, 1,
                                      "Worker is at 90% memory usage.", (), None))
    monkeypatch.setenv("ACCY_DEBUG", "1")
    assert f.filter(stage) and f.filter(beat)


# ---------------------------------------------------------------- reproducers


def reproducer(tmp_path: Path, **meta: object) -> str:
    base = {"location": "", "message": "m", "options": {}, "pass": "require-static-shapes",
            "pipeline": "tensor", "truncated": False}
    base.update(meta)
    p = tmp_path / "r.mlir"
    p.write_text("// accy-reproducer: " + json.dumps(base) + "\n" + Path(SOFTMAX).read_text())
    return str(p)


def test_a_reproducer_of_an_unknown_pipeline_is_an_error(capsys, tmp_path):
    assert error_line(capsys, "repro", reproducer(tmp_path, pipeline="nope")) == (
        "error: unknown pipeline 'nope' in the reproducer (accy's are contract, tensor, "
        "dispatch, memory, kernel, target)")


def test_a_reproducer_with_unknown_options_is_an_error(capsys, tmp_path):
    assert error_line(capsys, "repro", reproducer(tmp_path, options={"bogus": 1})) == (
        "error: the reproducer gives pass 'require-static-shapes' unknown option(s) bogus "
        "(it takes no options)")


def test_a_reproducer_that_still_fails_exits_1(capsys, tmp_path):
    code, out, err = accy(capsys, "repro", reproducer(tmp_path))
    assert code == 1 and "Traceback" not in err
    assert err.splitlines()[-1].endswith("argument 0 has unbound dims (tensor<?x?xf32>): "
                                         "bind them with --shape arg0=NxN")


# ---------------------------------------------------------------- fuzz


def mutations(text: str, rng: random.Random, n: int) -> list[str]:
    """``n`` mutants of ``text``: byte flips, truncations, duplicated and dropped spans,
    and numbers (dims, axes, constants) replaced by extreme ones."""
    out = []
    data = text.encode()
    numbers = [m.span() for m in re.finditer(rb"\d+", data)]
    for _ in range(n):
        b = bytearray(data)
        kind = rng.randrange(5)
        i = rng.randrange(len(b))
        if kind == 0:
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif kind == 1:
            del b[i:]
        elif kind == 2:
            j = min(len(b), i + rng.randint(1, 80))
            b[j:j] = b[i:j]
        elif kind == 3:
            del b[i:i + rng.randint(1, 40)]
        else:
            a, z = rng.choice(numbers)
            b[a:z] = rng.choice([b"0", b"-1", b"99999999999999999999", b"4294967296",
                                 b"1e309", b"0x7fffffff"])
        out.append(b.decode("utf-8", errors="surrogateescape"))
    return out


FUZZ_PER_PROGRAM = 30


def test_check_never_crashes_on_mutated_programs(capsys, tmp_path):
    """A few hundred mutants of the example programs: every ``accy check`` exits 0, 1 or 2
    with no traceback and no internal error (a seeded, bounded run)."""
    rng = random.Random(20261201)
    t0 = time.perf_counter()
    bad: list[str] = []
    n = 0
    for g in GRAPHS:
        for k, text in enumerate(mutations(g.read_text(), rng, FUZZ_PER_PROGRAM)):
            p = tmp_path / f"{g.stem}-{k}.mlir"
            p.write_bytes(text.encode("utf-8", errors="surrogateescape"))
            code, out, err = accy(capsys, "check", str(p))
            n += 1
            if code not in (0, 1, 2) or "Traceback" in out + err or "internal error" in err:
                bad.append(f"{p.name}: exit {code}: {err.strip()[:200]}")
    assert n >= 300
    assert time.perf_counter() - t0 < 20
    assert not bad, f"{len(bad)} of {n} mutants crashed:\n" + "\n".join(bad[:20])
