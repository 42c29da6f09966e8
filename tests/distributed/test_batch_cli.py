"""``accy batch`` end to end: real ``dask scheduler`` / ``dask worker`` processes that
preload accy, the report INTERFACE.md promises, and the command's errors."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client

GRAPHS = Path(__file__).resolve().parents[2] / "graphs"
ROOT = GRAPHS.parent
RECEIPT_FIELDS = {"stage", "key", "reused", "elapsed_ns", "plan_fingerprint", "pass_stats"}
PIPELINE = ["contract", "tensor", "dispatch", "memory", "kernel", "target", "compile", "load"]


def env() -> dict[str, str]:
    """This checkout first on the path; tracebacks not forced on."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.pop("ACCY_DEBUG", None)
    return e


def accy(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "accy", *args], cwd=cwd, env=env(),
                          capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def process(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A subprocess logging to ``log``; interrupted (then killed) on exit."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env(),
                                cwd=ROOT)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory) -> Iterator[str]:
    """``dask scheduler --preload accy.distributed`` and one ``dask worker`` with
    ``--resources GPU=1 --nthreads 1``; yields the scheduler's address."""
    logs = tmp_path_factory.mktemp("dask-logs")
    address = f"tcp://127.0.0.1:{free_port()}"
    dask = [sys.executable, "-m", "dask"]
    with process([*dask, "scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                  "--dashboard-address", ":0", "--preload", "accy.distributed"],
                 logs / "scheduler.log") as sched, \
            process([*dask, "worker", address, "--preload", "accy.distributed",
                     "--resources", "GPU=1", "--nthreads", "1", "--nworkers", "1",
                     "--no-dashboard"], logs / "worker.log") as worker:
        try:
            deadline = time.monotonic() + 60
            while True:
                assert sched.poll() is None and worker.poll() is None, "dask exited"
                try:
                    with Client(address, timeout=5) as client:
                        client.wait_for_workers(1, timeout=max(deadline - time.monotonic(), 1))
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        except BaseException:
            for name in ("scheduler.log", "worker.log"):
                print(f"--- {name}\n{(logs / name).read_text(errors='replace')}")
            raise
        yield address


def write_sweep(path: Path, programs: list[str], **extra: object) -> Path:
    doc: dict[str, object] = {"programs": programs, **extra}
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def until_progress(p: subprocess.Popen[bytes], total: int, timeout: float = 120) -> bytes:
    """Read a running batch's stderr until its progress bar has moved (variants are
    finishing) or it exits; what it printed so far."""
    os.set_blocking(p.stderr.fileno(), False)  # type: ignore[union-attr]
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and p.poll() is None:
        seen += p.stderr.read() or b""  # type: ignore[union-attr]
        if f"/{total} [".encode() in seen and f" 0/{total}".encode() not in seen[-200:]:
            break
        time.sleep(0.1)
    return seen


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "error:" in lines[0], stderr
    return lines[0]


# -- 9. against real scheduler and worker processes


def test_batch_against_a_preloaded_dask_scheduler_and_gpu_worker(scheduler, tmp_path):
    sweep = write_sweep(tmp_path / "sweep.yaml",
                        [str(GRAPHS / "softmax.mlir"), str(GRAPHS / "layernorm.mlir")],
                        targets=["host"], shapes=[{"arg0": "8x4096"}],
                        options={"kernel.block_size": [128, 256]})
    report = tmp_path / "R.json"
    common = ["batch", str(sweep), "--scheduler", scheduler, "--cache", str(tmp_path / "store"),
              "--report", str(report), "--no-progress"]
    first = accy(*common, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "Traceback" not in first.stderr
    doc = json.loads(report.read_text())
    assert set(doc) == {"variants", "summary"}
    ids = [v["id"] for v in doc["variants"]]
    assert ids == [f"{p}[target=host,arg0=8x4096,kernel.block_size={b}]"
                   for p in ("softmax", "layernorm") for b in (128, 256)]
    for v in doc["variants"]:
        assert v["status"] == "ok" and "failure" not in v, v
        assert [r["stage"] for r in v["stages"]] == PIPELINE
        for r in v["stages"]:
            assert RECEIPT_FIELDS <= set(r), r
            assert isinstance(r["key"], str) and int(r["key"], 16) >= 0
            assert isinstance(r["reused"], bool) and isinstance(r["elapsed_ns"], int)
            assert r["plan_fingerprint"] is None or int(r["plan_fingerprint"], 16) >= 0
            assert isinstance(r["pass_stats"], dict)
        planned = {r["stage"]: r["plan_fingerprint"] for r in v["stages"]}
        assert all(planned[s] for s in ("dispatch", "memory", "kernel"))
    s = doc["summary"]
    assert (s["variants"], s["ok"], s["failed"]) == (4, 4, 0)
    assert s["stage_runs"] > 0
    assert s["stage_runs"] + s["reuses"] == 4 * len(PIPELINE)

    second = accy(*common, cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    again = json.loads(report.read_text())
    assert again["summary"]["stage_runs"] == 0 and again["summary"]["ok"] == 4
    assert [v["id"] for v in again["variants"]] == ids
    for v, before in zip(again["variants"], doc["variants"]):
        assert all(r["reused"] for r in v["stages"]), v
        assert [r["key"] for r in v["stages"]] == [r["key"] for r in before["stages"]]


def test_a_broken_program_fails_only_its_variants_and_the_report_is_written(scheduler,
                                                                           tmp_path):
    bad = tmp_path / "broken.mlir"
    bad.write_text('"builtin.module"() ({\n  "func.func"() <{sym_name = "main"\n')
    sweep = write_sweep(tmp_path / "sweep.yaml", [str(GRAPHS / "softmax.mlir"), str(bad)],
                        shapes=[{"arg0": "8x256"}])
    report = tmp_path / "R.json"
    run = accy("batch", str(sweep), "--scheduler", scheduler, "--cache", str(tmp_path / "store"),
               "--report", str(report), "--no-progress", cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    doc = json.loads(report.read_text())
    by_id = {v["id"]: v for v in doc["variants"]}
    good, broken = by_id["softmax[target=host,arg0=8x256]"], by_id["broken[target=host,arg0=8x256]"]
    assert good["status"] == "ok" and [r["stage"] for r in good["stages"]] == PIPELINE
    assert broken["status"] == "failed"
    assert set(broken["failure"]) >= {"pipeline", "pass", "message", "reproducer"}
    assert "broken.mlir" in broken["failure"]["message"]
    assert doc["summary"]["ok"] == 1 and doc["summary"]["failed"] == 1
    assert "broken[target=host,arg0=8x256]" in run.stdout


# -- 10. errors


def test_a_missing_sweep_file_is_one_error_line(tmp_path):
    run = accy("batch", str(tmp_path / "nope.yaml"), "--workers", "1", cwd=tmp_path)
    assert run.returncode == 1
    assert "nope.yaml" in one_error_line(run.stderr)


@pytest.mark.parametrize("text", ["programs: [a.mlir\n", "programs: []\nflavours: [x]\n",
                                  "programs: [missing.mlir]\n"])
def test_a_malformed_sweep_is_one_error_line(tmp_path, text):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(text)
    run = accy("batch", str(sweep), "--report", str(tmp_path / "R.json"), cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "sweep.yaml" in one_error_line(run.stderr)
    assert not (tmp_path / "R.json").exists()


def test_scheduler_and_workers_together_are_a_usage_error(tmp_path):
    sweep = write_sweep(tmp_path / "sweep.yaml", [str(GRAPHS / "softmax.mlir")])
    run = accy("batch", str(sweep), "--scheduler", "tcp://127.0.0.1:1", "--workers", "2",
               cwd=tmp_path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    assert "--scheduler" in run.stderr and "--workers" in run.stderr


# -- the local cluster binds the loopback interface unless asked


def _listening(pid: int) -> set[tuple[str, int]]:
    """(ip, port) of every TCP socket ``pid`` and its descendants listen on."""
    import psutil

    root = psutil.Process(pid)
    found = set()
    for p in [root, *root.children(recursive=True)]:
        try:
            conns = p.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        found |= {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}
    return found


@pytest.mark.parametrize("asked", [None, "0.0.0.0"])
def test_the_local_cluster_binds_where_its_dashboard_link_says(tmp_path, asked):
    sweep = write_sweep(tmp_path / "s.yaml", [str(GRAPHS / "softmax.mlir")],
                        shapes=[{"arg0": "8x256"}])
    report = tmp_path / "r.json"
    e = env()
    e["PYTHONUNBUFFERED"] = "1"
    e.pop("ACCY_BATCH_HOST", None)
    if asked:
        e["ACCY_BATCH_HOST"] = asked
    proc = subprocess.Popen(
        [sys.executable, "-m", "accy", "batch", str(sweep), "--workers", "1", "--no-progress",
         "--cache", str(tmp_path / "store"), "--report", str(report), "--keep-open", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=e)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("dashboard: http://"), line
        host, port = line.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
        deadline = time.monotonic() + 90
        while not report.exists():  # the batch ran: scheduler and workers are up
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        bound = _listening(proc.pid)
        want = asked or "127.0.0.1"
        if asked is None:
            assert host == "127.0.0.1"  # (with 0.0.0.0 Dask links to the host's own address)
        assert (want, int(port)) in bound, bound  # the dashboard is where the link says
        assert len(bound) >= 3, bound  # scheduler, dashboard, worker (and nanny)
        assert {ip for ip, _ in bound} == {want}, bound
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_stage_failures_on_the_local_cluster_are_said_once_and_name_their_own_file(tmp_path):
    """A program that needs --shape (two copies with the same text, so they share their
    tasks) and a shape for an argument that does not exist: each failure is one line,
    naming its own program; no worker log block, no traceback."""
    text = (GRAPHS / "softmax.mlir").read_text()
    (tmp_path / "a.mlir").write_text(text)
    (tmp_path / "b.mlir").write_text(text)
    twins = write_sweep(tmp_path / "twins.yaml", ["a.mlir", "b.mlir"])
    badarg = write_sweep(tmp_path / "badarg.yaml", [str(GRAPHS / "softmax.mlir")],
                         shapes=[{"arg0": "8x64", "arg5": "4x4"}])
    report = tmp_path / "R.json"
    run = accy("batch", str(twins), str(badarg), "--workers", "1", "--no-progress",
               "--cache", str(tmp_path / "store"), "--report", str(report), cwd=tmp_path)
    both = run.stdout + run.stderr
    assert run.returncode == 1, both
    assert "Traceback" not in both and "Compute Failed" not in both, both
    unbound = ("error: pipeline 'tensor', pass 'require-static-shapes': argument 0 has unbound "
               "dims (tensor<?x?xf32>): bind them with --shape arg0=NxN")
    for name in ("a", "b"):
        assert both.count(f"{tmp_path / name}.mlir:4:8: {unbound}") == 1, both
    extra = ("error: pipeline 'contract', pass 'specialize-shapes': --shape arg5=4x4: "
             "function 'main' has 1 argument")
    assert both.count(extra) == 1, both
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED ")]
    assert [line.split(":", 1)[0] for line in failed] == [
        "FAILED a[target=host]", "FAILED b[target=host]",
        "FAILED softmax[target=host,arg0=8x64,arg5=4x4]"]
    assert run.stderr == "", run.stderr
    doc = json.loads(report.read_text())
    assert [v["failure"]["message"].split(":", 1)[0] for v in doc["variants"]] == \
        [str(tmp_path / "a.mlir"), str(tmp_path / "b.mlir"), str(GRAPHS / "softmax.mlir")]


@pytest.mark.slow
def test_ctrl_c_stops_the_batch_writes_a_partial_report_and_exits_130(tmp_path):
    """Ctrl-C at the terminal (SIGINT to the whole process group) mid-batch: exit 130,
    one ``error: interrupted`` line, no traceback from the command or its workers,
    and the report holds the variants that had finished."""
    import json
    import os
    import signal
    import subprocess
    import sys

    shapes = "\n".join(f"  - {{arg0: {8 * i}x4096}}" for i in range(1, 41))
    sweep = tmp_path / "big.yaml"
    sweep.write_text(f"programs: [{GRAPHS}/softmax.mlir, {GRAPHS}/layernorm.mlir]\n"
                     f"targets: [host]\nshapes:\n{shapes}\n"
                     "options:\n  kernel.block_size: [64, 128, 256, 512, 1024]\n")
    report = tmp_path / "r.json"
    env = dict(os.environ, HOME=str(tmp_path))
    p = subprocess.Popen([sys.executable, "-m", "accy", "batch", str(sweep), "--report",
                          str(report), "--workers", "2", "--cache", str(tmp_path / "store")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         start_new_session=True, cwd=str(ROOT))
    seen = until_progress(p, 400)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=120)
    both = out.decode() + (seen + err).decode(errors="replace")
    if p.returncode == 0:
        pytest.skip("the batch finished before the interrupt")
    assert p.returncode == 130, both
    assert "Traceback" not in both, both
    assert "error: interrupted" in both
    partial = json.loads(report.read_text())
    assert 0 < partial["summary"]["variants"] < 400
    assert f"interrupted: {partial['summary']['variants']} of 400 variants had finished" in both


def test_a_scheduler_lost_mid_batch_ends_it_in_bounded_time_with_a_partial_report(tmp_path):
    """The scheduler killed while ``accy batch --scheduler`` runs: the batch ends within
    a bound (``accy.no-workers-wait`` = 3 s here) with one error line, no traceback,
    exit 1, and the report of what had finished."""
    address = f"tcp://127.0.0.1:{free_port()}"
    dask = [sys.executable, "-m", "dask"]
    shapes = [{"arg0": f"{8 * i}x4096"} for i in range(1, 41)]
    sweep = write_sweep(tmp_path / "big.yaml", [str(GRAPHS / "layernorm.mlir")],
                        targets=["host"], shapes=shapes,
                        options={"kernel.block_size": [64, 128, 256, 512, 1024]})
    report = tmp_path / "r.json"
    with process([*dask, "scheduler", "--host", "127.0.0.1", "--port",
                  address.rsplit(":", 1)[1], "--dashboard-address", ":0", "--preload",
                  "accy.distributed"], tmp_path / "scheduler.log") as sched, \
            process([*dask, "worker", address, "--preload", "accy.distributed",
                     "--nthreads", "1", "--no-dashboard"], tmp_path / "worker.log"):
        e = dict(env(), DASK_ACCY__NO_WORKERS_WAIT="3")
        p = subprocess.Popen([sys.executable, "-m", "accy", "batch", str(sweep), "--scheduler",
                              address, "--report", str(report)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=e, cwd=str(tmp_path))
        seen = until_progress(p, 200)
        if p.poll() is not None:
            pytest.skip("the batch ended before the scheduler could be killed")
        sched.kill()
        killed = time.monotonic()
        out, err = p.communicate(timeout=120)
    took = time.monotonic() - killed
    both = out.decode() + (seen + err).decode(errors="replace")
    assert p.returncode == 1, both
    assert took < 60, f"{took:.0f} s after the scheduler died"
    assert "Traceback" not in both, both
    assert "error:" in both
    if report.exists():  # the partial report of what had finished
        partial = json.loads(report.read_text())
        assert 0 < partial["summary"]["variants"] < 200
