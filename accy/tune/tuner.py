"""The tuner: compile a sweep's variants, time them per group, keep the fastest correct one.

:func:`tune` drives one tuning on a Dask cluster:

1. **Group** the variants by (program, target, shapes) (:func:`group_variants`);
   each group's option space gets the default options added when the sweep
   lacks them, so every group has a baseline.
2. **Pick the timing device** of each group (:func:`choose_timers`): for CUDA a
   GPU whose arch runs the target (and one of its timing workers), for the host a CPU
   worker (one timing per worker, one worker per core); the groups are spread
   over the devices by their variant counts. All of a group's variants are
   timed on that one device, so they are compared on the same silicon.
3. **Reuse** a group's stored measurement (:mod:`accy.tune.database`) when the
   program, shapes, target, device, accy version, option space and repeats
   are unchanged, unless ``retune``.
4. **Compile** the other groups' variants like ``accy batch``
   (:func:`accy.distributed.batch.run_batch`, with stage-level reuse).
5. **Time and check** each group in one task on its device's worker
   (:func:`accy.tune.timing.time_group_task`), restricted to the worker and to
   its ``GPU_TIMER``/``CPU_TIMER`` resource when it declares one, and under the
   device's lock either way: one timing at a time per device. A CUDA group's task
   starts as soon as its variants are compiled (overlapping the rest of step 4);
   host groups wait for every compile.
6. **Record** each group's measurement and winner in the database.

Example
-------
>>> from accy.sweep import Variant
>>> vs = [Variant("graphs/softmax.mlir", "host", {0: (8, 256)}, {"kernel.block_size": b})
...       for b in (64, 128)]
>>> [g.id for g in group_variants(vs)], len(group_variants(vs)[0].variants)
(['softmax[target=host,arg0=8x256]'], 3)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from accy.errors import AccyError
from accy.sweep import Variant
from accy.target.backend import backend_of, runs_on
from accy.tune.database import (
    TuningDatabase,
    accy_version,
    concrete_shapes,
    device_name,
    index_key,
    space_key,
)

TIMER_RESOURCES = {"cuda": "GPU_TIMER", "host": "CPU_TIMER"}
"""The Dask resource a worker declares (``=1``) to time that kind of fragment."""
DEFAULT_REPS = 7
DEFAULT_CHECK = 3
"""Variants besides the winner checked against the reference, chosen at random."""


@dataclass
class Group:
    """The variants of one (program, target, shapes): what one tuning compares."""

    program: str
    target: str
    shapes: dict[int, tuple[int, ...]]
    variants: list[Variant]
    default: Variant
    """The variant with the default options (added when the sweep has none)."""
    added_default: bool = False
    axes: list[str] = field(default_factory=list)
    """The option names the sweep varies (``STAGE.NAME``), in its order."""

    @property
    def id(self) -> str:
        """``softmax[target=host,arg0=64x4096]``."""
        return Variant(self.program, self.target, self.shapes).id

    @property
    def kind(self) -> str:
        return backend_of(self.target).kind

    def space(self) -> list[dict[str, Any]]:
        """Each variant's non-default options: the option space its key covers."""
        return [v.run_options().assignments() for v in self.variants]

    def axis_values(self, v: Variant) -> dict[str, Any]:
        """The value of every axis for ``v`` (the defaults' values included)."""
        ro = v.run_options()
        out = {}
        for name in self.axes:
            stage, _, opt = name.partition(".")
            out[name] = getattr(ro.stage_options(stage), opt)
        return out


def group_variants(variants: Sequence[Variant]) -> list[Group]:
    """The variants grouped by (program, target, shapes), in sweep order; each group
    holds a variant with the default options (the sweep's own, or one added)."""
    groups: dict[tuple[str, str, str], Group] = {}
    for v in variants:
        k = (v.program, v.target, repr(sorted(v.shapes.items())))
        g = groups.get(k)
        if g is None:
            g = groups[k] = Group(v.program, v.target, dict(v.shapes), [], v)
        g.variants.append(v)
        for name in v.options:
            if name not in g.axes:
                g.axes.append(name)
    for g in groups.values():
        default = next((v for v in g.variants if not v.run_options().assignments()), None)
        if default is None:
            default = Variant(g.program, g.target, dict(g.shapes), {})
            g.variants.append(default)
            g.added_default = True
        g.default = default
    return list(groups.values())


# ------------------------------------------------------------------ timing devices


def _uid(kind: str, addr: str, info: dict[str, Any]) -> str:
    if kind == "cuda":
        return f"{info.get('host')}:{(info.get('gpu') or {}).get('pci_bus_id')}"
    return addr


def choose_timers(groups: Sequence[Group], infos: dict[str, dict[str, Any]],
                  resources: dict[str, dict[str, float]]) -> dict[str, tuple[str | None, str]]:
    """Group id → (the worker that times it, or None, and why not).

    CUDA groups go to workers with ``GPU_TIMER`` (else ``GPU``) whose GPU runs the
    target's arch; host groups to workers with ``CPU_TIMER`` (else those without
    ``GPU``, else any). Groups are spread over the devices by their variants, then
    over each device's timing workers: several workers of one GPU time one at a time
    (the device lock of :mod:`accy.tune.timing`) while the others prepare.

    Example
    -------
    >>> g = group_variants([Variant("graphs/softmax.mlir", "host", {0: (8, 256)})])
    >>> choose_timers(g, {"tcp://a": {}}, {"tcp://a": {}})
    {'softmax[target=host,arg0=8x256]': ('tcp://a', '')}
    """
    def having(names: Sequence[str], pool: Sequence[str]) -> list[str]:
        return [a for a in pool if any((resources.get(a) or {}).get(n, 0) > 0 for n in names)]

    addrs = sorted(infos)
    host = having(["CPU_TIMER"], addrs) or \
        [a for a in addrs if not having(["GPU"], [a])] or addrs
    cuda = [a for a in (having(["GPU_TIMER"], addrs) or having(["GPU"], addrs))
            if infos[a].get("gpu")]
    load: dict[str, int] = {}
    chosen: dict[str, tuple[str | None, str]] = {}
    for g in groups:
        pool = host if g.kind == "host" else cuda
        arch = g.target.partition(":")[2]
        if g.kind == "cuda":
            pool = [a for a in pool
                    if runs_on(arch, str((infos[a].get("gpu") or {}).get("arch")))]
            if not pool:
                have = sorted({str((infos[a].get("gpu") or {}).get("arch")) for a in cuda})
                chosen[g.id] = (None, f"no GPU worker of arch {arch} to time on"
                                + (f" (the cluster's GPUs are {', '.join(have)})"
                                   if have else " (the cluster has no GPU worker)"))
                continue
        if not pool:
            chosen[g.id] = (None, "no worker to time on")
            continue
        devices: dict[str, list[str]] = {}
        for a in pool:  # the timing workers of each device
            devices.setdefault(_uid(g.kind, a, infos[a]), []).append(a)
        uid = min(devices, key=lambda u: (load.get(u, 0), u))
        worker = min(devices[uid], key=lambda a: (load.get(a, 0), a))
        for k in (uid, worker):
            load[k] = load.get(k, 0) + len(g.variants)
        chosen[g.id] = (worker, "")
    return chosen


# ------------------------------------------------------------------ the result


@dataclass
class TuneResult:
    """Every group's measurement (report rows), the compile batch, what it cost."""

    groups: list[dict[str, Any]]
    batch: Any = None
    """The :class:`~accy.distributed.batch.BatchResult` of the variants compiled."""
    wall_s: float = 0.0

    @property
    def failed(self) -> bool:
        """A group without a winner, or a variant that failed or was wrong."""
        return any(g["status"] != "ok" or any(v["status"] != "ok" for v in g["variants"])
                   for g in self.groups)

    def report(self) -> dict[str, Any]:
        """The JSON report (README: the tuning report)."""
        from accy.tune.report import build_report

        return build_report(self)


# ------------------------------------------------------------------ the driver


def tune(client: Any, variants: Sequence[Variant], *, store_url: str | None = None,
         reps: int = DEFAULT_REPS, retune: bool = False, check: int = DEFAULT_CHECK,
         seed: int = 0, on_compiled: Callable[[Any], None] | None = None,
         on_group: Callable[[dict[str, Any]], None] | None = None) -> TuneResult:
    """Tune ``variants`` on ``client``'s cluster; record each group's winner.

    Parameters
    ----------
    store_url
        The artifact store: compiled stages and binaries, and the tuning database.
    reps
        Timed repeats per variant (the figure is their median; min and max kept).
    retune
        Measure again even where an unchanged group's measurement is stored.
    check
        Variants besides the winner checked against the reference (random, seeded);
        negative: all of them.
    on_compiled, on_group
        Called with each compiled variant's outcome and each finished group's row.

    Example
    -------
    >>> # with tune_cluster(2) as cluster, Client(cluster) as client:
    >>> #     result = tune(client, load_sweeps(["graphs/sweeps/quickstart.yaml"]))
    >>> #     result.groups[0]["winner"]
    """
    from accy.distributed.batch import run_batch

    if reps < 1:
        raise AccyError(f"--reps must be at least 1, got {reps}")
    t0 = time.perf_counter()
    groups = group_variants(variants)
    run = _Run.start(client, groups, store_url, reps)
    pending = run.plan(groups, retune)
    # compile every variant still to be measured, as accy batch does; a CUDA group's
    # timing task is submitted as soon as its last variant is compiled, so the GPU times
    # the first groups while the cluster still compiles the others (a repeat is one CUDA
    # graph launch: the compiles' load on the host does not reach it). Host groups are
    # timed after every compile, on quiet cores.
    todo = [v for g, _ in pending for v in g.variants]
    outcomes: dict[str, Any] = {}
    futures: dict[Any, tuple[Group, dict[str, Any]]] = {}
    holds: list[Any] = []
    waiting = {g.id: {v.id for v in g.variants} for g, _ in pending}
    groups_of: dict[str, list[tuple[Group, dict[str, Any]]]] = {}
    for g, row in pending:
        for v in g.variants:
            groups_of.setdefault(v.id, []).append((g, row))

    def time_ready(ready: list[tuple[Group, dict[str, Any]]]) -> None:
        submitted, held = run.submit(ready, outcomes, seed, check)
        futures.update(submitted)
        holds.extend(held)

    def compiled(o: Any) -> None:
        outcomes[o.id] = o
        if on_compiled:
            on_compiled(o)
        for g, row in groups_of.get(o.id, []):
            left = waiting.get(g.id) if g.kind in TIMED_WHILE_COMPILING else None
            if left is not None:
                left.discard(o.id)
                if not left:
                    del waiting[g.id]
                    time_ready([(g, row)])

    batch = run_batch(client, todo, store_url=store_url, on_done=compiled) if todo else None
    for o in batch.outcomes if batch else []:
        outcomes.setdefault(o.id, o)
    time_ready([(g, row) for g, row in pending if g.id in waiting])  # none reported yet
    run.collect(futures, on_group)
    holds.clear()  # the compiled fragments may go
    run.record_winners(groups, on_group)
    return TuneResult([run.rows[g.id] for g in groups], batch, time.perf_counter() - t0)


TIMED_WHILE_COMPILING = frozenset({"cuda"})
"""Target kinds whose groups are timed as soon as they are compiled, while the rest of
the sweep compiles: CUDA, timed by graph replay on the GPU. Host groups time on the CPU
cores the compiles use, so they wait for every compile."""


@dataclass
class _Run:
    """One tuning run's state: the cluster's timing devices, the database, the rows."""

    client: Any
    store_url: str | None
    reps: int
    db: TuningDatabase
    version: str
    infos: dict[str, dict[str, Any]]
    resources: dict[str, dict[str, Any]]
    timers: dict[str, tuple[str | None, str]]
    modules: dict[str, Any] = field(default_factory=dict)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    @staticmethod
    def start(client: Any, groups: list[Group], store_url: str | None, reps: int) -> _Run:
        """Ask the workers for their devices and pick each group's timing worker."""
        from accy.tune.timing import worker_device_info

        infos: dict[str, dict[str, Any]] = client.run(worker_device_info)
        workers = client.scheduler_info(n_workers=-1)["workers"]
        resources = {a: dict(w.get("resources") or {}) for a, w in workers.items()}
        return _Run(client, store_url, reps, TuningDatabase(store_url), accy_version(), infos,
                    resources, choose_timers(groups, infos, resources))

    def module(self, program: str) -> Any:
        """The group's program (or the error that kept it from loading), read once."""
        from accy.preparation.products import SemanticModule

        if program not in self.modules:
            try:
                self.modules[program] = SemanticModule.from_file(program)
            except AccyError as e:
                self.modules[program] = e
        return self.modules[program]

    def plan(self, groups: list[Group], retune: bool) -> list[tuple[Group, dict[str, Any]]]:
        """Each group's row; the groups whose stored measurement can be reused are done,
        the others are returned (to compile and time)."""
        pending: list[tuple[Group, dict[str, Any]]] = []
        for g in groups:
            row = _row(g)
            self.rows[g.id] = row
            mod = self.module(g.program)
            if isinstance(mod, AccyError):
                _fail(row, f"the program does not load: {mod}")
                continue
            worker, why = self.timers[g.id]
            if worker is None:
                _fail(row, why)
                continue
            info = self.infos[worker]
            dname = device_name(info, g.kind)
            compiler = (info.get("nvrtc") if g.kind == "cuda" else info.get("cc"))
            shapes = concrete_shapes(mod, g.shapes)
            skey = space_key(mod.fingerprint(), shapes, g.target, dname, compiler, g.space(),
                             self.reps, self.version)
            row.update(worker=worker, device=dname, device_info=info, measurement=skey.hex,
                       reps=self.reps)
            row["_index"] = index_key(mod.fingerprint(), shapes, g.target, self.version)
            row["_space"] = skey
            stored = None if retune else self.db.measurement(skey)
            if stored is not None and stored.get("status") == "ok":
                row.update({k: v for k, v in stored.items()
                            if k not in ("key", "fields", "format") and not k.startswith("_")})
                row["reused"] = True
                continue
            pending.append((g, row))
        return pending

    def submit(self, pending: list[tuple[Group, dict[str, Any]]], outcomes: dict[str, Any],
               seed: int, check: int) -> tuple[dict[Any, tuple[Group, dict[str, Any]]],
                                               list[Any]]:
        """One timing task per group with a compiled variant, on its timing worker;
        (the futures, the compiled fragments they hold)."""
        futures: dict[Any, tuple[Group, dict[str, Any]]] = {}
        holds: list[Any] = []
        for g, row in pending:
            ok = self._compiled(g, row, outcomes)
            if not ok:
                _fail(row, "no variant compiled")
                continue
            items, held = self._fragments(ok)
            holds.extend(held)
            spec = {"kind": g.kind, "shapes": {str(i): list(s) for i, s in g.shapes.items()},
                    "seed": seed, "reps": self.reps, "check": check,
                    "variants": [v.id for v, _ in ok]}
            futures[self._submit_group(g, row, spec, items)] = (g, row)
        return futures, holds

    @staticmethod
    def _compiled(g: Group, row: dict[str, Any], outcomes: dict[str, Any]) -> list[Any]:
        """The group's variants that compiled (the others' rows say why not)."""
        ok = []
        for v in g.variants:
            o = outcomes.get(v.id)
            vrow = _variant_row(row, v.id)
            if o is None or o.status != "ok" or not o.compile_task:
                vrow.update(status="failed", failure=(o.failure if o else None)
                            or {"stage": "compile", "message": "not compiled"})
                continue
            ok.append((v, o))
        return ok

    def _fragments(self, ok: list[Any]) -> tuple[list[Any], list[Any]]:
        """What the timing task reads per variant: the held compiled fragment, or (pins
        released) where the store keeps it; and the futures that hold them."""
        from distributed import Future

        held: list[Any] = [Future(tuple(o.compile_task or ()), client=self.client)
                           for _, o in ok]
        who = self.client.who_has(held)
        items: list[Any] = []
        for f, (_, o) in zip(held, ok):
            if who.get(f.key):
                items.append({"held": f, "pick": o.compile_pick})
            else:
                ckey = next((r.key for r in o.receipts if r.stage == "compile"), "")
                items.append({"store": self.store_url, "key": ckey})
        return items, held

    def _submit_group(self, g: Group, row: dict[str, Any], spec: dict[str, Any],
                      items: list[Any]) -> Any:
        from accy.tune.timing import time_group_task

        worker = row["worker"]
        kwargs: dict[str, Any] = {"workers": [worker], "allow_other_workers": False,
                                  "pure": False,
                                  "key": ("accy_tune", f"{row['measurement']}-"
                                                       f"{uuid.uuid4().hex[:8]}")}
        res = TIMER_RESOURCES[g.kind]
        if (self.resources.get(worker) or {}).get(res, 0) > 0:
            kwargs["resources"] = {res: 1}
        mod = self.modules[g.program]
        assert not isinstance(mod, AccyError)
        return self.client.submit(time_group_task, spec, mod.to_wire(), *items, **kwargs)

    def collect(self, futures: dict[Any, tuple[Group, dict[str, Any]]],
                on_group: Callable[[dict[str, Any]], None] | None) -> None:
        """Each group's timings as they finish: merged into its row, stored when ok."""
        from distributed import as_completed

        for fut in as_completed(list(futures)):
            g, row = futures[fut]
            try:
                timed = fut.result()
            except Exception as e:  # noqa: BLE001 - the group's task failed as a whole
                _fail(row, f"timing failed: {type(e).__name__}: {e}")
            else:
                _merge(g, row, timed)
                if row["status"] == "ok":
                    self.db.put_measurement(row["_space"], _stored(row))
            if on_group:
                on_group(row)

    def record_winners(self, groups: list[Group],
                       on_group: Callable[[dict[str, Any]], None] | None) -> None:
        """The database's winner of every group that has one (for ``--tuned``)."""
        for g in groups:
            row = self.rows[g.id]
            if row["status"] == "ok" and row.get("_index") is not None:
                self.db.record_winner(row["_index"], row["device"], {
                    "options": row["options"], "variant": row["winner"],
                    "median_s": row["winner_median_s"], "speedup": row["speedup"],
                    "tuned_at": row["tuned_at"], "measurement": row["measurement"]})
            row.pop("_index", None)
            row.pop("_space", None)
            if row.get("reused") and on_group:
                on_group(row)


def _row(g: Group) -> dict[str, Any]:
    return {"id": g.id, "program": g.default.name, "path": g.program, "target": g.target,
            "shapes": {f"arg{i}": "x".join(map(str, s)) or "scalar"
                       for i, s in sorted(g.shapes.items())},
            "axes": list(g.axes), "status": "pending", "reused": False,
            "worker": None, "device": None, "measurement": None, "tuned_at": None,
            "winner": None, "options": None, "default": g.default.id,
            "default_added": g.added_default, "winner_median_s": None,
            "default_median_s": None, "speedup": None,
            "variants": [{"id": v.id, "options": g.axis_values(v),
                          "default": v.id == g.default.id, "status": "pending",
                          "check": "unchecked"} for v in g.variants]}


def _variant_row(row: dict[str, Any], vid: str) -> dict[str, Any]:
    return next(v for v in row["variants"] if v["id"] == vid)


def _fail(row: dict[str, Any], message: str) -> None:
    row.update(status="failed", message=message)
    for v in row["variants"]:
        if v["status"] == "pending":
            v["status"] = "failed"
            v.setdefault("failure", {"stage": "time", "message": message})


def _merge(g: Group, row: dict[str, Any], timed: dict[str, Any]) -> None:
    """The group task's answer into the group's row: times, checks, winner, speedup."""
    row["worker"] = timed["worker"]
    row["device_info"] = timed["device"]
    row["tuned_at"] = time.time()
    for t in timed["variants"]:
        vrow = _variant_row(row, t["id"])
        vrow.update({k: v for k, v in t.items() if k != "id"})
        vrow["worker"] = timed["worker"]
        if t["status"] == "ok" and t.get("check") == "wrong":
            vrow["status"] = "wrong"
    winner = timed.get("winner")
    if winner is None:
        _fail(row, "no variant was correct (every timed one differs from the reference)"
              if any(v["status"] == "wrong" for v in row["variants"])
              else "no variant could be timed")
        return
    w = _variant_row(row, winner)
    d = _variant_row(row, g.default.id)
    row.update(status="ok", winner=winner, options=dict(w["options"]),
               winner_median_s=w["median_s"])
    if d["status"] == "ok":
        row["default_median_s"] = d["median_s"]
        row["speedup"] = d["median_s"] / w["median_s"] if w["median_s"] > 0 else None


def _stored(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith("_") and k != "reused"}
