"""accy tune: grouping, timing devices, the choice, wrong variants, the database, --tuned."""

from __future__ import annotations

import contextlib
import json
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accy import pipeline
from accy.choir.attributes import StringAttr
from accy.sweep import Variant, load_sweep
from accy.target.backend import runs_on
from accy.tune import apply_tuning, tuned_options
from accy.tune import timing as tune_timing
from accy.tune.database import TuningDatabase, concrete_shapes, index_key
from accy.tune.timing import result_error
from accy.tune.tuner import choose_timers, group_variants, tune

GRAPHS = Path(__file__).resolve().parents[1] / "graphs"
SOFTMAX = str(GRAPHS / "softmax.mlir")
RMSNORM = str(GRAPHS / "rmsnorm.mlir")


def sweep(tmp_path: Path, rows: int = 8, cols: int = 256) -> str:
    path = tmp_path / "tune.yaml"
    path.write_text(f"programs: [{SOFTMAX}]\n"
                    f"shapes: [{{arg0: {rows}x{cols}}}]\n"
                    "options:\n  dispatch.fuse: [true, false]\n  kernel.vector_width: [2, 4]\n")
    return str(path)


@contextlib.contextmanager
def cluster() -> Iterator[Any]:
    """Two single-thread in-process workers declaring CPU_TIMER (a monkeypatch in the
    test applies inside them)."""
    from distributed import Client

    from accy.distributed.state import unpin
    from accy.tune.command import tune_cluster

    with tune_cluster(2, processes=False) as c, Client(c) as client:
        try:
            yield client
        finally:
            with contextlib.suppress(Exception):
                unpin(client)


def timed(group: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in group["variants"] if v["status"] == "ok"]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One tuning of a small softmax sweep (4 variants, host), and a second run of it."""
    tmp = tmp_path_factory.mktemp("tune")
    store = str(tmp / "store")
    variants = load_sweep(sweep(tmp))
    with cluster() as client:
        first = tune(client, variants, store_url=store, reps=3, check=-1)
        second = tune(client, variants, store_url=store, reps=3, check=-1)
        workers = sorted(client.scheduler_info()["workers"])
    yield {"store": store, "variants": variants, "first": first, "second": second,
           "workers": workers, "sweep": sweep(tmp)}


# ------------------------------------------------------------------ the choice


def test_the_winner_is_the_minimum_of_the_measured_medians(tuned: dict[str, Any]) -> None:
    result = tuned["first"]
    assert not result.failed
    [group] = result.groups
    assert group["status"] == "ok" and not group["reused"]
    rows = timed(group)
    assert len(rows) == len(group["variants"]) == 4  # fuse=true,vector_width=4 is the default
    for v in rows:
        assert len(v["times_s"]) == 3 and v["number"] >= 1 and v["timed_as"] == "clock"
        assert v["min_s"] <= v["median_s"] <= v["max_s"]
        assert v["median_s"] == statistics.median(v["times_s"])
        assert (v["min_s"], v["max_s"]) == (min(v["times_s"]), max(v["times_s"]))
        assert v["check"] == "ok" and v["max_error"] <= 1e-4  # check=-1: every one checked
    best = min(rows, key=lambda v: v["median_s"])
    assert group["winner"] == best["id"]
    assert group["winner_median_s"] == best["median_s"]
    [default] = [v for v in group["variants"] if v["default"]]
    assert group["default"] == default["id"] and not group["default_added"]
    assert group["speedup"] == pytest.approx(default["median_s"] / best["median_s"])
    assert group["options"] == best["options"]
    # one worker and device timed the whole group, and the report says which
    assert group["worker"] in tuned["workers"]
    assert {v["worker"] for v in rows} == {group["worker"]}
    assert group["device_info"]["kind"] == "host" and group["device"]


def test_the_report_follows_its_schema(tuned: dict[str, Any]) -> None:
    data = tuned["first"].report()
    assert set(data) == {"format", "groups", "summary", "batch"}
    assert data["summary"]["groups"] == 1 and data["summary"]["tuned"] == 1
    assert data["summary"]["timed"] == 4 and data["summary"]["wrong"] == 0
    assert len(data["batch"]["variants"]) == 4
    g = data["groups"][0]
    for key in ("id", "program", "target", "shapes", "status", "reused", "worker", "device",
                "measurement", "tuned_at", "winner", "options", "default",
                "winner_median_s", "default_median_s", "speedup", "variants", "reps"):
        assert key in g, key
    assert not any(k.startswith("_") for k in g)
    json.dumps(data)  # plain JSON


def test_a_second_tune_is_served_from_the_database(tuned: dict[str, Any]) -> None:
    second = tuned["second"]
    assert second.batch is None  # nothing compiled, nothing timed
    [g1], [g2] = tuned["first"].groups, second.groups
    assert g2["reused"] and g2["status"] == "ok"
    assert g2["measurement"] == g1["measurement"]
    assert g2["winner"] == g1["winner"]
    assert [v["times_s"] for v in g2["variants"]] == [v["times_s"] for v in g1["variants"]]
    assert second.report()["summary"]["reused"] == 1


def test_retune_measures_again(tuned: dict[str, Any], tmp_path: Path) -> None:
    import shutil

    store = shutil.copytree(tuned["store"], tmp_path / "store")  # the others' winner stays
    with cluster() as client:
        again = tune(client, tuned["variants"], store_url=str(store), reps=3, retune=True)
    [g] = again.groups
    assert not g["reused"] and again.batch is not None
    assert g["winner"] == min(timed(g), key=lambda v: v["median_s"])["id"]


# ------------------------------------------------------------------ --tuned


def test_tuned_compile_uses_the_chosen_options(tuned: dict[str, Any], tmp_path: Path) -> None:
    from accy.cli import main

    [group] = tuned["first"].groups
    report = tmp_path / "compile.json"
    assert main(["compile", SOFTMAX, "--shape", "arg0=8x256", "--cache", tuned["store"],
                 "--tuned", "--report", str(report)]) == 0
    [entry] = json.loads(report.read_text())["variants"]
    assert entry["tuned"]["options"] == group["options"]
    assert entry["tuned"]["variant"] == group["winner"]
    assert entry["tuned"]["this_device"] is True
    # the compiled variant is the winner's: its id carries the winner's non-default options
    from accy.preparation.options import RunOptions

    chosen = RunOptions.parse("host", group["options"]).assignments()
    for name, value in chosen.items():
        assert f"{name}={str(value).lower() if isinstance(value, bool) else value}" \
            in entry["id"]


def test_tuned_run_and_batch_use_the_chosen_options(tuned: dict[str, Any], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from accy.api import run_program
    from accy.preparation.products import SemanticModule
    from accy.reference import run_reference

    [group] = tuned["first"].groups
    sm = SemanticModule.from_file(SOFTMAX)
    choice = tuned_options(sm, "host", {0: (8, 256)}, tuned["store"])
    assert choice is not None and choice.options == group["options"]
    # accy run --tuned reads the default store ($ACCY_STORE)
    monkeypatch.setenv("ACCY_STORE", tuned["store"])
    x = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    seen = []
    [out] = run_program(SOFTMAX, [str(tmp_path / "x.npy")], str(tmp_path / "out"),
                        tuned=True, on_tuned=seen.append)
    assert [c.options for c in seen] == [group["options"]]
    np.testing.assert_allclose(np.load(out), run_reference(sm.module, [x])[0], rtol=1e-5,
                               atol=1e-7)
    # accy batch --tuned: every variant of the sweep collapses onto the winner
    variants, notes = apply_tuning(load_sweep(tuned["sweep"]), tuned["store"])
    assert [v.id for v in variants] == [Variant(SOFTMAX, "host", {0: (8, 256)},
                                                group["options"]).id]
    assert notes[variants[0].id]["options"] == group["options"]
    # a shape that was not tuned is left alone, and says so
    other, notes = apply_tuning([Variant(SOFTMAX, "host", {0: (8, 512)})], tuned["store"])
    assert [v.options for v in other] == [{}] and list(notes.values()) == [None]


def test_tuned_without_a_tuning_is_one_error_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from accy.cli import main

    assert main(["compile", SOFTMAX, "--shape", "arg0=8x256", "--cache", str(tmp_path),
                 "--tuned"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --tuned: no tuning of softmax[target=host,arg0=8x256]")
    assert len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ wrong variants

MARK = "/* corrupted by test_tune */"


def test_a_wrong_variant_is_reported_and_never_chosen(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The target stage of one variant (vector_width=2, unfused) drops the exp of its
    first kernel, and that variant measures fastest: it is found wrong, and the
    winner is the fastest correct variant."""
    from accy.executable import fragment

    run = pipeline.Stage.run

    def corrupting(self, prev, request, key=None):  # type: ignore[no-untyped-def]
        result = run(self, prev, request, key)
        opts = request.options
        # The host kernels of both vector widths are the same, so the target stage (whose
        # key reads its input's fingerprint, not kernel.*) would share one product: the
        # kernel product of the corrupted variant is marked, which re-keys its target.
        if self.name == "kernel" and opts.kernel.vector_width == 2 and not opts.dispatch.fuse:
            result.product.module.attributes["test.corrupt"] = StringAttr("yes")
        if self.name == "target" and "test.corrupt" in prev.module.attributes:
            attrs = result.product.module.attributes
            source = attrs["target.source"].value
            assert "expf(" in source
            attrs["target.source"] = StringAttr(MARK + source.replace("expf(", "(float)(", 1))
        return result

    corrupt_keys: set[str] = set()
    load = fragment.load_fragment

    def loading(compiled, workspace=None):  # type: ignore[no-untyped-def]
        loaded, reused = load(compiled, workspace)
        if compiled.source.startswith(MARK):
            corrupt_keys.add(loaded.key)
        return loaded, reused

    measure = tune_timing._host_repeats

    def measuring(fn, number, reps):  # type: ignore[no-untyped-def]
        times = measure(fn, number, reps)
        if fn.func.__self__.key in corrupt_keys:  # the wrong variant is the fastest by far
            return [t / 1000 for t in times]
        return times

    monkeypatch.setattr(pipeline.Stage, "run", corrupting)
    monkeypatch.setattr(fragment, "load_fragment", loading)
    monkeypatch.setattr(tune_timing, "_host_repeats", measuring)

    store = str(tmp_path / "store")
    variants = load_sweep(sweep(tmp_path, rows=4, cols=512))
    with cluster() as client:
        result = tune(client, variants, store_url=store, reps=3, check=0)
    [group] = result.groups
    assert corrupt_keys, "the corruption never reached a compiled fragment"
    wrong = [v for v in group["variants"] if v["status"] == "wrong"]
    assert [v["id"] for v in wrong] == [
        "softmax[target=host,arg0=4x512,dispatch.fuse=false,kernel.vector_width=2]"]
    assert wrong[0]["check"] == "wrong" and "reference" in wrong[0]["check_message"]
    fastest = min((v for v in group["variants"] if "median_s" in v),
                  key=lambda v: v["median_s"])
    assert fastest["id"] == wrong[0]["id"]  # the check, not the clock, ruled it out
    correct = [v for v in group["variants"] if v["status"] == "ok"]
    assert group["status"] == "ok"
    assert group["winner"] == min(correct, key=lambda v: v["median_s"])["id"]
    assert [v for v in group["variants"] if v["id"] == group["winner"]][0]["check"] == "ok"
    assert result.failed  # a wrong variant fails the command (exit 1)
    from accy.tune.report import problem_lines

    assert any(line.startswith(f"WRONG {wrong[0]['id']}:")
               for line in problem_lines(result.groups))
    # the database holds the correct winner
    from accy.preparation.products import SemanticModule

    choice = tuned_options(SemanticModule.from_file(SOFTMAX), "host", {0: (4, 512)}, store)
    assert choice is not None and choice.variant == group["winner"]


def test_a_groups_arguments_are_prepared_once(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Every variant of a group times on one set of arguments in storage form (made by
    the first variant's ``prepare``), each with fresh result buffers."""
    from accy.executable.fragment import LoadedFragment

    calls = {"prepare": 0, "results": 0}
    prepare, allocate = LoadedFragment.prepare, LoadedFragment.allocate_results

    def counting_prepare(self, inputs):  # type: ignore[no-untyped-def]
        calls["prepare"] += 1
        return prepare(self, inputs)

    def counting_results(self):  # type: ignore[no-untyped-def]
        calls["results"] += 1
        return allocate(self)

    monkeypatch.setattr(LoadedFragment, "prepare", counting_prepare)
    monkeypatch.setattr(LoadedFragment, "allocate_results", counting_results)
    variants = load_sweep(sweep(tmp_path, rows=4, cols=512))
    with cluster() as client:
        result = tune(client, variants, store_url=str(tmp_path / "store"), reps=2, check=0)
    [group] = result.groups
    timed = [v for v in group["variants"] if "median_s" in v]
    assert len(timed) > 1 and calls["prepare"] == 1
    assert calls["results"] == len(timed) + 1  # one per variant, one in that prepare


def test_a_group_is_timed_as_soon_as_its_variants_are_compiled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a kind is timed while compiling (CUDA; here the host, by monkeypatch), a
    group's timing task is submitted when its last variant compiles, before the rest
    of the sweep has; host groups otherwise wait for the whole batch."""
    from accy.tune import tuner

    events: list[tuple[str, str]] = []
    submit = tuner._Run.submit

    def logging_submit(self, pending, outcomes, seed, check):  # type: ignore[no-untyped-def]
        events.extend(("time", g.id) for g, _ in pending)
        return submit(self, pending, outcomes, seed, check)

    monkeypatch.setattr(tuner._Run, "submit", logging_submit)
    variants = [Variant(SOFTMAX, "host", {0: (8, n)}, {"kernel.vector_width": w})
                for n in (128, 256, 512) for w in (2, 4)]
    for pipelined in (True, False):
        events.clear()
        monkeypatch.setattr(tuner, "TIMED_WHILE_COMPILING",
                            frozenset({"host"}) if pipelined else frozenset())
        with cluster() as client:
            result = tune(client, variants, store_url=str(tmp_path / f"s{pipelined}"),
                          reps=2, on_compiled=lambda o: events.append(("compiled", o.id)))
        assert not result.failed and len(result.groups) == 3
        compiled = [i for i, (what, _) in enumerate(events) if what == "compiled"]
        timings = [i for i, (what, _) in enumerate(events) if what == "time"]
        assert len(compiled) == len(variants) and len(timings) == 3
        if pipelined:
            assert timings[0] < compiled[-1]  # one group timed before the batch ended
        else:
            assert timings[0] > compiled[-1]


def test_a_variant_that_fails_to_compile_is_reported_and_not_chosen(tmp_path: Path) -> None:
    """rmsnorm's argument is ?x4096: a 4x512 binding fails its contract stage."""
    bad = Variant(RMSNORM, "host", {0: (4, 512)}, {"kernel.vector_width": 2})
    good = Variant(SOFTMAX, "host", {0: (4, 128)}, {"kernel.vector_width": 2})
    with cluster() as client:
        result = tune(client, [bad, good], store_url=str(tmp_path / "store"), reps=2)
    by_id = {g["id"]: g for g in result.groups}
    rms = by_id["rmsnorm[target=host,arg0=4x512]"]
    assert rms["status"] == "failed" and rms["winner"] is None
    assert all(v["status"] == "failed" and v["failure"] for v in rms["variants"])
    soft = by_id["softmax[target=host,arg0=4x128]"]
    assert soft["status"] == "ok" and soft["default_added"]  # the defaults were added
    assert len(soft["variants"]) == 2 and result.failed


# ------------------------------------------------------------------ the command


def test_the_tune_command_writes_its_report_and_page(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from accy.cli import main

    path = tmp_path / "s.yaml"
    path.write_text(f"programs: [{SOFTMAX}]\nshapes: [{{arg0: 4x128}}]\n"
                    "options: {kernel.vector_width: [2, 4]}\n")
    args = ["tune", str(path), "--workers", "1", "--cache", str(tmp_path / "store"),
            "--report", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"),
            "--reps", "2", "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "softmax[target=host,arg0=4x128] on " in out and "winner " in out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["groups"][0]["status"] == "ok"
    assert "accy tune" in (tmp_path / "r.html").read_text()
    assert main(args) == 0  # again: from the database
    assert "(stored measurement)" in capsys.readouterr().out


# ------------------------------------------------------------------ units


def test_groups_add_the_default_options_when_the_sweep_lacks_them() -> None:
    vs = [Variant(SOFTMAX, "host", {0: (8, 256)}, {"kernel.vector_width": w}) for w in (1, 2)]
    vs.append(Variant(SOFTMAX, "host", {0: (16, 256)}, {"kernel.vector_width": 4}))
    g1, g2 = group_variants(vs)
    assert g1.added_default and g1.default.options == {} and len(g1.variants) == 3
    assert g1.axis_values(g1.default) == {"kernel.vector_width": 4}
    assert not g2.added_default and g2.default is vs[2]


def test_timing_devices_one_per_gpu_and_host_groups_on_cpu_workers() -> None:
    h200 = {"name": "NVIDIA H200", "arch": "sm_90"}
    infos = {"tcp://g1": {"host": "a", "gpu": dict(h200, pci_bus_id="0000:01:00.0")},
             "tcp://g2": {"host": "a", "gpu": dict(h200, pci_bus_id="0000:01:00.0")},
             "tcp://g3": {"host": "a", "gpu": dict(h200, pci_bus_id="0000:02:00.0")},
             "tcp://c1": {"host": "b", "gpu": None}}
    resources = {"tcp://g1": {"GPU": 1, "GPU_TIMER": 1}, "tcp://g2": {"GPU": 1, "GPU_TIMER": 1},
                 "tcp://g3": {"GPU": 1, "GPU_TIMER": 1}, "tcp://c1": {"CPU_TIMER": 1}}
    groups = group_variants([Variant(SOFTMAX, t, {0: (r, 256)})
                             for t in ("cuda:sm_90", "host", "cuda:sm_80") for r in (8, 16)])
    chosen = choose_timers(groups, infos, resources)
    cuda90 = [chosen[g.id][0] for g in groups if g.target == "cuda:sm_90"]
    # g1 and g2 share a GPU: the two groups go to two different GPUs
    assert sorted(cuda90) == ["tcp://g1", "tcp://g3"]
    # what `--target cuda` means on Hopper (sm_90a) times on the sm_90 devices too
    hopper = group_variants([Variant(SOFTMAX, "cuda:sm_90a", {0: (r, 256)}) for r in (8, 16)])
    assert sorted(w for g in hopper for w, _ in [choose_timers(hopper, infos, resources)[g.id]]) \
        == ["tcp://g1", "tcp://g3"]
    assert {chosen[g.id][0] for g in groups if g.target == "host"} == {"tcp://c1"}
    # one GPU, three timing workers: the groups spread over them (the lock orders them)
    one = {f"tcp://t{i}": {"host": "a", "gpu": dict(h200, pci_bus_id="0000:01:00.0")}
           for i in range(3)}
    three = group_variants([Variant(SOFTMAX, "cuda:sm_90a", {0: (r, 256)}) for r in (8, 16, 32)])
    picked = choose_timers(three, one, {a: {"GPU": 1, "GPU_TIMER": 1} for a in one})
    assert sorted(w for w, _ in picked.values()) == ["tcp://t0", "tcp://t1", "tcp://t2"]
    for g in groups:
        if g.target == "cuda:sm_80":
            worker, why = chosen[g.id]
            assert worker is None and "sm_80" in why and "sm_90" in why


def test_result_error_tolerates_rounding_not_wrong_values() -> None:
    want = [np.linspace(-1, 1, 64, dtype=np.float32)]
    assert result_error([want[0] * (1 + 1e-6)], want, ["f32"])[1]
    assert not result_error([want[0] * 1.01], want, ["f32"])[1]
    nan = np.array([np.nan, 1.0], np.float32)
    assert result_error([nan.copy()], [nan], ["f32"])[1]
    assert not result_error([np.array([0.0, 1.0], np.float32)], [nan], ["f32"])[1]
    assert not result_error([np.array([1, 2])], [np.array([1, 3])], ["i64"])[1]


def test_keys_cover_shapes_target_and_version(tmp_path: Path) -> None:
    from accy.preparation.products import SemanticModule

    sm = SemanticModule.from_file(str(GRAPHS / "mlp.mlir"))
    shapes = concrete_shapes(sm, {0: (64, 256)})
    assert shapes[0] == [64, 256] and shapes[1] == [256, 1024]
    a = index_key(sm.fingerprint(), shapes, "host", "v1")
    assert a != index_key(sm.fingerprint(), shapes, "cuda:sm_90", "v1")
    assert a != index_key(sm.fingerprint(), shapes, "host", "v2")
    assert a != index_key(sm.fingerprint(), concrete_shapes(sm, {0: (8, 256)}), "host", "v1")
    db = TuningDatabase(str(tmp_path))
    db.record_winner(a, "dev A", {"options": {"kernel.tile_m": 32}, "recorded_at": 1})
    db.record_winner(a, "dev B", {"options": {"kernel.tile_m": 64}, "recorded_at": 2})
    assert set(db.winners(a)) == {"dev A", "dev B"}


# ------------------------------------------------------------------ GPU

MATMUL = """\
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x1024xf32>, tensor<1024x1024xf32>) -> tensor<?x1024xf32>, sym_name = "main"}> ({
  ^bb0(%a: tensor<?x1024xf32>, %b: tensor<1024x1024xf32>):
    %c = "semantic.matmul"(%a, %b) : (tensor<?x1024xf32>, tensor<1024x1024xf32>) -> tensor<?x1024xf32>
    "func.return"(%c) : (tensor<?x1024xf32>) -> ()
  }) : () -> ()
}) : () -> ()
"""


@pytest.mark.gpu
def test_gpu_tunes_a_matmul_and_a_softmax_over_tiles_and_blocks(tmp_path: Path) -> None:
    from distributed import Client

    from accy.distributed.state import unpin
    from accy.preparation.products import SemanticModule
    from accy.tune.command import tune_cluster

    matmul = tmp_path / "matmul.mlir"
    matmul.write_text(MATMUL)
    path = tmp_path / "gpu.yaml"
    path.write_text(f"programs: [{matmul}]\ntargets: [cuda]\nshapes: [{{arg0: 2048x1024}}]\n"
                    "options:\n  kernel.tile_m: [32, 64, 128]\n  kernel.tile_n: [32, 64]\n"
                    "  kernel.tile_k: [8, 16]\n")
    soft = tmp_path / "softmax.yaml"
    soft.write_text(f"programs: [{SOFTMAX}]\ntargets: [cuda]\nshapes: [{{arg0: 4096x4096}}]\n"
                    "options:\n  kernel.block_size: [128, 256, 512, 1024]\n"
                    "  kernel.vector_width: [2, 4]\n")
    from accy.sweep import load_sweeps

    variants = load_sweeps([str(path), str(soft)])
    store = str(tmp_path / "store")
    with tune_cluster(2) as c, Client(c) as client:
        try:
            result = tune(client, variants, store_url=store, reps=5)
        finally:
            unpin(client)
    assert len(result.groups) == 2
    for g in result.groups:
        assert g["status"] == "ok", g.get("message")
        # the device is named by its own arch (sm_90); the target may be its arch-specific
        # form (sm_90a, what --target cuda means on Hopper)
        gpu = g["device_info"]["gpu"]
        assert gpu and g["device"].endswith(gpu["arch"])
        assert runs_on(g["target"].split(":")[1], gpu["arch"])
        rows = timed(g)
        assert len(rows) == len(g["variants"]), [v.get("failure") for v in g["variants"]]
        assert g["winner"] == min(rows, key=lambda v: v["median_s"])["id"]
        assert [v["check"] for v in rows if v["id"] == g["winner"]] == ["ok"]
        assert all(v["number"] >= 1 and v["min_s"] > 0 for v in rows)
        assert {v["timed_as"] for v in rows} == {"graph"}  # each repeat one graph launch
    target = result.groups[0]["target"]
    choice = tuned_options(SemanticModule.from_file(str(matmul)), target, {0: (2048, 1024)},
                           store)
    assert choice is not None and choice.local
    assert choice.options == result.groups[0]["options"]
