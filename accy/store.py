"""The artifact store: persistent, content-addressed, bounded, behind fsspec.

Stage products and compiled fragments outlive a cluster here. An entry is one
file ``<root>/<key[:2]>/<key>`` (format 2) holding a header (magic, flags, the
lengths of key, kind and payload, a BLAKE2b-256 digest, optionally an
HMAC-SHA256), then the key it was written for, its kind and the payload:

- **Atomic writes.** A put writes a temporary name in the same folder, then
  renames it over the final name (``os.replace`` on the local filesystem), so a
  reader sees the old entry, the new one, or none — never half of one.
- **Verified reads.** ``get`` checks the header and the digest; a corrupt or
  truncated entry (or one of format 1) counts as a miss and is removed.
- **Content bound to key.** An entry names the key and kind it was written
  for; an intact entry read under another key (a file copied over another
  key's path) or another kind is a miss, counted as ``mismatched``.
- **Authenticated entries.** With a secret (``auth_key=`` or
  ``$ACCY_STORE_KEY``) every entry carries an HMAC-SHA256 over (key, kind,
  payload) and a read accepts only entries whose HMAC checks (else a miss,
  counted as ``unauthenticated``). **Without a secret, whoever can write the
  store can run code on whoever reads it**: stage products and compiled
  fragments are loaded and executed. Set a secret wherever the store's folder
  or bucket is writable by anyone the readers do not trust.
- **Bounded, by shared accounting.** A local store keeps its byte total in a
  small ledger file ``<root>/.accy-ledger`` guarded by an ``fcntl`` lock, so
  every process sharing the folder evicts on the same count. A put reserves
  its bytes first (evicting least-recently-used entries until they fit), so
  the store, in-flight temporaries included, stays within ``max_bytes``.
  Eviction walks a least-recently-used list built by one scan of the folder
  and re-stats each victim (an entry used since the scan is skipped), and
  scans again only when that list is used up: O(1) amortised per put. A
  remote (fsspec) store keeps the same accounting per process only: best
  effort when several processes share it.
- **Temporaries of dead writers** are named with the writer's pid and host;
  a scan removes those whose writer is gone, or older than five minutes, and
  until then they count against the bound.
- **Only a cache tier.** A put that cannot write (full or read-only disk, a
  directory on the entry's path, no permission) returns False and counts
  ``put_errors``; an unreadable entry is a miss counted as ``read_errors``.
  The first failure of each kind is logged as a warning.

A get touches the entry's mtime, so the LRU order survives a restart and is
shared by every process using the store. Several threads of one process may
share an ``ArtifactStore``; several processes may share a folder.

Example
-------
>>> import tempfile
>>> store = ArtifactStore(tempfile.mkdtemp(), max_bytes=1 << 20)
>>> store.put("ab12cd", b"payload", kind="compile")
True
>>> store.get("ab12cd", kind="compile"), store.get("ffff")
(b'payload', None)
>>> store.stats()["hits"], store.stats()["misses"]
(1, 1)
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import hmac
import itertools
import logging
import os
import re
import socket
import struct
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

import fsspec.core

from accy.errors import StoreError

try:  # POSIX; elsewhere a local store falls back to per-process accounting
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

MAGIC = b"ACCYART2"
"""Entry format 2: key and kind embedded, optional HMAC. Format 1 entries are misses."""
_HEAD = struct.Struct(">8sBxHHQ32s")  # magic, flags, key len, kind len, payload len, digest
_FRAME = struct.Struct(">HHQ")  # what the digest and the HMAC cover, before key+kind+payload
_FLAG_MAC = 1
_MAC_SIZE = 32
_MAC_DOMAIN = b"accy-store-entry-v2\0"
_KEY = re.compile(r"[0-9a-f]{4,128}")
_TMP_PREFIX = ".tmp-"
_TMP = re.compile(r"\.tmp-p(\d+)-h([0-9a-f]{8})-[0-9a-f]+")
_STALE_TMP_S = 300.0
"""A temporary file older than this is abandoned even if its writer's pid is alive."""
_LEDGER = ".accy-ledger"
_LEDGER_MAGIC = b"ACCYLDG1"
_LEDGER_REC = struct.Struct(">8sq")  # magic, byte total
_HOST = hashlib.blake2b(socket.gethostname().encode(), digest_size=4).hexdigest()
DEFAULT_URL = "~/.cache/accy/store"
DEFAULT_MAX_BYTES = 10 << 30
"""10 GiB, unless ``$ACCY_STORE_MAX_BYTES`` or ``accy.store-max-bytes`` says otherwise."""
STAT_NAMES = ("hits", "misses", "corrupt", "mismatched", "unauthenticated", "evictions",
              "puts", "put_errors", "read_errors")
"""The counters :meth:`ArtifactStore.stats` reports."""


def default_store_url() -> str:
    """``$ACCY_STORE``, else Dask config ``accy.store``, else ``~/.cache/accy/store``.

    Example
    -------
    >>> isinstance(default_store_url(), str)
    True
    """
    env = os.environ.get("ACCY_STORE")
    if env:
        return env
    try:
        import dask.config
    except ImportError:  # pragma: no cover - dask is a dependency, but optional here
        return DEFAULT_URL
    return str(dask.config.get("accy.store", DEFAULT_URL) or DEFAULT_URL)


def default_max_bytes() -> int:
    """``$ACCY_STORE_MAX_BYTES``, else Dask config ``accy.store-max-bytes``, else 10 GiB."""
    env = os.environ.get("ACCY_STORE_MAX_BYTES")
    if env:
        return int(env)
    try:
        import dask.config
    except ImportError:  # pragma: no cover
        return DEFAULT_MAX_BYTES
    value = dask.config.get("accy.store-max-bytes", None)
    return int(value) if value is not None else DEFAULT_MAX_BYTES


def default_auth_key() -> bytes | None:
    """``$ACCY_STORE_KEY`` as UTF-8 bytes, or None when unset or empty.

    Example
    -------
    >>> default_auth_key() is None or isinstance(default_auth_key(), bytes)
    True
    """
    env = os.environ.get("ACCY_STORE_KEY")
    return env.encode() if env else None


# ------------------------------------------------------------------ entry format


class Entry(NamedTuple):
    """A decoded entry: the key and kind it was written for, and its payload."""

    key: str
    kind: str
    payload: bytes


def _frame(key: bytes, kind: bytes, payload: bytes) -> bytes:
    return _FRAME.pack(len(key), len(kind), len(payload)) + key + kind + payload


def _mac(secret: bytes, framed: bytes) -> bytes:
    return hmac.new(secret, _MAC_DOMAIN + framed, hashlib.sha256).digest()


def encode_entry(payload: bytes, kind: str, key: str = "", *,
                 secret: bytes | None = None) -> bytes:
    """The bytes of one stored entry, bound to ``key`` and ``kind``.

    Parameters
    ----------
    payload
        The artifact's bytes.
    kind
        What the artifact is (``"contract"`` … ``"target"``, ``"fragment"``).
    key
        The key the entry is written for. The default (no key, for callers
        of format 1's ``encode_entry(payload, kind)``) makes an entry that no
        ``get`` accepts: it is counted as ``mismatched`` under every key.
    secret
        When given, the entry carries an HMAC-SHA256 of (key, kind, payload).

    Example
    -------
    >>> decode_entry(encode_entry(b"abc", "fragment", "00ff"))
    Entry(key='00ff', kind='fragment', payload=b'abc')
    """
    k, kd = key.encode(), kind.encode()
    framed = _frame(k, kd, payload)
    flags = _FLAG_MAC if secret else 0
    head = _HEAD.pack(MAGIC, flags, len(k), len(kd), len(payload),
                      hashlib.blake2b(framed, digest_size=32).digest())
    mac = _mac(secret, framed) if secret else b""
    return head + mac + k + kd + payload


def _decode(blob: bytes, secret: bytes | None) -> tuple[Entry | None, str]:
    """The entry and ``"ok"``, or None and why: corrupt or unauthenticated."""
    if len(blob) < _HEAD.size:
        return None, "corrupt"
    magic, flags, klen, kdlen, plen, digest = _HEAD.unpack_from(blob)
    mlen = _MAC_SIZE if flags & _FLAG_MAC else 0
    start = _HEAD.size + mlen
    if magic != MAGIC or flags & ~_FLAG_MAC or len(blob) != start + klen + kdlen + plen:
        return None, "corrupt"
    k = blob[start:start + klen]
    kd = blob[start + klen:start + klen + kdlen]
    payload = blob[start + klen + kdlen:]
    framed = _frame(k, kd, payload)
    if hashlib.blake2b(framed, digest_size=32).digest() != digest:
        return None, "corrupt"
    try:
        entry = Entry(k.decode(), kd.decode(), payload)
    except UnicodeDecodeError:
        return None, "corrupt"
    if secret is not None:
        mac = blob[_HEAD.size:start]
        if not mlen or not hmac.compare_digest(mac, _mac(secret, framed)):
            return None, "unauthenticated"
    return entry, "ok"


def decode_entry(blob: bytes, *, secret: bytes | None = None) -> Entry | None:
    """The :class:`Entry` in ``blob``, or None when it is not intact.

    With ``secret``, an entry without a valid HMAC under it is None too.
    """
    return _decode(bytes(blob), secret)[0]


# ------------------------------------------------------------------ accounting


class _ProcessLedger:
    """The byte total of a store as one process sees it (remote stores)."""

    shared = False

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._total: int | None = None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with self._lock:
            yield

    def read(self) -> int | None:
        return self._total

    def write(self, total: int) -> None:
        self._total = max(0, int(total))


class _FileLedger(_ProcessLedger):
    """The byte total of a local store in a file every process shares, under ``flock``."""

    shared = True

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self._fd: int | None = None
        self._pid = 0
        self._depth = 0

    def _open(self) -> int:
        if self._fd is None or self._pid != os.getpid():
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            self._pid = os.getpid()
        return self._fd

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        if self._pid and self._pid != os.getpid():
            # A forked child: its copy of the thread lock may be held by a thread that
            # does not exist here, and it needs its own open file (flock is per file).
            self._lock, self._fd, self._depth, self._pid = threading.RLock(), None, 0, 0
        with self._lock:  # threads first (flock does not exclude threads sharing one fd)
            fd = self._open()
            if self._depth == 0:
                fcntl.flock(fd, fcntl.LOCK_EX)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fcntl.flock(fd, fcntl.LOCK_UN)

    def read(self) -> int | None:
        raw = os.pread(self._open(), _LEDGER_REC.size, 0)
        if len(raw) != _LEDGER_REC.size:
            return None
        magic, total = _LEDGER_REC.unpack(raw)
        return total if magic == _LEDGER_MAGIC and total >= 0 else None

    def write(self, total: int) -> None:
        os.pwrite(self._open(), _LEDGER_REC.pack(_LEDGER_MAGIC, max(0, int(total))), 0)

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None


LEASE_BYTES = 1 << 20
"""What a process reserves in a shared ledger ahead of its puts, in a store bounded
at 64 leases or more: while the store is below half its bound, a put takes its bytes
from this lease, and the ledger's lock is taken once a lease, not twice a put. A scan
recounts the files and so forgets the leases held then: the ledger may read up to a
lease per writing process low until the next scan (a turnover of the bound), far
inside the half of the bound left free. Smaller stores reserve every put exactly. Fifteen batch workers writing seven products a variant queued on that lock:
on the H200 machine 64 % of their task time was spent waiting for it (Dask's
profile of the 480-variant distinct batch, RESULTS.md, batch, tenth session)."""


class _Lease:
    """Bytes this process reserved in a shared ledger and has not written yet."""

    def __init__(self) -> None:
        self.bytes = 0
        self.pid = os.getpid()

    def here(self) -> _Lease:
        """This lease as this process holds it (a forked child holds none)."""
        if self.pid != os.getpid():
            self.bytes, self.pid = 0, os.getpid()
        return self


def _release(ledger: _ProcessLedger, lease: _Lease) -> None:
    """Give an unused lease back to the ledger and close it (a store's finaliser; also
    at interpreter exit). Never raises: a ledger left high is recounted by a scan."""
    try:
        if lease.bytes and lease.pid == os.getpid():
            with ledger.locked():
                total = ledger.read()
                if total is not None:
                    ledger.write(total - lease.bytes)
        lease.bytes = 0
        close = getattr(ledger, "close", None)
        if close is not None:
            close()
    except Exception:  # noqa: BLE001 - a finaliser never raises
        pass


_TMP_SEQ: list[tuple[int, str, Iterator[int]]] = [(0, "", itertools.count())]
"""The process that drew the temporary names' token, the token and its counter."""


def _tmp_name() -> str:
    """A temporary file's name, unique across processes and hosts: pid, host, then a
    random token drawn once a process (again after a fork) and a counter: a ``uuid4``
    (``os.urandom``) every put was 8 % of a put's time (py-spy, 2 workers of a batch)."""
    pid = os.getpid()
    seq = _TMP_SEQ[0]
    if seq[0] != pid:
        seq = _TMP_SEQ[0] = (pid, uuid.uuid4().hex[:16], itertools.count())
    return f"{_TMP_PREFIX}p{pid}-h{_HOST}-{seq[1]}{next(seq[2]):x}"


def _tmp_is_abandoned(name: str, mtime: float, now: float) -> bool:
    """Whether a temporary file's writer is gone (same host, pid not running) or it is old."""
    if now - mtime > _STALE_TMP_S:
        return True
    m = _TMP.fullmatch(name)
    if m is None or m.group(2) != _HOST:
        return False
    pid = int(m.group(1))
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # e.g. EPERM: alive, someone else's
        return False
    return False


def _write_all(fd: int, blob: bytes) -> None:
    """Write ``blob`` at the start of ``fd`` (one place, so tests can make a disk full)."""
    view = memoryview(blob)
    offset = 0
    while offset < len(view):
        offset += os.pwrite(fd, view[offset:], offset)


# ------------------------------------------------------------------ the store


class ArtifactStore:
    """A content-addressed store of byte artifacts at an fsspec URL.

    Parameters
    ----------
    url
        An fsspec URL (``file://``, ``s3://``, ``memory://`` …) or a plain path
        (a local folder, created if missing). None: :func:`default_store_url`.
    max_bytes
        Upper bound of the store's size; None: no bound.
    auth_key
        Secret for the entries' HMAC-SHA256 (bytes, or a str taken as UTF-8);
        None: :func:`default_auth_key` (``$ACCY_STORE_KEY``, which Dask workers
        need in their environment); empty: no authentication even when the
        variable is set. Without a secret entries are not authenticated.

    Example
    -------
    >>> import tempfile
    >>> store = ArtifactStore(tempfile.mkdtemp(), auth_key=b"s3cret")
    >>> store.put("0a0b", b"x", kind="fragment"), store.get("0a0b", kind="fragment")
    (True, b'x')
    """

    def __init__(self, url: str | None = None, max_bytes: int | None = None, *,
                 auth_key: bytes | str | None = None) -> None:
        url = url if url is not None else default_store_url()
        if "://" not in url and "::" not in url:
            url = os.path.abspath(os.path.expanduser(url))
        if max_bytes is not None and max_bytes <= 0:
            raise StoreError(f"max_bytes must be positive, got {max_bytes}")
        self.url = url
        self.max_bytes = max_bytes
        secret = auth_key if auth_key is not None else default_auth_key()
        self._secret = (secret.encode() if isinstance(secret, str) else secret) or None
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.root = self.root.rstrip("/") or "/"
        protocol = self.fs.protocol
        self._local = "file" in (protocol if isinstance(protocol, tuple) else (protocol,))
        self._lock = threading.Lock()
        self._stats = dict.fromkeys(STAT_NAMES, 0)
        self._warned: set[str] = set()
        self._last_stamp = 0.0
        # Least recently used first, from the last scan: (key, size, mtime).
        self._lru: collections.deque[tuple[str, int, float]] = collections.deque()
        self._used: dict[str, float] = {}  # remote stores: this process's last use per key
        self._put_since_scan = 0  # bytes this object put since its last scan
        self._tmps: list[tuple[str, str, int, float]] = []  # live temporaries at the last scan
        try:
            self.fs.makedirs(self.root, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create the artifact store at {url}: {e}") from None
        shared = self._local and fcntl is not None
        self._ledger = _FileLedger(f"{self.root}/{_LEDGER}") if shared else _ProcessLedger()
        self._lease = _Lease()
        weakref.finalize(self, _release, self._ledger, self._lease)

    @classmethod
    def default(cls) -> ArtifactStore:
        """The store the configuration names (URL, bound and authentication key)."""
        return cls(default_store_url(), default_max_bytes())

    @property
    def authenticated(self) -> bool:
        """Whether entries are written with, and read only with, a valid HMAC."""
        return self._secret is not None

    def __repr__(self) -> str:
        return (f"ArtifactStore({self.url!r}, max_bytes={self.max_bytes}, "
                f"authenticated={self.authenticated})")

    # -- paths
    def _path(self, key: str) -> str:
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise StoreError(f"artifact keys are lowercase hex strings, got {key!r}")
        return f"{self.root}/{key[:2]}/{key}"

    def _stamp(self) -> float:
        """A strictly increasing wall-clock stamp (orders accesses in this process)."""
        with self._lock:
            now = max(time.time(), self._last_stamp + 1e-6)
            self._last_stamp = now
            return now

    def _touch(self, key: str, path: str) -> None:
        stamp = self._stamp()
        if self._local:
            with contextlib.suppress(OSError):
                os.utime(path, ns=(int(stamp * 1e9), int(stamp * 1e9)))
        else:
            with self._lock:
                self._used[key] = stamp

    def _failed(self, what: str, counter: str, key: str, e: BaseException) -> None:
        self._bump(counter)
        with self._lock:
            first = what not in self._warned
            self._warned.add(what)
        (log.warning if first else log.debug)(
            "artifact store %s: cannot %s %s (%s: %s); the store is a cache, carrying on"
            "%s", self.url, what, key, type(e).__name__, e,
            " (further failures are logged at debug level)" if first else "")

    # -- reading
    def _read(self, key: str) -> tuple[Entry | None, str]:
        """The verified entry at ``key``'s path and ``"ok"``, or None and why not."""
        path = self._path(key)
        try:
            blob = self._read_bytes(path)
        except (FileNotFoundError, NotADirectoryError):
            return None, "absent"
        except (IsADirectoryError, OSError) as e:
            self._failed("read", "read_errors", key, e)
            return None, "unreadable"
        entry, why = _decode(blob, self._secret)
        if entry is None and why == "corrupt":
            self._remove(key, path)
        return entry, why

    def _read_bytes(self, path: str) -> bytes:
        """The file's bytes; on a local store one ``open`` (a miss through fsspec's file
        object cost 4x as much, and a batch misses every stage it runs)."""
        if self._local:
            with open(path, "rb") as f:
                return f.read()
        return bytes(self.fs.cat_file(path))

    def get(self, key: str, kind: str | None = None) -> bytes | None:
        """The payload stored under ``key``, or None.

        Parameters
        ----------
        key
            The artifact's key (lowercase hex).
        kind
            The kind the entry must have been written with; None: any kind.

        Returns
        -------
        bytes or None
            None when the entry is absent, unreadable, corrupt, truncated, of
            an older format, written for another key or kind, or (with an
            authentication key) not authenticated. Each is counted in
            :meth:`stats`; a corrupt entry is also removed.

        Example
        -------
        >>> import tempfile
        >>> ArtifactStore(tempfile.mkdtemp()).get("00ff")
        """
        entry, why = self._read(key)
        if entry is not None and (entry.key != key or (kind is not None and entry.kind != kind)):
            entry, why = None, "mismatched"
        if entry is None:
            if why in ("corrupt", "mismatched", "unauthenticated"):
                self._bump(why)
            self._bump("misses")
            return None
        self._bump("hits")
        self._touch(key, self._path(key))
        return entry.payload

    def kind(self, key: str) -> str | None:
        """The kind an intact entry written for ``key`` was stored with, or None."""
        entry, _ = self._read(key)
        return entry.kind if entry is not None and entry.key == key else None

    def contains(self, key: str) -> bool:
        """Whether an entry exists under ``key`` (not verified: ``get`` verifies)."""
        try:
            return bool(self.fs.isfile(self._path(key)))
        except OSError:
            return False

    __contains__ = contains

    # -- writing
    def put(self, key: str, data: bytes, kind: str = "product") -> bool:
        """Store ``data`` under ``key`` atomically, bound to ``key`` and ``kind``.

        Writing a key that exists replaces it (same content, by construction
        of content addressing). Least recently used entries are evicted first
        so that the store stays within ``max_bytes``.

        Returns
        -------
        bool
            True when stored; False when the entry alone exceeds ``max_bytes``
            or the store could not be written (counted as ``put_errors`` in
            :meth:`stats`, never raised). A key that is not lowercase hex
            raises :class:`~accy.errors.StoreError`.
        """
        path = self._path(key)
        blob = encode_entry(bytes(data), kind, key, secret=self._secret)
        size = len(blob)
        if self.max_bytes is not None and size > self.max_bytes:
            return False
        folder = path.rsplit("/", 1)[0]
        tmp = f"{folder}/{_tmp_name()}"
        try:
            if self._local:
                self._put_local(key, path, folder, tmp, blob)
            else:
                self._put_remote(key, path, folder, tmp, blob)
        except OSError as e:
            self._failed("write", "put_errors", key, e)
            return False
        self._bump("puts")
        self._touch(key, path)
        return True

    def _put_local(self, key: str, path: str, folder: str, tmp: str, blob: bytes) -> None:
        size = len(blob)
        # Reserve, then create the temporary at its full size: under the ledger's lock,
        # so a scan by any process counts exactly what the ledger holds for this write
        # — or, from this process's lease, without it (see LEASE_BYTES).
        leased, fd = self._reserve(size, key, folder, tmp)
        try:
            try:
                if fd is None:
                    fd = self._create(folder, tmp)
                    os.ftruncate(fd, size)
                _write_all(fd, blob)
            finally:
                if fd is not None:
                    os.close(fd)
            if leased:
                old = _file_size(path)
                os.replace(tmp, path)
                if old:  # rewrote an entry (same content, by construction): bytes freed
                    with self._lock:
                        self._lease.here().bytes += old
                return
            with self._ledger.locked():
                old = _file_size(path)
                os.replace(tmp, path)
                self._add(-old)
        except BaseException:
            if leased:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                with self._lock:
                    self._lease.here().bytes += size
                raise
            with self._ledger.locked():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                    self._add(-size)
            raise

    def _reserve(self, size: int, key: str, folder: str, tmp: str) -> tuple[bool, int | None]:
        """Reserve ``size`` bytes for a put of ``key``: (whether they came from this
        process's lease, the temporary's descriptor when it was created here, under the
        lock). Below half the bound the ledger grants :data:`LEASE_BYTES` more than
        asked, so the next puts take no lock; nearer the bound every put reserves
        exactly its bytes, evicting for them."""
        with self._lock:
            lease = self._lease.here()
            if lease.bytes >= size:
                lease.bytes -= size
                return True, None
        with self._ledger.locked():
            total = self._ledger.read()
            with self._lock:
                lease = self._lease.here()
                if lease.bytes >= size:  # another thread took a lease meanwhile
                    lease.bytes -= size
                    return True, None
                extra = self._lease_size()
                if total is None or (self.max_bytes is not None
                                     and 2 * (total + size + extra) > self.max_bytes):
                    extra = 0
            total = self._make_room(size + extra, keep=key)
            fd = self._create(folder, tmp)
            try:
                os.ftruncate(fd, size)
            except BaseException:
                os.close(fd)
                os.unlink(tmp)
                raise
            self._ledger.write(total + size + extra)
            with self._lock:
                self._lease.here().bytes += extra
            return bool(extra), fd

    def _lease_size(self) -> int:
        bound = self.max_bytes if self.max_bytes is not None else LEASE_BYTES * 64
        return LEASE_BYTES if bound >= 64 * LEASE_BYTES else 0

    @staticmethod
    def _create(folder: str, tmp: str) -> int:
        """Create the temporary ``tmp``, making ``folder`` only when it is missing (a
        ``makedirs`` every put was a tenth of a put's time)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            return os.open(tmp, flags, 0o666)
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)
            return os.open(tmp, flags, 0o666)

    def _put_remote(self, key: str, path: str, folder: str, tmp: str, blob: bytes) -> None:
        with self._ledger.locked():
            self._ledger.write(self._make_room(len(blob), keep=key) + len(blob))
        try:
            self.fs.makedirs(folder, exist_ok=True)
            self.fs.pipe_file(tmp, blob)
            with self._ledger.locked():
                try:
                    old = int(self.fs.info(path).get("size") or 0)
                except FileNotFoundError:
                    old = 0
                self.fs.mv(tmp, path)
                self._add(-old)
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.rm_file(tmp)
            self._add(-len(blob))
            raise

    def delete(self, key: str) -> bool:
        """Remove ``key``; True if it was there."""
        return self._remove(key, self._path(key))

    def _remove(self, key: str, path: str) -> bool:
        try:
            with self._ledger.locked():
                size = self._entry_size(path)
                self.fs.rm_file(path)
                self._add(-size)
        except FileNotFoundError:
            return False
        except OSError as e:
            self._failed("remove", "put_errors", key, e)
            return False
        with self._lock:
            self._used.pop(key, None)
        return True

    # -- size and eviction
    def _add(self, delta: int) -> None:
        """Add ``delta`` to the ledger's total (the caller holds the ledger lock)."""
        with self._ledger.locked():
            total = self._ledger.read()
            if total is not None:
                self._ledger.write(total + delta)

    def _entry_size(self, path: str) -> int:
        if self._local:
            return _file_size(path)
        try:
            return int(self.fs.info(path).get("size") or 0)
        except FileNotFoundError:
            return 0

    def _stat(self, key: str) -> tuple[int, float] | None:
        """Size and last use of ``key``'s entry, or None when it is gone."""
        path = self._path(key)
        if self._local:
            try:
                st = os.stat(path)
            except OSError:
                return None
            return st.st_size, st.st_mtime
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        with self._lock:
            used = self._used.get(key, 0.0)
        return int(info.get("size") or 0), max(_mtime(info), used)

    def _make_room(self, need: int, keep: str | None = None) -> int:
        """Evict LRU entries until ``need`` more bytes fit; the ledger's total after.

        The caller holds the ledger lock. Victims come from the LRU list of the
        last scan; each is re-statted, and one used since the scan is skipped
        (it is no longer among the least recently used). When the list runs
        out, one new scan rebuilds it and recounts the store.
        """
        total = self._ledger.read()
        self._put_since_scan += need
        if total is None or (self.max_bytes is not None
                             and self._put_since_scan > self.max_bytes):
            # No count yet, or a turnover of the whole bound since this object last
            # looked: recount, so a drifted ledger (a writer killed mid-put, files
            # changed by hand) is corrected at least once per turnover.
            total = self._scan()
        if self.max_bytes is None:
            return total
        scanned = False
        if total + need > self.max_bytes and self._tmps:
            total -= self._sweep_known_temporaries()
        while total + need > self.max_bytes:
            if not self._lru:
                if scanned:
                    break  # nothing left to evict (in-flight writes hold the rest)
                total, scanned = self._scan(), True
                continue
            key, _, seen = self._lru.popleft()
            if key == keep:
                continue
            now = self._stat(key)
            if now is None or now[1] > seen:
                continue  # evicted by someone else, or used since the scan
            try:
                self.fs.rm_file(self._path(key))
            except FileNotFoundError:
                continue
            total -= now[0]
            self._bump("evictions")
            with self._lock:
                self._used.pop(key, None)
        self._ledger.write(total)
        return total

    def _sweep_known_temporaries(self) -> int:
        """Remove the temporaries of the last scan whose writer died since; bytes freed.

        They hold a reservation in the ledger, so freeing them comes before
        evicting entries (the caller holds the ledger lock).
        """
        freed, live, now = 0, [], time.time()
        for path, name, size, mtime in self._tmps:
            if not _tmp_is_abandoned(name, mtime, now):
                live.append((path, name, size, mtime))
                continue
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:  # renamed by its writer, or swept by another process
                continue
            freed += size
        self._tmps = live
        return freed

    def _scan(self) -> int:
        """Recount the store (under the ledger lock): rebuild the LRU list, sweep
        abandoned temporaries, write and return the true total (live temporaries
        included, as their writers reserved them)."""
        with self._ledger.locked():
            entries, tmps, total = [], [], 0
            now = time.time()
            for path, name, size, mtime in self._listing():
                if name.startswith(_TMP_PREFIX):
                    if _tmp_is_abandoned(name, mtime, now):
                        with contextlib.suppress(FileNotFoundError):
                            self.fs.rm_file(path)
                        continue
                    tmps.append((path, name, size, mtime))
                    total += size
                elif _KEY.fullmatch(name):
                    if not self._local:
                        with self._lock:
                            mtime = max(mtime, self._used.get(name, 0.0))
                    entries.append((name, size, mtime))
                    total += size
            entries.sort(key=lambda e: e[2])
            self._lru = collections.deque(entries)
            self._tmps = tmps
            self._put_since_scan = 0
            self._ledger.write(total)
            return total

    def _listing(self) -> Iterator[tuple[str, str, int, float]]:
        """(path, name, size, mtime) of every file one level under the root."""
        if self._local:
            try:
                folders = [d for d in os.scandir(self.root) if d.is_dir(follow_symlinks=False)]
            except FileNotFoundError:
                return
            for d in folders:
                try:
                    files = list(os.scandir(d.path))
                except (FileNotFoundError, NotADirectoryError):
                    continue
                for f in files:
                    try:
                        if not f.is_file(follow_symlinks=False):
                            continue
                        st = f.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    yield f.path, f.name, st.st_size, st.st_mtime
            return
        try:
            listing = self.fs.find(self.root, detail=True)
        except FileNotFoundError:
            return
        for path, info in listing.items():
            if info.get("type", "file") == "file":
                yield path, path.rsplit("/", 1)[-1], int(info.get("size") or 0), _mtime(info)

    def size_bytes(self) -> int:
        """Bytes the store holds (headers and in-flight temporaries included); recounts.

        Raises :class:`~accy.errors.StoreError` when the store cannot be listed.
        """
        try:
            return self._scan()
        except OSError as e:
            raise StoreError(f"cannot count the artifact store at {self.url}: {e}") from None

    def keys(self) -> list[str]:
        """Every key in the store, sorted (recounts the store).

        Raises :class:`~accy.errors.StoreError` when the store cannot be listed.
        """
        try:
            with self._ledger.locked():
                self._scan()
                return sorted(key for key, _, _ in self._lru)
        except OSError as e:
            raise StoreError(f"cannot list the artifact store at {self.url}: {e}") from None

    def __len__(self) -> int:
        return len(self.keys())

    # -- stats
    def _bump(self, name: str) -> None:
        with self._lock:
            self._stats[name] += 1

    def stats(self) -> dict[str, int]:
        """This object's counters (:data:`STAT_NAMES`).

        ``misses`` counts every get that returned None; ``corrupt``,
        ``mismatched`` (written for another key or kind), ``unauthenticated``
        and ``read_errors`` say why some of them did. ``put_errors`` counts
        puts (and removals) that could not write.
        """
        with self._lock:
            return dict(self._stats)


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
    except OSError as e:
        if e.errno == errno.ENOTDIR:
            return 0
        raise


def _mtime(info: dict[str, Any]) -> float:
    value = info.get("mtime", info.get("LastModified", info.get("created", 0.0)))
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    try:
        return float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0
