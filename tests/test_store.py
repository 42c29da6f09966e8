"""ArtifactStore: atomic writes, verified reads, LRU eviction under a byte bound, persistence."""

from __future__ import annotations

import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import dask.config
import pytest

from accy.errors import StoreError
from accy.store import (
    Entry,
    ArtifactStore,
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
