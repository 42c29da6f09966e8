"""Where accy writes files (accy.paths): private builds and loads, per-user folders."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from accy import paths
from accy.errors import AccyError
from accy.executable import device, fragment
from accy.executable.compile import compile_fragment
from accy.executable.fragment import load_fragment
from accy.pipeline import prepare_through
from accy.preparation.options import RunOptions
from accy.preparation.products import SemanticModule

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOFTMAX = os.path.join(ROOT, "graphs", "softmax.mlir")

# A library that, if anything dlopens it, leaves a marker file behind.
PLANTED = textwrap.dedent("""\
    #include <stdio.h>
    __attribute__((constructor)) static void planted(void) {
        FILE* f = fopen("%s", "w");
        if (f) { fputs("planted library ran", f); fclose(f); }
    }
""")


def _mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _run_python(code: str, env: dict[str, str] | None = None) -> str:
    full = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=full, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _compiled_softmax(rows: int):
    sm = SemanticModule.from_file(SOFTMAX)
    job = prepare_through(sm, "target", RunOptions.parse("host", ()), {0: (rows, 33)}).product
    return compile_fragment(job)


# --------------------------------------------------------------------------- private dir


def test_private_dir_is_this_users_0700_and_stable():
    d = paths.private_dir()
    st = os.lstat(d)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
    assert _mode(d) == 0o700
    assert paths.private_dir() == d


def test_private_dir_is_remade_when_it_stops_being_private():
    d = paths.private_dir()
    os.chmod(d, 0o755)
    try:
        again = paths.private_dir()
        assert again != d and _mode(again) == 0o700
    finally:
        os.chmod(d, 0o700)


def test_fresh_file_is_created_exclusively(monkeypatch):
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def spy(path, flags, *args, **kwargs):
        opened.append((os.fspath(path), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    p = paths.fresh_file(b"abc", "x-", ".bin")
    ((path, flags),) = [(q, f) for q, f in opened if q == p]
    assert flags & os.O_CREAT and flags & os.O_EXCL
    assert os.path.dirname(p) == paths.private_dir()
    assert _mode(p) == 0o600
    with open(p, "rb") as f:
        assert f.read() == b"abc"


def test_another_process_gets_another_dir_and_removes_it_at_exit(tmp_path):
    code = "from accy import paths; import os; d = paths.private_dir(); " \
           "open(os.path.join(d, 'f'), 'w').close(); print(d)"
    env = {"TMPDIR": str(tmp_path)}
    first = _run_python(code, env)
    second = _run_python(code, env)
    assert first != second != paths.private_dir()
    assert os.path.dirname(first) == str(tmp_path)
    assert not os.path.exists(first) and not os.path.exists(second)
    assert os.listdir(tmp_path) == []


def test_a_killed_process_dir_is_swept_by_the_next_process(tmp_path):
    code = "from accy import paths; import os, signal; print(paths.private_dir(), flush=True); " \
           "os.kill(os.getpid(), signal.SIGKILL)"
    env = {**os.environ, "PYTHONPATH": ROOT, "TMPDIR": str(tmp_path)}
    killed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=60)
    left = killed.stdout.strip()
    assert killed.returncode == -9 and os.path.isdir(left)  # atexit did not run
    dead_pid = os.path.basename(left).split("-")[1]
    other = tmp_path / f"accy-{dead_pid}-shared"
    other.mkdir()
    other.chmod(0o755)  # the same dead pid, but not a private dir: never swept
    _run_python("from accy import paths; paths.private_dir()", {"TMPDIR": str(tmp_path)})
    assert not os.path.exists(left)
    assert other.is_dir()


def test_keep_temps_keeps_the_private_dir(tmp_path):
    code = "from accy import paths; print(paths.private_dir())"
    kept = _run_python(code, {"TMPDIR": str(tmp_path), "ACCY_KEEP_TEMPS": "1"})
    assert os.path.isdir(kept) and _mode(kept) == 0o700


def test_a_forked_child_gets_its_own_dir():
    parent = paths.private_dir()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its dir, exit without running atexit
        try:
            os.write(w, paths.private_dir().encode())
        finally:
            os._exit(0)
    os.close(w)
    child = os.read(r, 4096).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert child and child != parent and _mode(child) == 0o700
    os.rmdir(child)


def test_a_compile_and_load_in_a_process_leave_nothing_behind(tmp_path):
    """Builds and loaded libraries live in the private dir, which goes at exit."""
    code = textwrap.dedent(f"""\
        import numpy as np
        from accy.executable.cache import FragmentCompilerCache
        from accy.preparation.options import RunOptions
        from accy.preparation.products import SemanticModule
        from accy.preparation.stages import PreparationRequest
        sm = SemanticModule.from_file({SOFTMAX!r})
        update = FragmentCompilerCache().refresh_from_semantic_module(
            sm, PreparationRequest(source="s", options=RunOptions.parse("host", ()),
                                   shapes={{0: (3, 8)}}))
        print(float(update.fragment(np.ones((3, 8), np.float32))[0].sum()))
    """)
    out = _run_python(code, {"TMPDIR": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "c")})
    assert float(out) == pytest.approx(3.0)
    assert [p for p in os.listdir(tmp_path) if p != "c"] == []


# --------------------------------------------------------------------------- loading


def test_a_library_planted_at_the_old_path_is_not_loaded(tmp_path, monkeypatch):
    """Before accy.paths, a host fragment was loaded from
    $TMP/accy-loaded-<pid>/fragment-<key16>-<pid>.so whenever that file existed."""
    monkeypatch.setattr(fragment, "_REGISTRY", {})
    compiled = _compiled_softmax(5)
    marker = tmp_path / "planted-ran"
    pid = os.getpid()
    import tempfile

    old = os.path.join(tempfile.gettempdir(), f"accy-loaded-{pid}")
    os.makedirs(old, exist_ok=True)
    planted = os.path.join(old, f"fragment-{compiled.key.hex[:16]}-{pid}.so")
    so = device.compile_host(PLANTED % marker, str(tmp_path / "build"))
    os.replace(so, planted)
    try:
        loaded, reused = load_fragment(compiled)
        assert not marker.exists(), "the planted library ran"
        assert not reused
        x = np.random.default_rng(0).standard_normal((5, 33)).astype(np.float32)
        (y,) = loaded(x)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5)
        path = loaded._lib.path
        assert path != planted
        assert os.path.dirname(path) == paths.private_dir()
        assert _mode(os.path.dirname(path)) == 0o700
    finally:
        os.unlink(planted)
        os.rmdir(old)


def test_loading_writes_a_fresh_exclusive_file_each_time(monkeypatch):
    monkeypatch.setattr(fragment, "_REGISTRY", {})
    compiled = _compiled_softmax(6)
    created: list[tuple[str, int]] = []
    real_open = os.open

    def spy(path, flags, *args, **kwargs):
        created.append((os.fspath(path), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    first = fragment.LoadedFragment(compiled)._lib.path
    second = fragment.LoadedFragment(compiled)._lib.path
    monkeypatch.setattr(os, "open", real_open)
    assert first != second
    for p in (first, second):
        (flags,) = [f for q, f in created if q == p]
        assert flags & os.O_CREAT and flags & os.O_EXCL
        assert os.path.dirname(p) == paths.private_dir()


def test_a_compile_builds_in_the_private_dir():
    compiled = _compiled_softmax(7)
    assert compiled.source_path is not None
    build = os.path.dirname(compiled.source_path)
    assert os.path.dirname(build) == paths.private_dir()
    assert _mode(build) == 0o700


def test_a_failed_compile_keeps_its_source_in_the_user_dir(tmp_path, monkeypatch):
    from accy.errors import FragmentCompileError

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(FragmentCompileError) as info:
        device.compile_host("void f(void** b) { return 1 }")
    kept = info.value.source_path
    assert kept.startswith(str(tmp_path / "accy" / "sources"))
    with open(kept) as f:
        assert "return 1" in f.read()


# --------------------------------------------------------------------------- user dirs


def test_user_dir_is_under_xdg_cache_home_and_0700(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("ACCY_REPRODUCER_DIR", raising=False)
    d = paths.user_dir("reproducers")
    assert d == str(tmp_path / "accy" / "reproducers")
    assert _mode(d) == 0o700 and _mode(str(tmp_path / "accy")) == 0o700


def test_user_dir_falls_back_to_home_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert paths.user_dir("sources") == str(tmp_path / ".cache" / "accy" / "sources")


def test_reproducer_dir_env_moves_reproducers_only(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ACCY_REPRODUCER_DIR", str(tmp_path / "repro"))
    assert paths.user_dir("reproducers") == str(tmp_path / "repro")
    assert paths.user_dir("sources") == str(tmp_path / "cache" / "accy" / "sources")


def test_user_dir_refuses_a_folder_others_can_write(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    shared = tmp_path / "accy" / "sources"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    with pytest.raises(AccyError, match="only it can write"):
        paths.user_dir("sources")


def test_reproducers_default_to_the_user_dir(tmp_path, monkeypatch):
    from accy.choir.passes import Reproducer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("ACCY_REPRODUCER_DIR", raising=False)
    path = Reproducer("p", "a-pass", {}, "boom", "").write()
    assert os.path.dirname(path) == str(tmp_path / "accy" / "reproducers")
