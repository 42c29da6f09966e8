"""Every graph through all six stages, for ``host`` and ``cuda:sm_90``.

Every stage's dump must read in upstream ``mlir-opt-19
--allow-unregistered-dialect`` (skipped when it is not installed), and what
it prints must read back in accy's parser to a module with the same
fingerprint (and print identically).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from accy.choir.attributes import TensorType
from accy.choir.parser import parse_module
from accy.choir.printer import print_op
from accy.choir.wire import fingerprint
from accy.pipeline import PREPARATION_NAMES as STAGES
from accy.pipeline import run_stage
from accy.pipeline import stage as table_stage
from accy.preparation.options import RunOptions
from accy.preparation.products import PRODUCTS, Product, SemanticModule
from accy.preparation.stages import PreparationRequest, StageResult

GRAPHS = sorted((Path(__file__).resolve().parents[2] / "graphs").glob("*.mlir"))
TARGETS = ("host", "cuda:sm_90")
MLIR_OPT = shutil.which("mlir-opt-19") or (
    "/usr/bin/mlir-opt-19" if os.path.exists("/usr/bin/mlir-opt-19") else None)
CASES = [(p, t) for p in GRAPHS for t in TARGETS]
IDS = [f"{p.stem}-{t.split(':')[0]}" for p, t in CASES]


@functools.cache
def lowered(path: Path, target: str) -> tuple[StageResult, ...]:
    """The six stage results of ``path`` for ``target``, every ``?`` bound to 8."""
    sm = SemanticModule.from_file(str(path))
    shapes = {}
    for i, t in enumerate(sm.entry().function_type.inputs):
        assert isinstance(t, TensorType)
        shapes[i] = tuple(8 if d is None else d for d in t.shape)
    request = PreparationRequest(source=str(path), options=RunOptions.parse(target),
                                 shapes=shapes)
    results = []
    product: Product = sm
    for stage in STAGES:
        r = run_stage(stage, product, request)
        results.append(r)
        product = r.product
    return tuple(results)


def test_there_are_graphs():
    assert len(GRAPHS) >= 10


@pytest.mark.parametrize("path,target", CASES, ids=IDS)
def test_every_graph_lowers_through_every_stage(path, target):
    results = lowered(path, target)
    assert [r.stage for r in results] == list(STAGES)
    assert len({r.key.hex for r in results}) == len(STAGES)
    for r in results:
        assert isinstance(r.product, PRODUCTS[r.stage])
        r.product.verify()
        if table_stage(r.stage).plans:
            assert re.fullmatch(r"[0-9a-f]{16}", r.plan_fingerprint or "")
        else:
            assert r.plan_fingerprint is None
    dialects = [{op.op_name.split(".")[0] for op in r.product.module.walk()} for r in results]
    assert dialects[0] == {"builtin", "func", "semantic"}
    assert dialects[1] == {"builtin", "func", "prim"}
    assert dialects[2] >= {"dispatch", "prim"} and "semantic" not in dialects[2]
    assert "dispatch" not in dialects[4] and "kernel" in dialects[4]
    target_attrs = results[-1].product.module.attributes
    assert target_attrs["target.target"].value == target
    assert target_attrs["target.source"].value


@pytest.mark.parametrize("path,target", CASES, ids=IDS)
def test_every_dump_reads_back_with_the_same_fingerprint(path, target):
    for r in lowered(path, target):
        for debuginfo in (False, True):
            text = r.product.text(debuginfo)
            again = parse_module(text, f"{r.stage}.mlir")
            assert fingerprint(again) == r.product.fingerprint(), (r.stage, debuginfo)
            assert print_op(again, debuginfo) == text, (r.stage, debuginfo)
        wired = Product.from_wire(r.product.to_wire())
        assert type(wired) is type(r.product)
        assert wired.fingerprint() == r.product.fingerprint()


@pytest.mark.parametrize("path,target", CASES, ids=IDS)
def test_every_dump_reads_in_mlir_opt(path, target):
    if MLIR_OPT is None:
        pytest.skip("mlir-opt-19 is not installed")
    results = lowered(path, target)
    # one mlir-opt run per graph and target: the six dumps (with locations) split by markers
    text = "\n// -----\n".join(r.product.text(debuginfo=True) for r in results)
    out = subprocess.run([MLIR_OPT, "--allow-unregistered-dialect", "-mlir-print-op-generic",
                          "--split-input-file"], input=text, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[:4000]
    chunks = [c for c in out.stdout.split("// -----") if c.strip()]
    assert len(chunks) == len(results)
    for r, chunk in zip(results, chunks):
        back = parse_module(chunk, f"mlir-opt-{r.stage}.mlir")
        assert fingerprint(back) == r.product.fingerprint(), r.stage
        assert print_op(back) == r.product.text(), r.stage


def test_mlir_opt_would_catch_a_bad_dump():
    if MLIR_OPT is None:
        pytest.skip("mlir-opt-19 is not installed")
    text = lowered(GRAPHS[0], "host")[2].product.text()
    broken = text.replace('"dispatch.yield"', '"dispatch.yield"(', 1)
    out = subprocess.run([MLIR_OPT, "--allow-unregistered-dialect", "-mlir-print-op-generic"],
                         input=broken, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "error" in out.stderr
