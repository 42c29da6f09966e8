"""Receipts, preparation reports, preparation failures and the batch report file.

A refresh leaves one :class:`Receipt` per stage — ran or reused, how long it
took, its key, pass statistics and (dispatch, memory, kernel) a plan
fingerprint — gathered in a :class:`PreparationReport` in pipeline order
(``contract`` … ``target``, then ``compile`` and ``load``). A stage that
fails leaves a :class:`BackendPreparationFailure`: the pipeline, the failing
pass, the message and the path of its reproducer. The batch report
(``--report R.json``, INTERFACE.md "Reports") is built from these with
:func:`variant_json`, :func:`summary` and :func:`write_report`.

Example
-------
>>> r = PreparationReport()
>>> r.add(Receipt("contract", "ab" * 16, reused=False, elapsed_ns=1200, pass_stats={"dce": {"erased": 1}}))
>>> r.add(Receipt("tensor", "cd" * 16, reused=True, elapsed_ns=40, source="memory"))
>>> r.ran(), r.reused(), r.elapsed_ns
(1, 1, [1200, 40])
>>> sorted(r.to_json()[1])
['elapsed_ns', 'key', 'pass_stats', 'plan_fingerprint', 'reused', 'source', 'stage']
>>> summary([variant_json("softmax[target=host]", "ok", r)])["stage_runs"]
1
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accy.errors import AccyError
from accy.files import write_atomic
from accy.paths import user_dir
from accy.pipeline import STAGE_NAMES
from accy.preparation.stages import StageResult

if TYPE_CHECKING:
    from accy.errors import PassFailedError

RECEIPT_ORDER: tuple[str, ...] = STAGE_NAMES
"""The stages a report lists, in pipeline order (the stage table's)."""

SOURCES = ("memory", "store", "cluster")
"""Where a reused product can come from."""

STATUSES = ("ok", "failed")


@dataclass
class Receipt:
    """What one stage did in one refresh."""

    stage: str
    """``contract`` … ``target``, ``compile`` or ``load``."""
    key: str
    """The stage key (hex): what decided reuse."""
    reused: bool
    """True when a cached product was admitted instead of running the stage."""
    elapsed_ns: int
    """The stage's run time, or for a reused stage the time its admission check took."""
    plan_fingerprint: str | None = None
    """64-bit hex summary of the stage's plans (dispatch, memory, kernel), display only."""
    pass_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per-pass statistics of the run (empty when reused: no pass ran)."""
    source: str | None = None
    """Where a reused product came from: ``memory``, ``store`` or ``cluster``."""
    explain: str | None = None
    """Why a stage re-ran (from :func:`accy.preparation.keys.explain`)."""
    skipped: str | None = None
    """Why a stage could not happen (e.g. ``"no GPU"`` for a load)."""
    pass_ns: dict[str, int] | None = None
    """Per-pass wall time of the run (ns)."""
    warning: str | None = None
    """Something that went wrong without failing the stage (a store write that failed)."""

    def __post_init__(self) -> None:
        if self.stage not in RECEIPT_ORDER:
            raise ValueError(f"unknown stage {self.stage!r} in a receipt")
        if self.source is not None and self.source not in SOURCES:
            raise ValueError(f"unknown receipt source {self.source!r} (expected one of "
                             f"{', '.join(SOURCES)})")
        if self.elapsed_ns < 0:
            raise ValueError("a receipt's elapsed_ns cannot be negative")

    @staticmethod
    def ran(result: StageResult, explain: str | None = None) -> Receipt:
        """The receipt of a stage that ran and produced ``result``."""
        return Receipt(result.stage, result.key.hex, False, int(result.elapsed_ns),
                       result.plan_fingerprint, _copy_stats(result.pass_stats),
                       explain=explain, pass_ns=dict(result.pass_ns))

    @staticmethod
    def reuse(result: StageResult, elapsed_ns: int, source: str = "memory") -> Receipt:
        """The receipt of a stage whose cached ``result`` was admitted in ``elapsed_ns``."""
        return Receipt(result.stage, result.key.hex, True, int(elapsed_ns),
                       result.plan_fingerprint, {}, source=source)

    def to_json(self) -> dict[str, Any]:
        """INTERFACE.md's receipt fields, plus the optional ones that are set."""
        out: dict[str, Any] = {
            "stage": self.stage,
            "key": self.key,
            "reused": self.reused,
            "elapsed_ns": int(self.elapsed_ns),
            "plan_fingerprint": self.plan_fingerprint,
            "pass_stats": _copy_stats(self.pass_stats),
        }
        for name in ("source", "explain", "skipped", "warning"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.pass_ns is not None:
            out["pass_ns"] = dict(self.pass_ns)
        return out

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> Receipt:
        """The inverse of :meth:`to_json`."""
        return Receipt(obj["stage"], obj["key"], bool(obj["reused"]), int(obj["elapsed_ns"]),
                       obj.get("plan_fingerprint"), _copy_stats(obj.get("pass_stats") or {}),
                       obj.get("source"), obj.get("explain"), obj.get("skipped"),
                       dict(obj["pass_ns"]) if obj.get("pass_ns") is not None else None,
                       obj.get("warning"))


def _copy_stats(stats: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    return {name: dict(values) for name, values in stats.items()}


class PreparationReport:
    """The receipts of one refresh, kept in pipeline order.

    Example
    -------
    >>> r = PreparationReport([Receipt("load", "00", False, 5, skipped="no GPU"),
    ...                        Receipt("compile", "01", True, 3, source="store")])
    >>> r.stages, r.receipt("load").skipped
    (['compile', 'load'], 'no GPU')
    """

    def __init__(self, receipts: Iterable[Receipt] = ()) -> None:
        self._receipts: dict[str, Receipt] = {}
        for r in receipts:
            self.add(r)

    def add(self, receipt: Receipt) -> None:
        """Record a stage's receipt; each stage has at most one per refresh."""
        if receipt.stage in self._receipts:
            raise ValueError(f"the report already has a receipt for stage {receipt.stage!r}")
        self._receipts[receipt.stage] = receipt

    @property
    def receipts(self) -> list[Receipt]:
        """Every receipt, in pipeline order."""
        return [self._receipts[s] for s in RECEIPT_ORDER if s in self._receipts]

    @property
    def stages(self) -> list[str]:
        """The stages with a receipt, in pipeline order."""
        return [r.stage for r in self.receipts]

    @property
    def elapsed_ns(self) -> list[int]:
        """Each receipt's elapsed ns, aligned with :attr:`stages`."""
        return [r.elapsed_ns for r in self.receipts]

    @property
    def total_elapsed_ns(self) -> int:
        return sum(self.elapsed_ns)

    def receipt(self, stage: str) -> Receipt | None:
        return self._receipts.get(stage)

    def ran(self) -> int:
        """How many stages ran (reused and skipped ones do not count)."""
        return sum(1 for r in self._receipts.values() if not r.reused and r.skipped is None)

    def reused(self) -> int:
        """How many stages reused a cached product."""
        return sum(1 for r in self._receipts.values() if r.reused)

    def to_json(self) -> list[dict[str, Any]]:
        """The receipts as JSON, in pipeline order (a variant's ``stages``)."""
        return [r.to_json() for r in self.receipts]

    def __iter__(self) -> Iterator[Receipt]:
        return iter(self.receipts)

    def __len__(self) -> int:
        return len(self._receipts)

    def __contains__(self, stage: object) -> bool:
        return stage in self._receipts

    def __repr__(self) -> str:
        marks = " ".join(f"{r.stage}:{'reused' if r.reused else 'ran'}" for r in self.receipts)
        return f"<PreparationReport {marks}>"


@dataclass
class BackendPreparationFailure:
    """A failed stage: its pipeline, the failing pass, the message and the reproducer's path."""

    pipeline: str
    pass_name: str
    message: str
    reproducer_path: str | None
    """Where the reproducer (the IR just before the failing pass) was written; ``accy repro``
    replays it. None when the failure kept no reproducer."""
    stage: str

    @staticmethod
    def from_error(err: PassFailedError, stage: str, directory: str | None = None,
                   key: str | None = None) -> BackendPreparationFailure:
        """Capture ``err`` and write its reproducer into ``directory`` (default:
        ``accy.paths.user_dir("reproducers")``, or ``$ACCY_REPRODUCER_DIR``).

        ``key`` (the failing stage's key) names the file, so failures of
        different variants in one folder do not overwrite each other.
        """
        repro = getattr(err, "reproducer", None)
        if repro is None:
            return BackendPreparationFailure(stage, "", str(err), None, stage)
        directory = directory or user_dir("reproducers")
        tag = (key or f"pid{os.getpid()}")[:16]
        path = repro.write(directory, f"accy-repro-{repro.pipeline}-{repro.pass_name}-{tag}.mlir")
        return BackendPreparationFailure(repro.pipeline, repro.pass_name, repro.message, path,
                                         stage)

    def to_json(self) -> dict[str, Any]:
        """A report's ``failure``: ``{"pipeline", "pass", "message", "reproducer"}``."""
        return {"pipeline": self.pipeline, "pass": self.pass_name, "message": self.message,
                "reproducer": self.reproducer_path}

    @staticmethod
    def from_json(obj: Mapping[str, Any], stage: str | None = None) -> BackendPreparationFailure:
        return BackendPreparationFailure(obj["pipeline"], obj["pass"], obj["message"],
                                         obj.get("reproducer"), stage or obj["pipeline"])

    def __str__(self) -> str:
        where = f" (reproducer: {self.reproducer_path})" if self.reproducer_path else ""
        what = f"pipeline '{self.pipeline}'" + (f", pass '{self.pass_name}'"
                                                if self.pass_name else "")
        return f"{what}: {self.message}{where}"


# -- the batch report (INTERFACE.md "Reports")

def variant_json(id: str, status: str,
                 receipts: PreparationReport | Iterable[Receipt | Mapping[str, Any]],
                 failure: BackendPreparationFailure | Mapping[str, Any] | None = None) \
        -> dict[str, Any]:
    """One entry of a report's ``variants``: ``id``, ``status``, ``stages`` and maybe ``failure``.

    Example
    -------
    >>> v = variant_json("mlp[target=host]", "failed", [],
    ...                  BackendPreparationFailure("kernel", "plan-kernels", "boom", None, "kernel"))
    >>> v["failure"]["pass"], v["stages"]
    ('plan-kernels', [])
    """
    if status not in STATUSES:
        raise ValueError(f"a variant's status is 'ok' or 'failed', not {status!r}")
    if status == "failed" and failure is None:
        raise ValueError("a failed variant needs its failure")
    if isinstance(receipts, PreparationReport):
        stages = receipts.to_json()
    else:
        items = [r if isinstance(r, Receipt) else Receipt.from_json(r) for r in receipts]
        stages = PreparationReport(items).to_json()
    out: dict[str, Any] = {"id": id, "status": status, "stages": stages}
    if failure is not None:
        out["failure"] = failure.to_json() if isinstance(failure, BackendPreparationFailure) \
            else dict(failure)
    return out


def summary(variants: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Count the variants, the ok and failed ones, stage runs and reuses.

    A skipped receipt (a load with no GPU) is neither a run nor a reuse.
    """
    runs = reuses = ok = 0
    for v in variants:
        ok += v["status"] == "ok"
        for r in v["stages"]:
            if r["reused"]:
                reuses += 1
            elif r.get("skipped") is None:
                runs += 1
    return {"variants": len(variants), "ok": ok, "failed": len(variants) - ok,
            "stage_runs": runs, "reuses": reuses}


def write_report(path: str, variants: Sequence[Mapping[str, Any]],
                 summary: Mapping[str, Any] | None = None) -> str:
    """Write ``{"variants": [...], "summary": {...}}`` atomically; return the path.

    The summary is computed from the variants when not given. The file is
    written under a temporary name in the same folder and renamed over
    ``path``, so a reader never sees half a report.
    """
    doc = {"variants": list(variants),
           "summary": dict(summary) if summary is not None else _summary(variants)}
    return write_atomic(path, json.dumps(doc, indent=2) + "\n")


_summary = summary


class BatchReport:
    """The variants of one batch, written as one report file.

    Example
    -------
    >>> b = BatchReport()
    >>> b.add("softmax[target=host]", "ok", PreparationReport())
    >>> b.to_json()["summary"]["ok"], b.failed
    (1, 0)
    """

    def __init__(self) -> None:
        self.variants: list[dict[str, Any]] = []

    def add(self, id: str, status: str,
            receipts: PreparationReport | Iterable[Receipt | Mapping[str, Any]],
            failure: BackendPreparationFailure | Mapping[str, Any] | None = None) -> None:
        self.variants.append(variant_json(id, status, receipts, failure))

    @property
    def failed(self) -> int:
        return sum(1 for v in self.variants if v["status"] == "failed")

    def summary(self) -> dict[str, int]:
        return summary(self.variants)

    def to_json(self) -> dict[str, Any]:
        return {"variants": list(self.variants), "summary": self.summary()}

    def write(self, path: str) -> str:
        return write_report(path, self.variants, self.summary())


def write_report_file(path: str, variants: Sequence[Mapping[str, object]],
                      summary: Mapping[str, object] | None = None) -> str:
    """:func:`~accy.preparation.report.write_report`, an OS error as an :class:`AccyError`."""
    try:
        return write_report(path, variants, summary)  # type: ignore[arg-type]
    except OSError as e:
        raise AccyError(f"cannot write the report to {path}: {e.strerror or e}") from None


__all__ = ["RECEIPT_ORDER", "Receipt", "PreparationReport", "BackendPreparationFailure",
           "BatchReport", "variant_json", "summary", "write_report",
           "write_report_file"]
