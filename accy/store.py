"""The artifact store: persistent, content-addressed, bounded, behind fsspec.

Stage products and compiled fragments outlive a cluster here. An entry is one
file ``<root>/<key[:2]>/<key>`` holding a small header (magic, payload length,
BLAKE2b-256 digest of the payload, kind) followed by the payload:

- **Atomic writes.** A put writes a temporary name in the same folder, then
  renames it over the final name (``os.replace`` on the local filesystem), so a
  reader sees the old entry, the new one, or none — never half of one.
- **Verified reads.** ``get`` checks the header and the digest; a corrupt or
  truncated entry counts as a miss and is removed, never raised.
- **Bounded.** After a put the store evicts least-recently-used entries until
  it holds at most ``max_bytes`` (file sizes, headers included). A get touches
  the entry's mtime, so the order survives a restart and is shared by every
  process using the store.

Several threads of one process may share an ``ArtifactStore``; several
processes may share a folder (each write is atomic; an entry another process
evicted is just a miss).

Example
-------
>>> import tempfile
>>> store = ArtifactStore(tempfile.mkdtemp(), max_bytes=1 << 20)
>>> store.put("ab12cd", b"payload")
True
>>> store.get("ab12cd"), store.get("ffff")
(b'payload', None)
>>> store.stats()["hits"], store.stats()["misses"]
(1, 1)
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import threading
import time
import uuid
from typing import Any

import fsspec.core

from accy.errors import StoreError

MAGIC = b"ACCYART1"
_HEAD = struct.Struct(">8sQ32sH")  # magic, payload length, blake2b-256 digest, kind length
_KEY = re.compile(r"[0-9a-f]{4,128}")
_TMP_PREFIX = ".tmp-"
_STALE_TMP_S = 3600.0
DEFAULT_URL = "~/.cache/accy/store"
DEFAULT_MAX_BYTES = 10 << 30
"""10 GiB, unless ``$ACCY_STORE_MAX_BYTES`` or ``accy.store-max-bytes`` says otherwise."""


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


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=32).digest()


def encode_entry(payload: bytes, kind: str) -> bytes:
    """The bytes of one stored entry: header + payload."""
    k = kind.encode()
    return _HEAD.pack(MAGIC, len(payload), _digest(payload), len(k)) + k + payload


def decode_entry(blob: bytes) -> tuple[str, bytes] | None:
    """``(kind, payload)``, or None when ``blob`` is not an intact entry."""
    if len(blob) < _HEAD.size:
        return None
    magic, length, digest, klen = _HEAD.unpack_from(blob)
    start = _HEAD.size + klen
    if magic != MAGIC or len(blob) != start + length:
        return None
    payload = blob[start:]
    if _digest(payload) != digest:
        return None
    try:
        kind = blob[_HEAD.size:start].decode()
    except UnicodeDecodeError:
        return None
    return kind, payload


class ArtifactStore:
    """A content-addressed store of byte artifacts at an fsspec URL.

    Parameters
    ----------
    url
        An fsspec URL (``file://``, ``s3://``, ``memory://`` …) or a plain path
        (a local folder, created if missing). None: :func:`default_store_url`.
    max_bytes
        Upper bound of the store's size; None: no bound.
    """

    def __init__(self, url: str | None = None, max_bytes: int | None = None) -> None:
        url = url if url is not None else default_store_url()
        if "://" not in url and "::" not in url:
            url = os.path.abspath(os.path.expanduser(url))
        if max_bytes is not None and max_bytes <= 0:
            raise StoreError(f"max_bytes must be positive, got {max_bytes}")
        self.url = url
        self.max_bytes = max_bytes
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.root = self.root.rstrip("/") or "/"
        protocol = self.fs.protocol
        self._local = "file" in (protocol if isinstance(protocol, tuple) else (protocol,))
        self._lock = threading.Lock()
        self._stats = {"hits": 0, "misses": 0, "corrupt": 0, "evictions": 0, "puts": 0}
        # key -> [size, last use (s)]; None until the first scan.
        self._index: dict[str, list[float]] | None = None
        self._total = 0
        self._last_stamp = 0.0
        try:
            self.fs.makedirs(self.root, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create the artifact store at {url}: {e}") from None

    @classmethod
    def default(cls) -> ArtifactStore:
        """The store the configuration names (URL and bound)."""
        return cls(default_store_url(), default_max_bytes())

    def __repr__(self) -> str:
        return f"ArtifactStore({self.url!r}, max_bytes={self.max_bytes})"

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

    def _touch(self, key: str, path: str, size: int | None = None) -> None:
        stamp = self._stamp()
        if self._local:
            try:
                os.utime(path, ns=(int(stamp * 1e9), int(stamp * 1e9)))
            except OSError:
                pass
        with self._lock:
            if self._index is not None:
                entry = self._index.get(key)
                if entry is not None:
                    entry[1] = stamp
                elif size is not None:
                    self._index[key] = [size, stamp]
                    self._total += size

    # -- reading
    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None (absent, corrupt or truncated).

        Example
        -------
        >>> import tempfile
        >>> ArtifactStore(tempfile.mkdtemp()).get("00ff")
        """
        path = self._path(key)
        try:
            blob = self.fs.cat_file(path)
        except (FileNotFoundError, IsADirectoryError):
            self._bump("misses")
            return None
        except OSError as e:
            raise StoreError(f"cannot read artifact {key} from {self.url}: {e}") from None
        decoded = decode_entry(bytes(blob))
        if decoded is None:
            self._bump("corrupt")
            self._bump("misses")
            self._remove(key, path)
            return None
        self._bump("hits")
        self._touch(key, path, len(blob))
        return decoded[1]

    def kind(self, key: str) -> str | None:
        """The kind an intact entry was stored with, or None."""
        path = self._path(key)
        try:
            decoded = decode_entry(bytes(self.fs.cat_file(path)))
        except (FileNotFoundError, IsADirectoryError):
            return None
        return decoded[0] if decoded else None

    def contains(self, key: str) -> bool:
        """Whether an entry exists under ``key`` (not verified: ``get`` verifies)."""
        return bool(self.fs.isfile(self._path(key)))

    __contains__ = contains

    # -- writing
    def put(self, key: str, data: bytes, kind: str = "product") -> bool:
        """Store ``data`` under ``key`` atomically; False when it alone exceeds ``max_bytes``.

        Writing a key that exists replaces it (same content, by construction
        of content addressing).
        """
        path = self._path(key)
        blob = encode_entry(bytes(data), kind)
        if self.max_bytes is not None and len(blob) > self.max_bytes:
            return False
        folder = path.rsplit("/", 1)[0]
        tmp = f"{folder}/{_TMP_PREFIX}{key}-{uuid.uuid4().hex}"
        try:
            if self._local:
                os.makedirs(folder, exist_ok=True)
                try:
                    with open(tmp, "wb") as f:
                        f.write(blob)
                    os.replace(tmp, path)
                except BaseException:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                    raise
            else:
                self.fs.makedirs(folder, exist_ok=True)
                self.fs.pipe_file(tmp, blob)
                self.fs.mv(tmp, path)
        except OSError as e:
            raise StoreError(f"cannot write artifact {key} to {self.url}: {e}") from None
        self._bump("puts")
        with self._lock:
            if self._index is not None:
                old = self._index.pop(key, None)
                if old is not None:
                    self._total -= int(old[0])
        self._touch(key, path, len(blob))
        self._evict(keep=key)
        return True

    def delete(self, key: str) -> bool:
        """Remove ``key``; True if it was there."""
        return self._remove(key, self._path(key))

    def _remove(self, key: str, path: str) -> bool:
        try:
            self.fs.rm_file(path)
            removed = True
        except FileNotFoundError:
            removed = False
        with self._lock:
            if self._index is not None:
                old = self._index.pop(key, None)
                if old is not None:
                    self._total -= int(old[0])
        return removed

    # -- size and eviction
    def _scan(self) -> tuple[dict[str, list[float]], int]:
        """Every entry on disk: key → [size, mtime]; sweeps stale temporary files."""
        found: dict[str, list[float]] = {}
        now = time.time()
        try:
            listing = self.fs.find(self.root, detail=True)
        except FileNotFoundError:
            listing = {}
        for path, info in listing.items():
            name = path.rsplit("/", 1)[-1]
            mtime = _mtime(info)
            if name.startswith(_TMP_PREFIX):
                if mtime and now - mtime > _STALE_TMP_S:
                    try:
                        self.fs.rm_file(path)
                    except FileNotFoundError:
                        pass
                continue
            if info.get("type") == "file" and _KEY.fullmatch(name):
                found[name] = [float(info.get("size") or 0), mtime]
        return found, int(sum(v[0] for v in found.values()))

    def _refresh_index(self) -> None:
        found, total = self._scan()
        with self._lock:
            old = self._index or {}
            for key, entry in found.items():
                if key in old:  # this process's own record of use is at least as fresh
                    entry[1] = max(entry[1], old[key][1])
            self._index, self._total = found, total

    def _evict(self, keep: str | None = None) -> None:
        if self.max_bytes is None:
            return
        with self._lock:
            known = self._index is not None and self._total <= self.max_bytes
        if known:
            return
        # Over the bound by this process's count (or never counted): look at the
        # disk, which other processes may have changed, then evict oldest first.
        self._refresh_index()
        with self._lock:
            assert self._index is not None
            order = sorted(self._index.items(), key=lambda kv: kv[1][1])
            victims: list[str] = []
            total = self._total
            for key, (size, _) in order:
                if total <= self.max_bytes:
                    break
                if key == keep:
                    continue
                victims.append(key)
                total -= int(size)
        for key in victims:
            if self._remove(key, self._path(key)):
                self._bump("evictions")

    def size_bytes(self) -> int:
        """Bytes the entries take on the store (headers included)."""
        self._refresh_index()
        with self._lock:
            return self._total

    def keys(self) -> list[str]:
        """Every key in the store, sorted."""
        self._refresh_index()
        with self._lock:
            assert self._index is not None
            return sorted(self._index)

    def __len__(self) -> int:
        return len(self.keys())

    # -- stats
    def _bump(self, name: str) -> None:
        with self._lock:
            self._stats[name] += 1

    def stats(self) -> dict[str, int]:
        """This object's counters: hits, misses, corrupt, evictions, puts."""
        with self._lock:
            return dict(self._stats)


def _mtime(info: dict[str, Any]) -> float:
    value = info.get("mtime", info.get("LastModified", info.get("created", 0.0)))
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    try:
        return float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0
