"""ArtifactStore: atomic writes, verified and authenticated reads, a bound shared by
processes, LRU eviction, persistence, and failures that never reach the caller."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import dask.config
import pytest

import accy
import accy.store
from accy.errors import StoreError
from accy.store import (
    ArtifactStore,
    Entry,
    decode_entry,
    default_store_url,
    encode_entry,
)


def key(i: int) -> str:
    return f"{i:032x}"


def all_files(root: str) -> list[str]:
    """Every file of the store but its ledger."""
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, _, files in os.walk(root) for f in files
                  if os.path.join(d, f) != os.path.join(root, ".accy-ledger"))


def temp_files(root: str) -> list[str]:
    return [f for f in all_files(root) if os.path.basename(f).startswith(".tmp-")]


def test_put_get_round_trip_and_layout(tmp_path):
    store = ArtifactStore(str(tmp_path))
    assert store.put("abcdef01", b"hello", kind="product")
    assert store.get("abcdef01") == b"hello"
    assert store.kind("abcdef01") == "product"
    assert all_files(str(tmp_path)) == [os.path.join("ab", "abcdef01")]
    assert (tmp_path / ".accy-ledger").is_file()
    assert store.contains("abcdef01") and "abcdef01" in store
    assert not store.contains("abcdef02")
    assert store.keys() == ["abcdef01"]
    assert store.size_bytes() == os.path.getsize(tmp_path / "ab" / "abcdef01")
    assert store.delete("abcdef01") and not store.delete("abcdef01")
    assert store.get("abcdef01") is None
    assert store.stats() == {"hits": 1, "misses": 1, "corrupt": 0, "mismatched": 0,
                             "unauthenticated": 0, "evictions": 0, "puts": 1,
                             "put_errors": 0, "read_errors": 0}


def test_empty_payload_and_overwrite(tmp_path):
    store = ArtifactStore(str(tmp_path))
    store.put("00aa", b"")
    assert store.get("00aa") == b""
    store.put("00aa", b"second")
    assert store.get("00aa") == b"second"
    assert store.keys() == ["00aa"]
    assert temp_files(str(tmp_path)) == []


@pytest.mark.parametrize("bad", ["", "ABCD", "zz12", "../etc", "ab", "a" * 200, 1234])
def test_bad_keys_are_refused(tmp_path, bad):
    store = ArtifactStore(str(tmp_path))
    with pytest.raises(StoreError, match="hex"):
        store.put(bad, b"x")  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        store.get(bad)  # type: ignore[arg-type]


def test_concurrent_puts_of_one_key_leave_one_intact_entry(tmp_path):
    store = ArtifactStore(str(tmp_path), max_bytes=1 << 20)
    payload = os.urandom(64 * 1024)
    barrier = threading.Barrier(8)

    def writer(_: int) -> bool:
        barrier.wait()
        ok = True
        for _ in range(20):
            ok &= store.put("feedbeef", payload)
            got = store.get("feedbeef")
            ok &= got == payload  # a reader never sees half an entry
        return ok

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(writer, range(8)))
    assert all_files(str(tmp_path)) == [os.path.join("fe", "feedbeef")]
    assert store.get("feedbeef") == payload
    assert store.stats()["corrupt"] == 0
    assert store.size_bytes() == len(encode_entry(payload, "product", "feedbeef"))


def test_concurrent_puts_of_many_keys_respect_the_bound(tmp_path):
    entry = len(encode_entry(b"x" * 1000, "product", key(0)))
    store = ArtifactStore(str(tmp_path), max_bytes=entry * 10)

    def writer(t: int) -> None:
        for i in range(25):
            store.put(key(t * 100 + i), b"x" * 1000)
            store.get(key(t * 100 + i))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(writer, range(4)))
    assert temp_files(str(tmp_path)) == []
    assert store.size_bytes() <= entry * 10
    assert len(store.keys()) == 10
    assert store.stats()["evictions"] == 90


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty", "extend"])
def test_corrupt_entry_is_a_miss_and_removed(tmp_path, damage):
    store = ArtifactStore(str(tmp_path))
    store.put("c0ffee", b"payload bytes" * 10)
    path = tmp_path / "c0" / "c0ffee"
    blob = path.read_bytes()
    damaged = {
        "flip": blob[:-3] + bytes([blob[-3] ^ 0xFF]) + blob[-2:],
        "truncate": blob[: len(blob) // 2],
        "garbage": os.urandom(len(blob)),
        "empty": b"",
        "extend": blob + b"tail",
    }[damage]
    path.write_bytes(damaged)
    assert store.get("c0ffee") is None
    assert not path.exists()
    stats = store.stats()
    assert (stats["corrupt"], stats["misses"], stats["hits"]) == (1, 1, 0)
    assert store.get("c0ffee") is None  # now a plain miss
    assert store.stats()["corrupt"] == 1


def test_entry_format_round_trips():
    blob = encode_entry(b"abc", "fragment", "00ff")
    assert decode_entry(blob) == Entry("00ff", "fragment", b"abc")
    assert decode_entry(blob[:-1]) is None
    assert decode_entry(b"ACCYART1") is None
    signed = encode_entry(b"abc", "fragment", "00ff", secret=b"k")
    assert decode_entry(signed) == decode_entry(signed, secret=b"k") == decode_entry(blob)
    assert decode_entry(signed, secret=b"other") is None
    assert decode_entry(blob, secret=b"k") is None


def test_lru_eviction_order_under_a_byte_bound(tmp_path):
    entry = len(encode_entry(b"x" * 100, "product", key(0)))
    store = ArtifactStore(str(tmp_path), max_bytes=3 * entry)
    for i in (1, 2, 3):
        store.put(key(i), b"x" * 100)
    assert store.get(key(1)) is not None  # 1 is now the most recently used
    store.put(key(4), b"x" * 100)  # over the bound: evict the LRU entry, 2
    assert store.keys() == [key(1), key(3), key(4)]
    store.get(key(3))
    store.put(key(5), b"x" * 100)  # LRU is now 1
    assert store.keys() == [key(3), key(4), key(5)]
    assert store.stats()["evictions"] == 2
    assert store.size_bytes() <= 3 * entry


def test_an_entry_larger_than_the_bound_is_not_stored(tmp_path):
    store = ArtifactStore(str(tmp_path),
                          max_bytes=len(encode_entry(b"x" * 10, "product", key(1))) + 100)
    assert store.put(key(1), b"x" * 10)
    assert store.put(key(2), b"x" * 500) is False
    assert store.keys() == [key(1)]


def test_a_new_store_on_the_same_folder_sees_old_entries_and_their_lru_order(tmp_path):
    entry = len(encode_entry(b"y" * 50, "product", key(0)))
    first = ArtifactStore(str(tmp_path), max_bytes=3 * entry)
    for i in (1, 2, 3):
        first.put(key(i), b"y" * 50)
    first.get(key(1))
    del first
    second = ArtifactStore(str(tmp_path), max_bytes=3 * entry)
    assert second.keys() == [key(1), key(2), key(3)]
    assert second.get(key(2)) == b"y" * 50
    second.put(key(4), b"y" * 50)  # the LRU entry across both lifetimes is 3
    assert second.keys() == [key(1), key(2), key(4)]


def test_two_stores_sharing_a_folder_count_each_others_entries(tmp_path):
    entry = len(encode_entry(b"z" * 50, "product", key(0)))
    a = ArtifactStore(str(tmp_path), max_bytes=4 * entry)
    b = ArtifactStore(str(tmp_path), max_bytes=4 * entry)
    for i in range(3):
        a.put(key(i), b"z" * 50)
    for i in range(3, 6):
        b.put(key(i), b"z" * 50)
    assert a.size_bytes() <= 4 * entry
    assert len(a.keys()) == 4
    assert a.keys() == b.keys() == [key(i) for i in range(2, 6)]


def test_stale_temporary_files_are_swept_and_fresh_ones_kept(tmp_path):
    store = ArtifactStore(str(tmp_path))
    store.put("abab", b"1")
    stale = tmp_path / "ab" / f".tmp-abab-{uuid.uuid4().hex}"
    fresh = tmp_path / "ab" / f".tmp-abcd-{uuid.uuid4().hex}"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"in flight")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    assert store.keys() == ["abab"]
    assert not stale.exists() and fresh.exists()


def test_an_fsspec_url_works_through_the_generic_path():
    url = f"memory://accy-test-{uuid.uuid4().hex}"
    entry = len(encode_entry(b"m" * 10, "product", key(0)))
    store = ArtifactStore(url, max_bytes=2 * entry)
    assert not store._local
    store.put(key(1), b"m" * 10)
    store.put(key(2), b"m" * 10)
    store.get(key(1))
    store.put(key(3), b"m" * 10)
    assert store.keys() == [key(1), key(3)]
    assert store.get(key(1)) == b"m" * 10
    store.fs.pipe_file(f"{store.root}/{key(3)[:2]}/{key(3)}", b"broken")
    assert store.get(key(3)) is None and key(3) not in store.keys()
    assert not [p for p in store.fs.find(store.root) if ".tmp-" in p]
    store.fs.rm(store.root, recursive=True)


def test_file_url_and_user_path(tmp_path, monkeypatch):
    store = ArtifactStore(f"file://{tmp_path}/s")
    assert store._local
    store.put("beef", b"1")
    assert (tmp_path / "s" / "be" / "beef").exists()
    monkeypatch.setenv("HOME", str(tmp_path))
    home = ArtifactStore("~/store")
    assert home.root == str(tmp_path / "store")


def test_default_store_url_env_then_dask_config_then_home(monkeypatch):
    monkeypatch.setenv("ACCY_STORE", "/from/env")
    with dask.config.set({"accy.store": "/from/config"}):
        assert default_store_url() == "/from/env"
        monkeypatch.delenv("ACCY_STORE")
        assert default_store_url() == "/from/config"
    with dask.config.set({"accy.store": None}):
        assert default_store_url() == "~/.cache/accy/store"


def test_nonpositive_bound_is_refused(tmp_path):
    with pytest.raises(StoreError):
        ArtifactStore(str(tmp_path), max_bytes=0)


# -- several writer processes, killed writers, amortised eviction

HEAD_SIZE = 54  # format 2: magic, flags, pad, key len, kind len, payload len, digest
REPO = os.path.dirname(os.path.dirname(os.path.abspath(accy.__file__)))

WRITER = """
import sys
from accy.store import ArtifactStore
root, first, count, bound = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
store = ArtifactStore(root, max_bytes=bound)
for i in range(first, first + count):
    assert store.put(f"{i:032x}", bytes([i % 251]) * 1000, kind="stage:kernel")
    store.get(f"{i:032x}", kind="stage:kernel")
"""

STUCK_WRITER = """
import sys, time
import accy.store
def half_then_hang(fd, blob):
    accy.store.os.pwrite(fd, blob[: len(blob) // 2], 0)
    print("writing", flush=True)
    time.sleep(600)
accy.store._write_all = half_then_hang
accy.store.ArtifactStore(sys.argv[1], max_bytes=int(sys.argv[2])).put(sys.argv[3], b"w" * 1000)
"""


def python(code: str, *args: object, **kw: object) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=env, **kw)


def disk_bytes(root: str) -> int:
    total = 0
    for f in all_files(root):
        with contextlib.suppress(FileNotFoundError):
            total += os.path.getsize(os.path.join(root, f))
    return total


def test_writer_processes_keep_the_store_within_its_bound(tmp_path):
    root = str(tmp_path)
    entry = len(encode_entry(b"x" * 1000, "stage:kernel", key(0)))
    bound = 20 * entry
    ArtifactStore(root, max_bytes=bound).put(key(9999), b"seed")  # the ledger exists
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], disk_bytes(root))

    sampler = threading.Thread(target=sample)
    sampler.start()
    writers = [python(WRITER, root, w * 1000, 150, bound) for w in range(4)]
    try:
        assert [p.wait(timeout=60) for p in writers] == [0, 0, 0, 0]
    finally:
        done.set()
        sampler.join()
    store = ArtifactStore(root, max_bytes=bound)
    assert temp_files(root) == []
    assert disk_bytes(root) == store.size_bytes() <= bound
    assert len(store.keys()) == 20
    assert peak[0] <= 1.1 * bound, peak[0] / bound


def test_a_live_writers_temporary_counts_and_a_killed_writers_is_swept(tmp_path):
    root = str(tmp_path)
    entry = len(encode_entry(b"w" * 1000, "product", key(0)))
    store = ArtifactStore(root, max_bytes=3 * entry)
    store.put(key(1), b"w" * 1000)
    store.put(key(2), b"w" * 1000)
    stuck = python(STUCK_WRITER, root, 3 * entry, key(3), stdout=subprocess.PIPE, text=True)
    try:
        assert stuck.stdout.readline() == "writing\n"
        assert len(temp_files(root)) == 1
        # reserved at its full size: the store is at its bound while the write is in flight
        assert store.size_bytes() == 3 * entry
    finally:
        stuck.kill()
        stuck.wait()
    assert len(temp_files(root)) == 1  # nothing removed it yet
    assert store.put(key(4), b"w" * 1000)  # the dead writer's bytes are swept, not evicted for
    assert temp_files(root) == []
    assert store.keys() == [key(1), key(2), key(4)]
    assert store.stats()["evictions"] == 0
    assert store.size_bytes() == 3 * entry


def _ledger_total(root: str) -> int:
    import struct as _struct

    with open(os.path.join(root, ".accy-ledger"), "rb") as f:
        magic, total = _struct.unpack(">8sq", f.read(16))
    assert magic == b"ACCYLDG1"
    return total


def test_puts_far_below_the_bound_take_the_ledger_lock_once_a_lease(tmp_path, monkeypatch):
    """Below half the bound a process reserves up to LEASE_BYTES ahead (its lease) and
    puts from it without the cross-process lock; the lease goes back when the store
    object does, and the ledger then holds exactly what is on disk."""
    import accy.store as st

    root = str(tmp_path)
    store = ArtifactStore(root, max_bytes=64 << 20)
    locks = []
    real = st.fcntl.flock
    monkeypatch.setattr(st.fcntl, "flock",
                        lambda fd, op: (locks.append(1) if op == st.fcntl.LOCK_EX else None,
                                        real(fd, op))[1])
    for i in range(200):
        assert store.put(key(i), b"p" * 4000)
    entry = len(encode_entry(b"p" * 4000, "product", key(0)))
    # the first put finds no ledger: it counts the store and reserves exactly (two
    # locks, as every put did before leases); the second takes a lease of 1 MiB, which
    # covers the next 250 or so puts: 200 puts, 3 locks
    assert len(locks) == 3, len(locks)
    assert _ledger_total(root) == 200 * entry + store._lease.bytes > disk_bytes(root)
    del store
    import gc

    gc.collect()
    assert _ledger_total(root) == disk_bytes(root) == 200 * entry
    assert st.LEASE_BYTES == 1 << 20


def test_a_writer_process_gives_its_lease_back_when_it_exits(tmp_path):
    root = str(tmp_path)
    ArtifactStore(root, max_bytes=1 << 30).put(key(9999), b"seed")
    writers = [python(WRITER, root, w * 1000, 50, 1 << 30) for w in range(3)]
    assert [p.wait(timeout=60) for p in writers] == [0, 0, 0]
    assert temp_files(root) == []
    assert _ledger_total(root) == disk_bytes(root)  # no scan: the leases came back


def test_near_the_bound_every_put_reserves_exactly_its_bytes(tmp_path, monkeypatch):
    entry = len(encode_entry(b"n" * 1000, "product", key(0)))
    root = str(tmp_path)
    store = ArtifactStore(root, max_bytes=4 * entry)
    for i in range(12):
        assert store.put(key(i), b"n" * 1000)
        assert store._lease.bytes == 0  # never more than half free: no lease
        assert _ledger_total(root) == disk_bytes(root) <= 4 * entry
    assert len(store.keys()) == 4


def test_puts_at_the_bound_do_not_rescan_the_store(tmp_path, monkeypatch):
    entry = len(encode_entry(b"s" * 100, "product", key(0)))
    store = ArtifactStore(str(tmp_path), max_bytes=200 * entry)
    scans = []
    real_scan = store._scan
    monkeypatch.setattr(store, "_scan", lambda: scans.append(1) or real_scan())
    for i in range(1000):
        assert store.put(key(i), b"s" * 100)
        if i % 3 == 0:
            store.get(key(i - 100 if i >= 100 else i))
    assert store.stats()["evictions"] == 800
    assert len(scans) <= 12, len(scans)  # about one per turnover of the bound, not one per put
    assert len(store.keys()) == 200


# -- content bound to key and kind


def test_an_entry_copied_over_another_keys_path_is_a_miss(tmp_path):
    store = ArtifactStore(str(tmp_path))
    store.put("aaaa", b"payload of aaaa", kind="stage:kernel")
    store.put("bbbb", b"payload of bbbb", kind="stage:kernel")
    shutil.copyfile(tmp_path / "aa" / "aaaa", tmp_path / "bb" / "bbbb")
    assert store.get("bbbb") is None
    assert store.get("bbbb", kind="stage:kernel") is None
    assert store.kind("bbbb") is None
    assert store.get("aaaa", kind="stage:kernel") == b"payload of aaaa"
    stats = store.stats()
    assert (stats["mismatched"], stats["misses"], stats["hits"], stats["corrupt"]) == (2, 2, 1, 0)


def test_a_read_of_another_kind_is_a_miss(tmp_path):
    store = ArtifactStore(str(tmp_path))
    store.put("cccc", b"cubin", kind="compile")
    assert store.get("cccc", kind="stage:target") is None
    assert store.stats()["mismatched"] == 1
    assert store.get("cccc", kind="compile") == b"cubin"
    assert store.get("cccc") == b"cubin"  # no kind asked: any kind
    assert store.kind("cccc") == "compile"


def test_a_format_1_entry_is_a_miss(tmp_path):
    store = ArtifactStore(str(tmp_path))
    old = hashlib.blake2b(b"old", digest_size=32).digest()
    path = tmp_path / "dd" / "dddd"
    path.parent.mkdir()
    path.write_bytes(struct.pack(">8sQ32sH", b"ACCYART1", 3, old, 7) + b"productold")
    assert store.get("dddd") is None
    assert store.stats()["misses"] == 1 and not path.exists()


# -- authenticated entries


def test_with_a_key_only_entries_authenticated_under_it_are_hits(tmp_path):
    root = str(tmp_path)
    signed = ArtifactStore(root, auth_key=b"deployment secret")
    assert signed.authenticated
    signed.put("a1a1", b"trusted", kind="compile")
    assert signed.get("a1a1", kind="compile") == b"trusted"
    ArtifactStore(root, auth_key=b"").put("b2b2", b"forged", kind="compile")  # no HMAC
    ArtifactStore(root, auth_key=b"another secret").put("c3c3", b"forged", kind="compile")
    for k in ("b2b2", "c3c3"):
        assert signed.get(k, kind="compile") is None
    # a forger who swaps the payload, rewrites the digest and keeps the genuine HMAC
    genuine = (tmp_path / "a1" / "a1a1").read_bytes()
    forged = encode_entry(b"evil!!!", "compile", "a1a1", secret=b"guess")
    mac = slice(HEAD_SIZE, HEAD_SIZE + 32)
    (tmp_path / "a1" / "a1a1").write_bytes(forged[:mac.start] + genuine[mac] + forged[mac.stop:])
    assert signed.get("a1a1", kind="compile") is None
    stats = signed.stats()
    assert (stats["unauthenticated"], stats["hits"], stats["misses"]) == (3, 1, 3)
    assert ArtifactStore(root, auth_key=b"").get("b2b2") == b"forged"  # no key: as before


def test_the_key_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCY_STORE_KEY", "from-env")
    store = ArtifactStore(str(tmp_path))
    assert store.authenticated
    store.put("e5e5", b"x", kind="compile")
    assert ArtifactStore(str(tmp_path), auth_key="from-env").get("e5e5") == b"x"
    assert ArtifactStore(str(tmp_path), auth_key="other").get("e5e5") is None
    monkeypatch.delenv("ACCY_STORE_KEY")
    assert not ArtifactStore(str(tmp_path)).authenticated


# -- only a cache tier: failures to write or read are misses, never raised


def test_a_directory_on_an_entrys_path_fails_the_put_not_the_caller(tmp_path, caplog):
    entry = len(encode_entry(b"d" * 100, "product", key(0)))
    store = ArtifactStore(str(tmp_path), max_bytes=2 * entry)
    os.makedirs(tmp_path / "00" / key(1))
    with caplog.at_level(logging.DEBUG, logger="accy.store"):
        assert store.put(key(1), b"d" * 100) is False
        assert store.put(key(1), b"d" * 100) is False
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.DEBUG]
    assert store.get(key(1)) is None
    stats = store.stats()
    assert (stats["put_errors"], stats["read_errors"], stats["puts"]) == (2, 1, 0)
    assert temp_files(str(tmp_path)) == []
    # the failed puts released their reservations: two entries fit without eviction
    assert store.put(key(2), b"d" * 100) and store.put(key(3), b"d" * 100)
    assert store.stats()["evictions"] == 0


def test_a_full_disk_fails_the_put_and_releases_its_space(tmp_path, monkeypatch):
    entry = len(encode_entry(b"f" * 100, "product", key(0)))
    store = ArtifactStore(str(tmp_path), max_bytes=2 * entry)
    assert store.put(key(1), b"f" * 100)

    def full(fd: int, blob: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(accy.store, "_write_all", full)
        assert store.put(key(2), b"f" * 100) is False
    assert temp_files(str(tmp_path)) == []
    assert store.put(key(3), b"f" * 100)
    assert store.stats()["evictions"] == 0  # the failed put's reservation was given back
    assert store.keys() == [key(1), key(3)]
    assert store.stats()["put_errors"] == 1


def test_a_read_only_store_fails_puts_and_still_serves_gets(tmp_path, monkeypatch):
    store = ArtifactStore(str(tmp_path))
    assert store.put(key(1), b"r")

    class ReadOnlyOs:  # os as seen on a read-only filesystem (chmod does not stop root)
        def __getattr__(self, name: str) -> object:
            return getattr(os, name)

        def open(self, path: str, flags: int, *args: object) -> int:
            if flags & (os.O_WRONLY | os.O_RDWR):
                raise OSError(errno.EROFS, "Read-only file system", path)
            return os.open(path, flags, *args)

        def utime(self, *args: object, **kw: object) -> None:
            raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(accy.store, "os", ReadOnlyOs())
    ro = ArtifactStore(str(tmp_path))
    assert ro.put(key(2), b"r") is False
    assert ro.get(key(1)) == b"r"
    assert ro.stats()["put_errors"] == 1 and ro.stats()["hits"] == 1


def test_an_unusable_ledger_fails_puts_not_gets(tmp_path):
    store = ArtifactStore(str(tmp_path))
    store.put(key(1), b"l")
    os.unlink(tmp_path / ".accy-ledger")
    os.mkdir(tmp_path / ".accy-ledger")  # squatted: cannot be opened for writing
    fresh = ArtifactStore(str(tmp_path))
    assert fresh.put(key(2), b"l") is False
    assert fresh.get(key(1)) == b"l"
    assert fresh.stats()["put_errors"] == 1
    with pytest.raises(StoreError, match="cannot list"):
        fresh.keys()


def test_an_unreadable_entry_is_a_counted_miss_and_kept(tmp_path, monkeypatch):
    store = ArtifactStore(str(tmp_path))
    store.put(key(1), b"p")

    def denied(path: str, *args: object, **kw: object) -> bytes:
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(store, "_read_bytes", denied)
    assert store.get(key(1)) is None
    assert store.stats()["read_errors"] == 1 and store.stats()["misses"] == 1
    monkeypatch.undo()
    assert store.get(key(1)) == b"p"


def test_an_empty_key_turns_authentication_off_even_with_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCY_STORE_KEY", "from-env")
    assert not ArtifactStore(str(tmp_path), auth_key=b"").authenticated


def test_a_child_forked_while_a_thread_holds_the_ledger_lock_does_not_hang(tmp_path):
    entry = len(encode_entry(b"k" * 100, "product", key(0)))
    store = ArtifactStore(str(tmp_path), max_bytes=4 * entry)
    store.put(key(1), b"k" * 100)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # a put of another thread, caught inside its locked section
        with store._ledger.locked():
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's outcome is its exit status
        signal.alarm(10)  # a deadlocked child dies of SIGALRM
        ok = all(store.put(key(i), b"k" * 100) for i in range(100, 110))
        os._exit(0 if ok else 1)
    release.set()
    holder.join()
    assert os.waitpid(pid, 0)[1] == 0
    assert store.size_bytes() <= 4 * entry and len(store.keys()) == 4


def test_a_put_makes_again_a_folder_removed_since_the_last_put(tmp_path):
    store = ArtifactStore(str(tmp_path))
    assert store.put("ab12cd", b"one", kind="stage")
    folder = os.path.dirname(store._path("ab12cd"))
    shutil.rmtree(folder)  # by hand, or another process's clean-up
    assert store.put("ab12ef", b"two", kind="stage")
    assert store.get("ab12ef", kind="stage") == b"two"


def test_temporary_names_are_distinct_and_new_after_a_fork():
    from accy.store import _TMP, _tmp_name

    names = {_tmp_name() for _ in range(1000)}
    assert len(names) == 1000 and all(_TMP.fullmatch(n) for n in names)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own pid and token, so no name of the parent's
        os.close(r)
        os.write(w, _tmp_name().encode())
        os._exit(0)
    os.close(w)
    child = os.read(r, 200).decode()
    os.waitpid(pid, 0)
    os.close(r)
    assert _TMP.fullmatch(child) and child not in names
    token = lambda n: n.split("-")[-1][:16]  # noqa: E731
    assert token(child) != token(next(iter(names)))
