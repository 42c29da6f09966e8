"""Where accy writes files: the one module that decides it.

Two places, for two kinds of file:

- :func:`private_dir` — binaries and build folders. One directory per
  process, made by :func:`tempfile.mkdtemp` (mode 0700, an unpredictable
  name), created on first use and removed when the process exits (unless
  ``ACCY_KEEP_TEMPS=1``). A library is loaded only from a file this process
  has just created there with ``O_EXCL`` (:func:`fresh_file`), never from a
  path that may already exist: a fixed shared path such as
  ``/tmp/accy-loaded-<pid>/…`` lets any local user plant a library that
  ``dlopen`` then runs.
- :func:`user_dir` — what a person opens after the process is gone: failure
  reproducers and the sources of failed compiles. A per-user folder,
  ``$XDG_CACHE_HOME/accy/<kind>`` (``~/.cache/accy/<kind>``), created 0700;
  ``ACCY_REPRODUCER_DIR`` moves the reproducers.

Example
-------
>>> import os, stat
>>> d = private_dir()
>>> stat.S_IMODE(os.stat(d).st_mode) == 0o700, private_dir() == d
(True, True)
>>> p = fresh_file(b"bytes", "example-", ".bin")
>>> os.path.dirname(p) == d, open(p, "rb").read()
(True, b'bytes')
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
import threading

from accy.errors import AccyError
from accy.files import write_atomic

KEEP_TEMPS_ENV = "ACCY_KEEP_TEMPS"
"""Set to ``1`` to keep the private directory at exit (to inspect builds)."""

REPRODUCER_DIR_ENV = "ACCY_REPRODUCER_DIR"
"""Folder for failure reproducers (default ``user_dir("reproducers")``)."""

_LOCK = threading.Lock()
_PRIVATE: dict[int, str] = {}
"""pid -> this process's private directory (a forked child makes its own)."""


def _is_own_dir(path: str, others: int = 0o077) -> bool:
    """A directory (not a link) owned by this user, with none of the ``others`` mode bits."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & others


def _remove(path: str, pid: int) -> None:
    """atexit: remove ``path`` if this is the process that made it."""
    if os.getpid() != pid or os.environ.get(KEEP_TEMPS_ENV) == "1":
        return
    shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, not ours to signal
        return True
    return True


def _sweep_dead(parent: str) -> None:
    """Remove private directories of this user's accy processes that died without
    running atexit (SIGTERM, SIGKILL): ``accy-<pid>-*``, ours, 0700, pid gone."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if len(parts) != 3 or parts[0] != "accy" or not parts[1].isdigit():
            continue
        path = os.path.join(parent, name)
        if _is_own_dir(path) and not _alive(int(parts[1])):
            shutil.rmtree(path, ignore_errors=True)


def private_dir() -> str:
    """This process's private directory (0700, unpredictable name, removed at exit).

    Made lazily, once per process: a second process, or a forked child, gets
    its own. If it disappeared or stopped being private (a temp cleaner, a
    chmod), a new one is made. ``ACCY_KEEP_TEMPS=1`` keeps it at exit. The
    first call of a process also removes the private directories this user's
    dead accy processes left (killed before atexit ran); a process in another
    PID namespace sharing this temp folder would look dead, so give
    containers their own ``/tmp``.

    Example
    -------
    >>> os.path.basename(private_dir()).startswith("accy-")
    True
    """
    pid = os.getpid()
    with _LOCK:
        path = _PRIVATE.get(pid)
        if path is None or not _is_own_dir(path):
            if not _PRIVATE:
                _sweep_dead(tempfile.gettempdir())
            path = tempfile.mkdtemp(prefix=f"accy-{pid}-")
            os.chmod(path, 0o700)  # mkdtemp makes it 0700 already; the umask may only narrow it
            _PRIVATE[pid] = path
            atexit.register(_remove, path, pid)
        return path


def private_subdir(prefix: str) -> str:
    """A fresh folder inside :func:`private_dir` (for one build).

    Example
    -------
    >>> a, b = private_subdir("build-"), private_subdir("build-")
    >>> a != b and os.path.dirname(a) == private_dir()
    True
    """
    return tempfile.mkdtemp(prefix=prefix, dir=private_dir())


def fresh_file(data: bytes, prefix: str, suffix: str, directory: str | None = None) -> str:
    """Write ``data`` to a new file (``O_CREAT | O_EXCL``, mode 0600) and return its path.

    The file is in ``directory`` (default :func:`private_dir`) under a name
    no one could have chosen before: ``mkstemp`` creates it exclusively, so
    what is at the path is what this call wrote. Load libraries only from
    such a file.

    Example
    -------
    >>> a, b = fresh_file(b"x", "lib-", ".so"), fresh_file(b"x", "lib-", ".so")
    >>> a != b
    True
    """
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory or private_dir())
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        os.unlink(path)
        raise
    return path


def _cache_home() -> str:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")


def user_dir(kind: str) -> str:
    """This user's folder for files of ``kind`` (``"reproducers"``, ``"sources"``), made 0700.

    ``$XDG_CACHE_HOME/accy/<kind>``, else ``~/.cache/accy/<kind>``; for
    ``"reproducers"``, ``$ACCY_REPRODUCER_DIR`` when set (used as given).
    A default folder that exists but is not this user's own, or that others
    can write, is refused rather than written into.

    Example
    -------
    >>> user_dir("sources").endswith(os.path.join("accy", "sources"))
    True
    """
    if kind == "reproducers" and os.environ.get(REPRODUCER_DIR_ENV):
        path = os.environ[REPRODUCER_DIR_ENV]
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path
    path = _cache_home()
    os.makedirs(path, mode=0o700, exist_ok=True)
    for part in ("accy", kind):
        path = os.path.join(path, part)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    if not _is_own_dir(path, others=0o022):
        raise AccyError(f"{path} is not a folder of this user that only it can write; "
                        f"fix its owner or mode (0700), or set XDG_CACHE_HOME")
    return path


def keep_source(name: str, source: str) -> str:
    """Save the source of a failed compile where a person can open it later; return the path.

    The file keeps its ``name``, in a new folder of ``user_dir("sources")``.

    Example
    -------
    >>> p = keep_source("fragment.c", "int x;")
    >>> os.path.dirname(os.path.dirname(p)) == user_dir("sources"), os.path.basename(p)
    (True, 'fragment.c')
    """
    folder = tempfile.mkdtemp(prefix=f"{os.path.splitext(name)[0]}-", dir=user_dir("sources"))
    return write_atomic(os.path.join(folder, name), source)


def lasting_source(path: str | None, name: str, source: str) -> str:
    """Where an error should say a failed compile's source is: ``path`` if that
    outlives this process, else a copy kept by :func:`keep_source`.

    Example
    -------
    >>> lasting_source("/src/fragment.c", "fragment.c", "int x;")
    '/src/fragment.c'
    >>> lasting_source(os.path.join(private_dir(), "f.c"), "f.c", "").startswith(user_dir("sources"))
    True
    """
    if path is not None:
        real = os.path.realpath(path)
        if not any(os.path.commonpath([real, os.path.realpath(d)]) == os.path.realpath(d)
                   for d in _PRIVATE.values()):
            return path
    return keep_source(name, source)


# ------------------------------------------------- paths a command will write


def _make_folder(path: str) -> str | None:
    """Create ``path`` (and its parents); ``None``, or why it cannot be made."""
    try:
        os.makedirs(path, exist_ok=True)
        return None
    except OSError as e:
        probe = os.path.abspath(path)
        while probe and not os.path.exists(probe):
            probe = os.path.dirname(probe)
        if probe and not os.path.isdir(probe):
            return f"{probe} is a file, not a folder"
        return str(e.strerror or e)


def ensure_output_dir(path: str) -> str:
    """Create the output folder now (before any work) and check it can be written."""
    why = _make_folder(path)
    if why:
        raise AccyError(f"cannot create the output folder {path}: {why}")
    if not os.access(path, os.W_OK | os.X_OK):
        raise AccyError(f"cannot write to the output folder {path}: permission denied")
    return path


def check_writable_file(path: str, what: str) -> str:
    """Check, before any work, that a file can be written at ``path`` (its folder is
    made if missing); ``what`` names it in the error (``the report``)."""
    if os.path.isdir(path):
        raise AccyError(f"cannot write {what} to {path}: it is a folder")
    parent = os.path.dirname(os.path.abspath(path))
    why = _make_folder(parent)
    if why:
        raise AccyError(f"cannot write {what} to {path}: {why}")
    if not os.access(parent, os.W_OK | os.X_OK) or \
            (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise AccyError(f"cannot write {what} to {path}: permission denied")
    return path
