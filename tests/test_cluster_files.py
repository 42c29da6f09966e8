"""The deployment files: docker-compose.yml, cluster/dask.yaml, the images,
the preload shim and the TLS setup.

Nothing here needs a Docker engine: the compose file is checked with
``docker-compose config`` (skipped where the binary is absent) and by reading
it; the Dask configs are loaded by Dask and used to start real in-process
clusters.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
import types
from pathlib import Path

import dask.config
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
CLUSTER = ROOT / "cluster"
DASK_YAML = CLUSTER / "dask.yaml"
TLS_YAML = CLUSTER / "tls" / "dask-tls.yaml"
MAKE_CERTS = CLUSTER / "tls" / "make-certs.sh"
PRELOAD = CLUSTER / "preload.py"

STORE_PATH = "/var/lib/accy/store"
SERVICES = {"scheduler", "worker", "gpu-worker"}


# --------------------------------------------------------------------------- helpers


def _flatten(d: dict, prefix: str = "") -> dict[str, object]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _distributed_defaults() -> dict[str, object]:
    import distributed  # noqa: F401  (registers distributed's defaults)

    with open(Path(distributed.__file__).parent / "distributed.yaml") as f:
        return _flatten(yaml.safe_load(f))


def _docker_compose(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    return subprocess.run(
        [exe, "-f", str(COMPOSE), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, f"{path.name}: dangling line continuation"
    return [(ln.split(None, 1)[0].upper(), (ln.split(None, 1) + [""])[1]) for ln in logical]


def _service_env(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _mounts(service: dict) -> dict[str, str]:
    """target -> source of a service's short-syntax volumes."""
    out = {}
    for spec in service.get("volumes", []):
        parts = spec.split(":")
        out[parts[1]] = parts[0]
    return out


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def cluster_config() -> dict:
    """What a process with ``DASK_CONFIG=cluster/`` reads from that folder."""
    return dask.config.collect(paths=[str(CLUSTER)], env={})


# --------------------------------------------------------------------------- compose


def test_compose_file_validates_with_docker_compose():
    plain = _docker_compose("config", "-q")
    assert plain.returncode == 0, plain.stderr
    with_gpu = _docker_compose("--profile", "gpu", "config", "-q")
    assert with_gpu.returncode == 0, with_gpu.stderr


def test_docker_compose_reads_the_services_and_volume():
    # --profile gpu: docker-compose v2 leaves profiled services out otherwise.
    result = _docker_compose("--profile", "gpu", "config")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert set(resolved["services"]) == SERVICES
    assert "accy-store" in resolved["volumes"]
    # The anchors resolved into every service, as docker-compose sees them
    # (v1 prints short volume syntax, v2 the long one).
    for name, service in resolved["services"].items():
        assert service["environment"]["ACCY_STORE"] == STORE_PATH, name
        mounts = [
            (v["source"], v["target"]) if isinstance(v, dict) else tuple(v.split(":")[:2])
            for v in service["volumes"]
        ]
        assert ("accy-store", STORE_PATH) in mounts, name
        assert service["restart"] == "unless-stopped", name
        # the store key passes through from the host; no value is committed
        assert "ACCY_STORE_KEY" in service["environment"], name
    # Published on the loopback interface only (v1: "IP:HOST:CONTAINER/tcp"; v2: long syntax).
    published = set()
    for p in resolved["services"]["scheduler"]["ports"]:
        if isinstance(p, dict):
            published.add((p.get("host_ip"), str(p["published"]), str(p["target"])))
        else:
            published.add(tuple(p.split("/")[0].split(":")))
    assert published == {("127.0.0.1", "8786", "8786"), ("127.0.0.1", "8787", "8787")}
    for name in ("worker", "gpu-worker"):
        assert resolved["services"][name]["command"][2] == "tls://scheduler:8786", name


def test_compose_scheduler(compose):
    s = compose["services"]["scheduler"]
    assert s["build"]["dockerfile"] == "cluster/Dockerfile.cpu"
    cmd = s["command"]
    assert cmd[:2] == ["dask", "scheduler"]
    assert cmd[cmd.index("--preload") + 1] == "accy.distributed"
    assert cmd[cmd.index("--port") + 1] == "8786"
    assert cmd[cmd.index("--protocol") + 1] == "tls"
    assert cmd[cmd.index("--dashboard-address") + 1] == ":8787"
    published = {str(p).split("#")[0].strip() for p in s["ports"]}
    assert published == {"127.0.0.1:8786:8786", "127.0.0.1:8787:8787"}
    assert s["restart"] == "unless-stopped"
    health = " ".join(s["healthcheck"]["test"])
    assert "http://localhost:8787/health" in health
    assert "profiles" not in s


def test_compose_cpu_workers(compose):
    w = compose["services"]["worker"]
    assert w["image"] == compose["services"]["scheduler"]["image"]
    cmd = w["command"]
    assert cmd[:3] == ["dask", "worker", "tls://scheduler:8786"]
    assert cmd[cmd.index("--preload") + 1] == "accy.distributed"
    assert cmd[cmd.index("--nthreads") + 1] == "2"
    assert w["restart"] == "unless-stopped", "a worker exits when its scheduler goes away"
    assert "--resources" not in cmd
    assert w["deploy"]["replicas"] == 2
    assert w["depends_on"]["scheduler"]["condition"] == "service_healthy"
    assert "profiles" not in w


def test_compose_gpu_worker(compose):
    g = compose["services"]["gpu-worker"]
    assert g["build"]["dockerfile"] == "cluster/Dockerfile.gpu"
    assert g["profiles"] == ["gpu"], "CPU-only hosts must be able to `up` without it"
    cmd = g["command"]
    assert cmd[:3] == ["dask", "worker", "tls://scheduler:8786"]
    assert cmd[cmd.index("--preload") + 1] == "accy.distributed"
    assert cmd[cmd.index("--nthreads") + 1] == "1"
    assert g["restart"] == "unless-stopped"
    assert cmd[cmd.index("--resources") + 1] == "GPU=1"
    assert "--nworkers" not in cmd, "one process per GPU"
    assert _service_env(g)["CUDA_VISIBLE_DEVICES"] == "0"
    (device,) = g["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}


def test_compose_store_and_config_are_shared(compose):
    assert "accy-store" in compose["volumes"]
    for name in SERVICES:
        service = compose["services"][name]
        env, mounts = _service_env(service), _mounts(service)
        assert mounts.get(STORE_PATH) == "accy-store", name
        assert env["ACCY_STORE"] == STORE_PATH, name
        assert env["DASK_ACCY__STORE"] == STORE_PATH, name
        # DASK_CONFIG is the folder the live cluster/dask.yaml is mounted into.
        (target,) = [t for t, src in mounts.items() if src == "./cluster/dask.yaml"]
        assert os.path.dirname(target) == env["DASK_CONFIG"], name


def test_compose_turns_tls_on_everywhere(compose):
    """Every service reads the committed TLS config from its DASK_CONFIG folder and
    finds the certificates where that config points."""
    tls = _flatten(yaml.safe_load(TLS_YAML.read_text()))
    cert_dirs = {os.path.dirname(v) for k, v in tls.items() if k.endswith((".cert", ".key",
                                                                           ".ca-file"))}
    assert cert_dirs == {"/etc/accy/tls"}
    for name in SERVICES:
        service = compose["services"][name]
        env, mounts = _service_env(service), _mounts(service)
        (target,) = [t for t, src in mounts.items() if src == "./cluster/tls/dask-tls.yaml"]
        assert os.path.dirname(target) == env["DASK_CONFIG"], name
        assert mounts["/etc/accy/tls"] == "./cluster/tls/certs", name
        assert "ro" in [spec.split(":")[2] for spec in service["volumes"]
                        if spec.split(":")[1] == "/etc/accy/tls"], name
        assert service["environment"].get("ACCY_STORE_KEY", "unset") is None, \
            f"{name}: ACCY_STORE_KEY passes through from the host, with no value committed"


def test_compose_builds_only_existing_dockerfiles(compose):
    for name, service in compose["services"].items():
        build = service["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name


def test_scheduler_healthcheck_command_probes_health(compose):
    """The healthcheck's own command, run against a real scheduler, passes;
    against a port where nothing listens, it fails."""
    from distributed import LocalCluster

    test = compose["services"]["scheduler"]["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "python" and test[2] == "-c"
    probe = test[3]
    with LocalCluster(n_workers=0, processes=False, dashboard_address="127.0.0.1:0") as cluster:
        port = cluster.scheduler.http_server.port
        up = subprocess.run(
            [sys.executable, "-c", probe.replace(":8787", f":{port}")],
            capture_output=True,
            timeout=30,
        )
        assert up.returncode == 0, up.stderr
    down = subprocess.run(
        [sys.executable, "-c", probe.replace(":8787", f":{port}")],
        capture_output=True,
        timeout=30,
    )
    assert down.returncode != 0


# --------------------------------------------------------------------------- dask.yaml


def test_cluster_folder_holds_only_dask_yaml_as_config():
    """``DASK_CONFIG=cluster/`` must read dask.yaml and nothing else (the TLS
    config lives in a sub-folder, which Dask does not descend into)."""
    found = [p.name for p, _ in dask.config.collect_yaml([str(CLUSTER)], return_paths=True)]
    assert found == ["dask.yaml"]


def test_dask_yaml_holds_the_accy_keys(cluster_config):
    accy = cluster_config["accy"]
    assert set(accy) >= {"store", "store-max-bytes", "max-pinned", "stage-records"}
    assert isinstance(accy["store"], str) and accy["store"]
    assert accy["store"].endswith("accy/store")
    assert isinstance(accy["store-max-bytes"], int) and accy["store-max-bytes"] > 0
    assert isinstance(accy["max-pinned"], int) and accy["max-pinned"] > 0
    assert accy["stage-records"] == 10000


def test_dask_yaml_distributed_keys_exist_in_distributed():
    """Every ``distributed.*`` key is one Dask knows: a typo would be silently
    ignored by Dask, so catch it here."""
    ours = _flatten(yaml.safe_load(DASK_YAML.read_text())["distributed"], "distributed.")
    known = _distributed_defaults()
    unknown = sorted(set(ours) - set(known))
    assert not unknown, f"not distributed config keys: {unknown}"
    assert ours["distributed.scheduler.worker-saturation"] == 1.1
    assert set(ours) >= {
        "distributed.scheduler.allowed-failures",
        "distributed.worker.memory.target",
        "distributed.worker.memory.spill",
        "distributed.worker.memory.pause",
        "distributed.worker.memory.terminate",
        "distributed.dashboard.link",
    }
    fractions = [
        ours[f"distributed.worker.memory.{k}"] for k in ("target", "spill", "pause", "terminate")
    ]
    assert fractions == sorted(fractions) and 0 < fractions[0] and fractions[-1] < 1


def test_dask_yaml_runs_a_cluster(cluster_config):
    """A scheduler and worker under this config start and compute, and the
    scheduler took the settings."""
    from distributed import Client, LocalCluster
    from distributed.utils import format_dashboard_link

    with dask.config.set(_flatten(cluster_config)):
        assert dask.config.get("accy.stage-records") == 10000
        assert format_dashboard_link("h", 1) == "http://h:1/status"
        with (
            LocalCluster(
                n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
            ) as cluster,
            Client(cluster) as client,
        ):
            assert client.submit(sum, [1, 2, 3]).result() == 6
            scheduler = cluster.scheduler
            assert scheduler.WORKER_SATURATION == 1.1
            assert (
                scheduler.allowed_failures
                == cluster_config["distributed"]["scheduler"]["allowed-failures"]
            )


# --------------------------------------------------------------------------- images


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_dockerfile_installs_the_package(name):
    steps = _dockerfile(CLUSTER / name)
    runs = " ".join(args for op, args in steps if op == "RUN")
    copies = [args for op, args in steps if op == "COPY"]
    assert "build-essential" in runs
    assert "pip install ." in runs
    assert any(c.split()[0] == "accy" for c in copies), "the package source is copied in"
    assert any("pyproject.toml" in c.split()[:-1] for c in copies)
    # Never the whole context: it may hold TLS keys (cluster/tls/certs).
    assert not any(c.split()[0] == "." for c in copies)
    assert "ENTRYPOINT" not in dict(steps) and "CMD" not in dict(steps), "compose gives the command"
    env = " ".join(args for op, args in steps if op == "ENV")
    assert f"ACCY_STORE={STORE_PATH}" in env


def test_dockerfile_bases():
    cpu = _dockerfile(CLUSTER / "Dockerfile.cpu")
    gpu = _dockerfile(CLUSTER / "Dockerfile.gpu")
    assert [a for op, a in cpu if op == "FROM"] == ["python:3.11-slim"]
    gpu_args = {a.split("=", 1)[0]: a.split("=", 1)[1] for op, a in gpu if op == "ARG" and "=" in a}
    (gpu_from,) = [a for op, a in gpu if op == "FROM"]
    base = gpu_args.get(gpu_from.strip("${}"), gpu_from)
    assert base.startswith("nvidia/cuda:") and "runtime" in base
    assert "python3" in " ".join(a for op, a in gpu if op == "RUN")
    # The same uid in both images, so both can write the shared store volume.
    cpu_args = {a.split("=", 1)[0]: a.split("=", 1)[1] for op, a in cpu if op == "ARG" and "=" in a}
    assert cpu_args["ACCY_UID"] == gpu_args["ACCY_UID"]


# --------------------------------------------------------------------------- preload shim


def test_preload_shim_forwards_through_dask_preload(monkeypatch):
    """``--preload cluster/preload.py`` calls accy.distributed's dask_setup
    with the scheduler, through Dask's own preload machinery."""
    from distributed import LocalCluster, Scheduler

    import accy

    calls = []
    fake = types.ModuleType("accy.distributed")
    fake.dask_setup = lambda server: calls.append(("setup", server))
    fake.dask_teardown = lambda server: calls.append(("teardown", server))
    monkeypatch.setitem(sys.modules, "accy.distributed", fake)
    monkeypatch.setattr(accy, "distributed", fake, raising=False)

    try:
        with LocalCluster(
            n_workers=0,
            processes=False,
            dashboard_address=None,
            scheduler_kwargs={"preload": [str(PRELOAD)]},
        ) as cluster:
            assert calls == [("setup", cluster.scheduler)]
            assert isinstance(calls[0][1], Scheduler)
        assert [c[0] for c in calls] == ["setup", "teardown"]
    finally:
        sys.modules.pop("preload", None)  # Dask imported the file as module `preload`


# --------------------------------------------------------------------------- TLS


def test_make_certs_script_is_executable_shell():
    text = MAKE_CERTS.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") or text.startswith("#!/bin/bash\n")
    assert MAKE_CERTS.stat().st_mode & stat.S_IXUSR
    assert "openssl" in text
    syntax = subprocess.run(["bash", "-n", str(MAKE_CERTS)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


def test_committed_tls_config():
    cfg = yaml.safe_load(TLS_YAML.read_text())
    flat = _flatten(cfg)
    unknown = sorted(set(flat) - set(_distributed_defaults()))
    assert not unknown, f"not distributed config keys: {unknown}"
    assert flat["distributed.comm.require-encryption"] is True
    assert flat["distributed.comm.tls.ca-file"] == "/etc/accy/tls/ca.pem"
    for role in ("scheduler", "worker", "client"):
        assert flat[f"distributed.comm.tls.{role}.cert"] == f"/etc/accy/tls/{role}.pem"
        assert flat[f"distributed.comm.tls.{role}.key"] == f"/etc/accy/tls/{role}-key.pem"
    assert "tls://" in TLS_YAML.read_text()


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    out = tmp_path_factory.mktemp("tls") / "certs"
    result = subprocess.run(
        [str(MAKE_CERTS), str(out)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return out


def test_make_certs_writes_a_ca_and_role_certificates(certs):
    for role in ("scheduler", "worker", "client"):
        verify = subprocess.run(
            ["openssl", "verify", "-CAfile", str(certs / "ca.pem"), str(certs / f"{role}.pem")],
            capture_output=True,
            text=True,
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert stat.S_IMODE((certs / f"{role}-key.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((certs / "ca-key.pem").stat().st_mode) == 0o600
    assert (certs / ".gitignore").read_text().strip() == "*"
    # Its config points at what it wrote, and only there.
    flat = _flatten(yaml.safe_load((certs / "dask-tls.yaml").read_text()))
    paths = [v for k, v in flat.items() if k.endswith((".cert", ".key", ".ca-file"))]
    assert len(paths) == 7
    assert all(Path(p).is_file() and Path(p).parent == certs for p in paths)


def test_make_certs_keeps_an_existing_ca(certs):
    before = (certs / "ca.pem").read_bytes()
    again = subprocess.run(
        [str(MAKE_CERTS), str(certs)], capture_output=True, text=True, timeout=60
    )
    assert again.returncode != 0
    assert "FORCE=1" in again.stderr
    assert (certs / "ca.pem").read_bytes() == before


def test_generated_tls_config_runs_an_encrypted_cluster(certs):
    """Scheduler, worker and client under the generated config talk over
    mutually authenticated TLS, and plain TCP is refused."""
    from distributed import Client, LocalCluster
    from distributed.security import Security

    cfg = yaml.safe_load((certs / "dask-tls.yaml").read_text())
    with dask.config.set(_flatten(cfg)):
        security = Security()
        assert security.require_encryption
        with (
            LocalCluster(
                n_workers=1,
                threads_per_worker=1,
                processes=False,
                protocol="tls://",
                host="127.0.0.1",
                security=security,
                dashboard_address=None,
            ) as cluster,
            Client(cluster.scheduler_address, security=security) as client,
        ):
            assert cluster.scheduler_address.startswith("tls://")
            assert client.submit(lambda x: x + 1, 41).result() == 42
            tcp = cluster.scheduler_address.replace("tls://", "tcp://")
            with pytest.raises(RuntimeError, match="encryption required"):
                Client(tcp, security=security, timeout=5)


def test_a_worker_exits_when_its_scheduler_dies_and_a_restarted_one_waits_for_it(tmp_path):
    """What `restart: unless-stopped` relies on: a Dask worker does not reconnect
    but exits, and a worker started before its scheduler waits and registers."""
    import socket

    from distributed import Client

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    dask_cli = [sys.executable, "-c", "import sys; from dask.cli import run_cli; "
                "sys.argv[0] = 'dask'; run_cli()"]

    def start(*args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*dask_cli, *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, cwd=tmp_path)

    scheduler_args = ("scheduler", "--host", "127.0.0.1", "--port", str(port),
                      "--no-dashboard")
    worker_args = ("worker", address, "--nthreads", "1", "--no-dashboard")
    procs = [start(*scheduler_args)]
    try:
        procs.append(start(*worker_args))
        with Client(address, timeout="60s") as client:
            client.wait_for_workers(1, timeout=60)
        procs[0].kill()
        procs[0].wait(10)
        assert procs[1].wait(60) is not None  # the worker exited: Docker restarts it
        procs.append(start(*worker_args))  # the restart, while the scheduler is still down
        time.sleep(2)
        assert procs[2].poll() is None, "a worker must wait for its scheduler"
        procs.append(start(*scheduler_args))
        with Client(address, timeout="60s") as client:
            client.wait_for_workers(1, timeout=60)
            assert client.submit(sum, [1, 2]).result(timeout=30) == 3
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
