"""The tuning database: measured tables and winners in the artifact store (kind ``tuning``).

Two records, both JSON:

- **the measurement** of one group, under :func:`space_key` = H(program
  fingerprint, every argument's shape, target, the timing device — GPU name
  and arch, or the CPU — and its compiler, the accy version, the option space,
  the repeats). It holds every variant's times, the winner and the default.
  ``accy tune`` on an unchanged group reads it back instead of measuring again
  (unless ``--retune``).
- **the winner index** of a (program, shapes, target, accy version), under
  :func:`index_key`: per device, the winning options and where they were
  measured. ``--tuned`` (``accy compile/run/batch``, :func:`tuned_options`)
  reads it: the winner measured on this machine's device when there is one,
  else the most recently tuned device's (and the note says which).

The accy version (:func:`accy_version`) hashes every stage's version (the
source of its code, :attr:`accy.pipeline.Stage.version`) and the timing code:
any change to the compiler makes earlier tunings miss, never apply stale.

Example
-------
>>> import tempfile
>>> db = TuningDatabase(tempfile.mkdtemp())
>>> key = index_key("fp", [[8, 4096]], "host")
>>> db.record_winner(key, "x86_64 CPU", {"options": {"kernel.block_size": 128}})
>>> db.winners(key)["x86_64 CPU"]["options"]
{'kernel.block_size': 128}
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accy.preparation.keys import StageKey, code_version, make_key
from accy.target.backend import backend_of

KIND = "tuning"
"""The artifact store kind of both records."""
FORMAT = 1
"""Bumped when a record's layout changes (older records are then misses)."""


def accy_version() -> str:
    """A hash of every stage's version (contract … load) and of the timing code.

    Example
    -------
    >>> len(accy_version())
    32
    """
    from accy.pipeline import STAGE_NAMES, stage

    fields: dict[str, Any] = {name: stage(name).version for name in STAGE_NAMES}
    fields["tune"] = code_version(("accy.tune.timing",))
    return make_key(fields).hex


def concrete_shapes(module: Any, shapes: Mapping[int, Sequence[int]]) -> list[list[int]]:
    """Every argument's full shape: bound by ``shapes`` where given, else its static type.

    Example
    -------
    >>> from accy.preparation.products import SemanticModule
    >>> sm = SemanticModule.from_file("graphs/mlp.mlir")
    >>> concrete_shapes(sm, {0: (64, 256)})[:2]
    [[64, 256], [256, 1024]]
    """
    from accy.choir.attributes import TensorType

    out: list[list[int]] = []
    for i, t in enumerate(module.entry().function_type.inputs):
        if i in shapes:
            out.append([int(d) for d in shapes[i]])
        elif isinstance(t, TensorType) and t.is_static:
            out.append([int(d or 0) for d in t.shape])
        else:
            out.append([-1 if d is None else int(d) for d in getattr(t, "shape", ())])
    return out


def device_name(device: Mapping[str, Any], kind: str) -> str:
    """``"NVIDIA H200 sm_90"`` for CUDA (GPU name and arch), ``"x86_64 <CPU model>"``
    for the host: what a tuning is keyed by and matched against.

    Example
    -------
    >>> device_name({"gpu": {"name": "NVIDIA H200", "arch": "sm_90"}}, "cuda")
    'NVIDIA H200 sm_90'
    >>> device_name({"machine": "x86_64", "cpu": "AMD EPYC 9654"}, "host")
    'x86_64 AMD EPYC 9654'
    """
    if kind == "cuda":
        gpu = device.get("gpu") or {}
        return f"{gpu.get('name', 'unknown GPU')} {gpu.get('arch', '')}".strip()
    return f"{device.get('machine', '')} {device.get('cpu', 'unknown CPU')}".strip()


def local_device_names(kind: str) -> list[str]:
    """This machine's device name for a target kind (none for CUDA without a GPU)."""
    from accy.host import cpu_model

    if kind == "cuda":
        from accy.executable.device import gpu_identity

        gpu = gpu_identity()
        return [device_name({"gpu": gpu}, "cuda")] if gpu else []
    import platform

    return [device_name({"machine": platform.machine(), "cpu": cpu_model()}, "host")]


def index_key(fingerprint: str, shapes: list[list[int]], target: str,
              version: str | None = None) -> StageKey:
    """Where the winners of a (program, shapes, target) for this accy version live."""
    return make_key({"record": "accy-tuning-index", "format": FORMAT, "program": fingerprint,
                     "shapes": shapes, "target": target,
                     "accy": version if version is not None else accy_version()})


def space_key(fingerprint: str, shapes: list[list[int]], target: str, device: str,
              compiler: str | None, space: Sequence[Mapping[str, Any]], reps: int,
              version: str | None = None) -> StageKey:
    """Where one group's measurement lives: the index's fields, the device and its
    compiler, the option space (order-free) and the repeats."""
    canon = sorted(json.dumps(dict(o), sort_keys=True, default=str) for o in space)
    return make_key({"record": "accy-tuning", "format": FORMAT, "program": fingerprint,
                     "shapes": shapes, "target": target, "device": device,
                     "compiler": compiler, "space": canon, "reps": int(reps),
                     "accy": version if version is not None else accy_version()})


class TuningDatabase:
    """The two tuning records over an :class:`~accy.store.ArtifactStore` (atomic puts)."""

    def __init__(self, url: str | None = None) -> None:
        from accy.store import ArtifactStore, default_max_bytes

        self.store = ArtifactStore(url, default_max_bytes())

    def _get(self, key: StageKey) -> dict[str, Any] | None:
        data = self.store.get(key.hex, kind=KIND)
        if data is None:
            return None
        try:
            record = json.loads(data)
        except ValueError:
            return None
        return record if isinstance(record, dict) and record.get("format") == FORMAT else None

    def _put(self, key: StageKey, record: dict[str, Any]) -> None:
        record = dict(record, format=FORMAT)
        self.store.put(key.hex, json.dumps(record, sort_keys=True, default=str).encode(),
                       kind=KIND)

    def measurement(self, key: StageKey) -> dict[str, Any] | None:
        """The stored measurement of a group, or None."""
        return self._get(key)

    def put_measurement(self, key: StageKey, record: dict[str, Any]) -> None:
        """Store a group's measurement (its key's fields are kept with it)."""
        self._put(key, dict(record, key=key.hex, fields=key.fields))

    def winners(self, key: StageKey) -> dict[str, dict[str, Any]]:
        """Device name → its winner entry, for one index key."""
        record = self._get(key) or {}
        devices = record.get("devices")
        return dict(devices) if isinstance(devices, dict) else {}

    def record_winner(self, key: StageKey, device: str, entry: Mapping[str, Any]) -> None:
        """Make ``entry`` the winner on ``device`` (the other devices' stay)."""
        devices = self.winners(key)
        devices[device] = dict(entry, device=device,
                               recorded_at=entry.get("recorded_at", time.time()))
        self._put(key, {"devices": devices, "fields": key.fields})


@dataclass(frozen=True)
class TunedChoice:
    """The options a tuning chose for one (program, shapes, target), and where."""

    options: dict[str, Any]
    """``STAGE.NAME`` → value, for every axis of the tuned option space."""
    variant: str
    """The winning variant's id."""
    device: str
    """The device it was measured on (``NVIDIA H200 sm_90``)."""
    local: bool
    """Whether that is this machine's device."""
    median_s: float | None
    speedup: float | None
    """Over the default options, on that device."""
    tuned_at: float | None
    measurement: str
    """The key of the measurement record."""

    def to_json(self) -> dict[str, Any]:
        """The ``tuned`` entry a receipt or report carries."""
        return {"options": dict(self.options), "variant": self.variant, "device": self.device,
                "this_device": self.local, "median_s": self.median_s,
                "speedup": self.speedup, "tuned_at": self.tuned_at,
                "measurement": self.measurement, "note": self.describe()}

    def describe(self) -> str:
        """One line: ``options from tuning: kernel.block_size=128 (NVIDIA H200 sm_90, 1.31x)``."""
        opts = ", ".join(f"{k}={_text(v)}" for k, v in self.options.items()) or "the defaults"
        where = self.device + ("" if self.local else ", not this machine's device")
        gain = f", {self.speedup:.2f}x over the defaults" if self.speedup else ""
        return f"options from tuning: {opts} ({where}{gain})"


def _text(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def lookup(db: TuningDatabase, fingerprint: str, shapes: list[list[int]], target: str,
           prefer: Sequence[str] = ()) -> TunedChoice | None:
    """The winner for a (program, shapes, target): on a ``prefer`` device if one was
    tuned, else the most recently tuned device's; None when nothing was tuned for
    this accy version."""
    winners = db.winners(index_key(fingerprint, shapes, target))
    if not winners:
        return None
    name = next((d for d in prefer if d in winners), None)
    if name is None:
        name = max(winners, key=lambda d: float(winners[d].get("recorded_at") or 0))
    w = winners[name]
    return TunedChoice(dict(w.get("options") or {}), str(w.get("variant", "")), name,
                       name in prefer, w.get("median_s"), w.get("speedup"),
                       w.get("tuned_at"), str(w.get("measurement", "")))


def tuned_options(module: Any, target: str, shapes: Mapping[int, Sequence[int]],
                  store_url: str | None = None, prefer: Sequence[str] | None = None) \
        -> TunedChoice | None:
    """The tuned choice for ``module`` (a :class:`SemanticModule`) at ``shapes`` on
    ``target``, from the tuning database in ``store_url`` (default: the default store).

    ``prefer``: the device names to match first (default: this machine's device for
    the target's kind).

    Example
    -------
    >>> from accy.preparation.products import SemanticModule
    >>> import tempfile
    >>> sm = SemanticModule.from_file("graphs/softmax.mlir")
    >>> tuned_options(sm, "host", {0: (8, 256)}, tempfile.mkdtemp()) is None
    True
    """
    from accy.preparation.options import Target

    tgt = Target.parse(target)
    if prefer is None:
        prefer = local_device_names(tgt.kind)
    return lookup(TuningDatabase(store_url), module.fingerprint(), concrete_shapes(module, shapes),
                  str(tgt), prefer)


def cluster_device_names(client: Any) -> list[str]:
    """The device names of a cluster's workers (their GPUs and their CPUs): what
    ``accy batch --tuned`` prefers when a program was tuned on several devices."""
    from accy.tune.timing import worker_device_info

    infos = client.run(worker_device_info)
    names = {device_name(i, "cuda") for i in infos.values() if i.get("gpu")}
    return sorted(names) + sorted({device_name(i, "host") for i in infos.values()})


def apply_tuning(variants: Sequence[Any], store_url: str | None,
                 prefer: Sequence[str] | None = None) -> tuple[list[Any], dict[str, Any]]:
    """The variants with their tuned options (``accy batch --tuned``), and per new
    variant id its ``tuned`` note (None where nothing was tuned).

    A tuned variant takes the winner's value on every axis the tuning varied (the
    sweep's values of those axes are a search space, not a choice); its other
    options stay. Variants that become the same are kept once. A program that does
    not load is left as it is (the batch reports it).

    Example
    -------
    >>> import tempfile
    >>> from accy.sweep import Variant
    >>> vs, notes = apply_tuning([Variant("graphs/softmax.mlir", "host", {0: (8, 256)})],
    ...                          tempfile.mkdtemp())
    >>> [v.id for v in vs], list(notes.values())
    (['softmax[target=host,arg0=8x256]'], [None])
    """
    from accy.errors import AccyError
    from accy.preparation.products import SemanticModule
    from accy.sweep import Variant

    db = TuningDatabase(store_url)
    modules: dict[str, Any] = {}
    local: dict[str, list[str]] = {}
    out: list[Any] = []
    notes: dict[str, Any] = {}
    for v in variants:
        if v.program not in modules:
            try:
                modules[v.program] = SemanticModule.from_file(v.program)
            except AccyError:
                modules[v.program] = None
        mod = modules[v.program]
        kind = backend_of(v.target).kind
        if prefer is None and kind not in local:
            local[kind] = local_device_names(kind)
        choice = None if mod is None else lookup(
            db, mod.fingerprint(), concrete_shapes(mod, v.shapes), v.target,
            prefer if prefer is not None else local[kind])
        if choice is not None:
            v = Variant(v.program, v.target, dict(v.shapes), {**v.options, **choice.options})
        if v.id in notes:
            continue
        out.append(v)
        notes[v.id] = choice.to_json() if choice is not None else None
    return out, notes
