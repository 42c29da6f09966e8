"""The accy-cache scheduler plugin: state, compare-and-swap publish, pinning, LRU unpinning."""

from __future__ import annotations

import asyncio
import threading

import pytest
from distributed import Client, Event, LocalCluster
from distributed.utils_test import gen_cluster

import accy.distributed as ad
from accy.distributed.plugin import PLUGIN_NAME, AccyCachePlugin, get_plugin, to_dask_key
from accy.distributed.state import PublishConflict, fetch_state, publish, publish_with_merge

PRELOADED = {"preload": ["accy.distributed"]}
TWO_WORKERS = [("127.0.0.1", 1), ("127.0.0.1", 1)]


def entry(stage: str, hexkey: str, **extra) -> dict:
    return {"stage": stage, "task_key": [f"accy_{stage}", hexkey], "product_fingerprint": "00",
            "plan_fingerprint": None, "elapsed_ns": 1000, "stored": True, **extra}


def task_key(stage: str, hexkey: str) -> tuple[str, str]:
    return (f"accy_{stage}", hexkey)


def inc(x: int) -> int:
    return x + 1


async def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


@gen_cluster(client=True, nthreads=TWO_WORKERS, scheduler_kwargs=PRELOADED)
async def test_preload_installs_the_plugin_once(c, s, a, b):
    plugin = get_plugin(s)
    assert isinstance(plugin, AccyCachePlugin) and s.plugins[PLUGIN_NAME] is plugin
    ad.dask_setup(s)  # a second preload changes nothing
    assert get_plugin(s) is plugin
    assert await fetch_state(c) == {"version": 0, "entries": {}, "variants": {}}
    assert await c.scheduler.accy_state(full=False) == {"version": 0}


@gen_cluster(client=True, nthreads=TWO_WORKERS, scheduler_kwargs=PRELOADED)
async def test_publish_is_compare_and_swap(c, s, a, b):
    reply = await publish(c, 0, {"aa01": entry("contract", "aa01")},
                          {"softmax[target=host]": {"stages": ["aa01"]}}, [])
    assert reply == {"ok": True, "version": 1, "pinned": []}
    stale = await publish(c, 0, {"bb02": entry("contract", "bb02")}, {}, [])
    assert stale == {"ok": False, "version": 1}
    state = await fetch_state(c)
    assert state["version"] == 1 and list(state["entries"]) == ["aa01"]
    assert state["entries"]["aa01"]["version"] == 1
    assert state["entries"]["aa01"]["pinned"] is False
    assert state["variants"] == {"softmax[target=host]": {"stages": ["aa01"]}}
    assert get_plugin(s).stats["conflicts"] == 1


@gen_cluster(client=True, nthreads=TWO_WORKERS, scheduler_kwargs=PRELOADED)
async def test_a_record_without_fields_takes_them_from_the_entries_its_keys_name(c, s, a, b):
    """A batch publishes each stage's key fields once, in its entry; the variant record
    gets them from the entries, those of this publish and those published before."""
    old = {"contract": {"stage": "contract", "input": "s0"}}
    await publish(c, 0, {"aa01": entry("contract", "aa01", fields=old["contract"])}, {}, [])
    tensor = {"stage": "tensor", "input": "f1"}
    await publish(c, 1, {"bb02": entry("tensor", "bb02", fields=tensor)},
                  {"v": {"keys": {"contract": "aa01", "tensor": "bb02", "dispatch": "gone"}},
                   "w": {"keys": {"contract": "aa01"}, "fields": {"contract": {"own": 1}}}}, [])
    state = await fetch_state(c)
    assert state["variants"]["v"]["fields"] == {"contract": old["contract"], "tensor": tensor}
    assert state["variants"]["w"]["fields"] == {"contract": {"own": 1}}  # sent: kept


@gen_cluster(client=True, nthreads=TWO_WORKERS, scheduler_kwargs=PRELOADED)
async def test_two_publishes_from_version_0_one_wins_and_the_loser_merges(c, s, a, b):
    async with Client(s.address, asynchronous=True) as other:
        first, second = await asyncio.gather(
            publish(c, 0, {"aa01": entry("contract", "aa01")}, {"v": {"by": "c"}}, []),
            publish(other, 0, {"bb02": entry("contract", "bb02")}, {"v": {"by": "other"}}, []),
        )
        assert sorted([first["ok"], second["ok"]]) == [False, True]
        assert (await fetch_state(c))["version"] == 1
        loser, mine, variant = ((c, "aa01", "c") if not first["ok"] else
                                (other, "bb02", "other"))
        reply = await publish_with_merge(loser, {mine: entry("contract", mine)},
                                         {"v": {"by": variant}}, [])
        assert reply["ok"] and reply["version"] == 2
    state = await fetch_state(c)
    assert state["version"] == 2
    assert sorted(state["entries"]) == ["aa01", "bb02"]  # nobody's entry was lost
    assert state["variants"] == {"v": {"by": variant}}  # last writer wins per variant


@gen_cluster(client=True, nthreads=TWO_WORKERS, scheduler_kwargs=PRELOADED)
async def test_many_racing_writers_each_advance_the_version_once(c, s, a, b):
    replies = await asyncio.gather(*[
        publish_with_merge(c, {f"{i:04x}": entry("tensor", f"{i:04x}")},
                           {f"variant{i}": {"n": i}}, [], retries=50)
        for i in range(12)
    ])
    assert sorted(r["version"] for r in replies) == list(range(1, 13))
    state = await fetch_state(c)
    assert state["version"] == 12
    assert len(state["entries"]) == 12 and len(state["variants"]) == 12


@gen_cluster(client=True, nthreads=TWO_WORKERS, scheduler_kwargs=PRELOADED)
async def test_merge_callback_sees_the_fresh_state_and_retries_give_up(c, s, a, b):
    await publish(c, 0, {"aa01": entry("contract", "aa01")}, {}, [])
    seen = []

    def merge(state, entries, variants):
        seen.append(state["version"])
        return entries, {**variants, "v": {"known": sorted(state["entries"])}}

    reply = await publish_with_merge(c, {"bb02": entry("contract", "bb02")}, {}, [], merge=merge)
    assert reply["ok"] and seen == [1]
    assert (await fetch_state(c))["variants"]["v"] == {"known": ["aa01"]}

    plugin = get_plugin(s)
    real = plugin.publish

    def always_stale(comm=None, expected_version=-1, **kw):
        plugin.version += 1  # someone else always gets there first
        return real(comm, expected_version=expected_version, **kw)

    s.handlers["accy_publish"] = always_stale
    with pytest.raises(PublishConflict, match="lost 3 races"):
        await publish_with_merge(c, {"cc03": entry("contract", "cc03")}, {}, [], retries=2)
    assert "cc03" not in plugin.entries


@gen_cluster(client=True, nthreads=TWO_WORKERS, scheduler_kwargs=PRELOADED)
async def test_a_published_key_stays_in_memory_after_the_client_releases_it(c, s, a, b):
    pinned_key, loose_key = task_key("contract", "aa01"), task_key("contract", "bb02")
    pinned = c.submit(inc, 1, key=pinned_key)
    loose = c.submit(inc, 2, key=loose_key)
    assert await c.gather([pinned, loose]) == [2, 3]
    assert pinned_key in s.tasks  # the scheduler spells keys as tuples
    reply = await publish(c, 0, {"aa01": entry("contract", "aa01")}, {},
                          [list(pinned_key), ["accy_contract", "not-there"]])
    assert reply["ok"] and reply["pinned"] == [list(pinned_key)]
    del pinned, loose
    await wait_for(lambda: loose_key not in s.tasks)  # nobody wants it: forgotten
    await asyncio.sleep(0.2)
    assert s.tasks[pinned_key].state == "memory"
    assert any(pinned_key in w.data for w in (a, b))
    assert (await fetch_state(c))["entries"]["aa01"]["pinned"] is True
    # Another entry naming the same (already pinned) task key is pinned too.
    await publish(c, 1, {"aa01ff": entry("contract", "aa01")}, {}, [])
    assert (await fetch_state(c))["entries"]["aa01ff"]["pinned"] is True
    # A later graph can depend on it without recomputing.
    again = c.submit(inc, 1, key=pinned_key)
    assert await again == 2
    assert get_plugin(s).pinned_keys == [pinned_key]


@gen_cluster(client=True, nthreads=TWO_WORKERS, scheduler_kwargs=PRELOADED,
             config={"accy.max-pinned": 2})
async def test_pins_past_max_pinned_release_the_least_recently_used(c, s, a, b):
    plugin = get_plugin(s)
    assert plugin.max_pinned == 2
    keys = [task_key("kernel", f"{i:04x}") for i in range(3)]
    futures = c.map(inc, range(3), key=keys)
    await c.gather(futures)
    for i, k in enumerate(keys[:2]):
        r = await publish(c, i, {f"{i:04x}": entry("kernel", f"{i:04x}")}, {}, [k])
        assert r["ok"]
    assert (await c.scheduler.accy_touch(keys=[list(keys[0])])) == {"touched": 1}
    r = await publish(c, 2, {"0002": entry("kernel", "0002")}, {}, [keys[2]])
    assert r["ok"] and r["pinned"] == [list(keys[2])]
    assert plugin.pinned_keys == [keys[0], keys[2]]  # 1 was least recently used
    state = await fetch_state(c)
    assert {k: e["pinned"] for k, e in state["entries"].items()} == \
        {"0000": True, "0001": False, "0002": True}
    assert plugin.stats["unpinned"] == 1
    del futures
    await wait_for(lambda: keys[1] not in s.tasks)  # released: forgotten once the client lets go
    await asyncio.sleep(0.1)
    assert keys[0] in s.tasks and keys[2] in s.tasks
    assert "0001" in (await fetch_state(c))["entries"]  # the entry stays, for the store


@gen_cluster(client=True, nthreads=TWO_WORKERS, scheduler_kwargs=PRELOADED)
async def test_unpin_releases_everything_and_forgotten_keys_are_unpinned(c, s, a, b):
    plugin = get_plugin(s)
    keys = [task_key("memory", "00aa"), task_key("memory", "00bb")]
    futures = c.map(inc, range(2), key=keys)
    await c.gather(futures)
    await publish(c, 0, {"00aa": entry("memory", "00aa"), "00bb": entry("memory", "00bb")}, {},
                  keys)
    assert plugin.pinned_keys == keys
    assert await c.scheduler.accy_unpin(keys=[list(keys[0])]) == {"unpinned": 1}
    assert plugin.pinned_keys == [keys[1]]
    assert plugin.entries["00aa"]["pinned"] is False
    del futures
    await wait_for(lambda: keys[0] not in s.tasks)
    # A key the scheduler forgets (here: a forced cancel) leaves the pinned set too.
    await c.cancel([c.submit(inc, 0, key=keys[1])], force=True)
    await wait_for(lambda: keys[1] not in s.tasks)
    assert plugin.pinned_keys == [] and plugin.entries["00bb"]["pinned"] is False


@gen_cluster(client=True, nthreads=TWO_WORKERS, scheduler_kwargs=PRELOADED)
async def test_publishing_a_key_still_running_pins_it_when_it_finishes(c, s, a, b):
    ev = Event()

    def wait_then(x, ev):
        ev.wait()
        return x

    k = task_key("dispatch", "beef")
    fut = c.submit(wait_then, 5, ev, key=k)
    await wait_for(lambda: k in s.tasks and s.tasks[k].state == "processing")
    r = await publish(c, 0, {"beef": entry("dispatch", "beef")}, {}, [k])
    assert r["pinned"] == [list(k)]
    del fut
    await ev.set()
    await wait_for(lambda: s.tasks.get(k) is not None and s.tasks[k].state == "memory")
    await asyncio.sleep(0.1)
    assert s.tasks[k].state == "memory"


def test_to_dask_key_turns_nested_lists_into_tuples():
    assert to_dask_key(["a", ["b", 1]]) == ("a", ("b", 1))
    assert to_dask_key("plain") == "plain"


def test_ensure_plugin_and_sync_helpers_on_a_local_cluster_without_preload():
    with LocalCluster(processes=False, n_workers=2, threads_per_worker=1,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        assert get_plugin(cluster.scheduler) is None
        assert ad.ensure_plugin(client) == {"version": 0}
        plugin = get_plugin(cluster.scheduler)
        assert plugin is not None
        assert ad.ensure_plugin(client) == {"version": 0}
        assert get_plugin(cluster.scheduler) is plugin  # not registered twice

        errors: list[BaseException] = []

        def writer(n: int) -> None:
            try:
                with Client(cluster) as own:
                    for i in range(10):
                        hexkey = f"{n:02x}{i:02x}"
                        assert publish_with_merge(own, {hexkey: entry("target", hexkey)},
                                                  {f"w{n}": {"last": i}}, [], retries=100)["ok"]
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        state = fetch_state(client)
        assert state["version"] == 20 and len(state["entries"]) == 20
        assert state["variants"] == {"w0": {"last": 9}, "w1": {"last": 9}}
