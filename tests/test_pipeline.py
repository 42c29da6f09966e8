"""The stage table: every driver reads it, and a stage's version follows its code.

The hermetic-version tests edit a module in a temporary copy of the package and
watch the receipts of ``accy compile --cache`` in that copy: an edit anywhere a
stage's code can reach re-runs that stage (and whatever reads its changed
product), and nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from accy import pipeline
from accy.cli import STAGE_CHOICES
from accy.dashboard.records import STAGES as DASHBOARD_STAGES
from accy.preparation.keys import import_closure
from accy.preparation.options import RunOptions, option_groups
from accy.preparation.report import RECEIPT_ORDER

ROOT = Path(__file__).resolve().parent.parent


def test_every_stage_list_is_the_table():
    names = [s.name for s in pipeline.preparation()]
    assert names == ["contract", "tensor", "dispatch", "memory", "kernel", "target"]
    assert list(RECEIPT_ORDER) == [*names, "compile", "load"] == list(pipeline.STAGE_NAMES)
    assert list(DASHBOARD_STAGES) == list(pipeline.STAGE_NAMES)
    assert list(STAGE_CHOICES) == ["semantic", *names]
    assert list(option_groups()) == names  # one options group per preparation stage


def test_each_stage_reads_the_previous_product():
    stages = pipeline.preparation()
    for a, b in zip(stages, stages[1:]):
        assert b.input is a.product, (a.name, b.name)


def test_a_derived_key_never_equals_a_content_key():
    s = pipeline.stage("kernel")
    o = RunOptions()
    assert s.key("ab" * 16, o).hex != s.derived_key("ab" * 16, o).hex


def test_unknown_stage_is_an_option_error():
    from accy.errors import OptionError

    with pytest.raises(OptionError, match="unknown stage 'kernal'"):
        pipeline.stage("kernal")


def test_closures_follow_the_code_each_stage_runs():
    def closure(name: str) -> set[str]:
        s = pipeline.stage(name)
        from accy.preparation.keys import function_imports

        roots = pipeline.DRIVER + s.dialects + s.implementation
        if name in pipeline.PREPARATION_NAMES:
            roots += ("accy.preparation.recipe",) + function_imports("accy.preparation.recipe",
                                                                     name)
        return set(import_closure(tuple(sorted(set(roots)))))

    for name in pipeline.STAGE_NAMES:  # every stage reaches the IR core
        assert "accy.choir.builtin" in closure(name), name
    for name in ("contract", "tensor", "dispatch", "memory"):
        assert "accy.dialects.kernel" not in closure(name), name
        assert "accy.preparation.passes.kernel" not in closure(name), name
    for name in ("kernel", "target"):
        assert "accy.dialects.kernel" in closure(name), name
    assert "accy.target.cuda" in closure("target")
    assert "accy.target.cuda" not in closure("kernel")
    assert "accy.executable.device" in closure("compile")


def test_parsing_a_cuda_target_imports_no_cupy():
    code = ("import sys; from accy.preparation.options import RunOptions; "
            "o = RunOptions.parse('cuda:sm_90', ['kernel.block_size=128']); "
            "print(o.target.backend.language, 'cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.split() == ["cuda", "False"]


# -- hermetic versions: edit a module in a copy of the package, watch the receipts


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("accy-copy")
    shutil.copytree(ROOT / "accy", root / "accy",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "graphs" / "softmax.mlir", root / "softmax.mlir")
    return root


def _compile(copy: Path, n: int) -> dict[str, bool]:
    report = copy / f"r{n}.json"
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    subprocess.run([sys.executable, "-m", "accy", "compile", "softmax.mlir", "--shape",
                    "arg0=8x64", "--cache", "store", "--report", str(report)],
                   cwd=copy, env=env, check=True, capture_output=True, text=True)
    data = json.loads(report.read_text())
    stages = data["variants"][0]["stages"] if "variants" in data else data["stages"]
    return {r["stage"]: bool(r["reused"]) for r in stages if r["stage"] != "load"}


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


def test_editing_a_module_reruns_exactly_the_stages_that_reach_it(copy: Path):
    first = _compile(copy, 0)
    assert not any(first.values()), first  # a cold store: everything ran
    assert all(_compile(copy, 1).values())  # nothing changed: everything reused

    # the kernel dialect: kernel and target read it; contract…memory do not (the
    # target stage emits the same source, so the binary is reused by its compile key)
    _append(copy / "accy" / "dialects" / "kernel.py", "_EDITED = 1")
    got = _compile(copy, 2)
    assert got == {"contract": True, "tensor": True, "dispatch": True, "memory": True,
                   "kernel": False, "target": False, "compile": True}, got

    # the kernel passes only: kernel re-runs, makes the same product, and the
    # target stage's key is unchanged (early cutoff)
    _append(copy / "accy" / "preparation" / "passes" / "kernel.py", "_EDITED = 1")
    got = _compile(copy, 3)
    assert got == {"contract": True, "tensor": True, "dispatch": True, "memory": True,
                   "kernel": False, "target": True, "compile": True}, got

    # the IR core (func.func / func.return): every stage reaches it, compile too
    _append(copy / "accy" / "choir" / "builtin.py", "_EDITED = 1")
    got = _compile(copy, 4)
    assert not any(got.values()), got


def test_opt_resumes_from_a_dumped_product_and_checks_its_plans(tmp_path: Path):
    """``accy opt --from STAGE`` reads a dump back; a misspelled plan field is a verify
    error naming the field, not a silent default."""
    from accy.api import lower_to

    shapes = {0: (8, 256)}
    opts = RunOptions.parse("cuda:sm_90")
    kernel = lower_to(str(ROOT / "graphs" / "softmax.mlir"), "kernel", opts, shapes)
    dump = tmp_path / "kernel.mlir"
    dump.write_text(kernel.text())
    direct = lower_to(str(ROOT / "graphs" / "softmax.mlir"), "target", opts, shapes)
    resumed = lower_to(str(dump), "target", opts, shapes, start="kernel")
    assert resumed.fingerprint() == direct.fingerprint()

    from accy.errors import AccyError

    dump.write_text(kernel.text().replace("vector_width", "vectr_width"))
    with pytest.raises(AccyError, match="no plan field 'vectr_width'"):
        lower_to(str(dump), "target", opts, shapes, start="kernel")
    memory = lower_to(str(ROOT / "graphs" / "softmax.mlir"), "memory", opts, shapes)
    dump.write_text(memory.text().replace("strides", "strdes"))
    with pytest.raises(AccyError, match="no field 'strdes'"):
        lower_to(str(dump), "kernel", opts, shapes, start="memory")


def test_explain_compares_values_not_their_spelling():
    from accy.preparation.keys import explain, make_key

    new = make_key({"stage": "contract", "version": "1", "input": "ab",
                    "options": {"shapes": {"arg0": (1024, 1024)}}})
    wire = {"stage": "contract", "version": "1", "input": "ab",
            "options": {"shapes": {"arg0": [1024, 1024]}}}  # as it comes back over the wire
    assert explain(new, wire) == "same key"
    wire["options"]["shapes"]["arg0"] = [1024, 512]
    assert explain(new, wire) == "option shapes: {'arg0': [1024, 512]} -> {'arg0': [1024, 1024]}"


def test_the_package_has_no_import_cycles():
    """Every ``import`` of an accy module, deferred ones inside functions included
    (``if TYPE_CHECKING:`` blocks excepted: they never run), forms an acyclic graph."""
    import ast

    from accy.preparation import keys

    graph: dict[str, set[str]] = {}
    for path in (ROOT / "accy").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        tree = ast.parse(path.read_text())
        nodes = [n for top in tree.body
                 if not (isinstance(top, ast.If) and "TYPE_CHECKING" in ast.unparse(top.test))
                 for n in ast.walk(top)]
        graph[name] = {d for d in keys._imported_modules(name, path, nodes)
                       if d != name and not name.startswith(d + ".")}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(v: str, stack: list[str]) -> bool:
        state[v] = 1
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                cycle.extend(stack[stack.index(w):] + [v, w] if w in stack else [v, w])
                return True
            if w not in state and visit(w, stack + [v]):
                return True
        state[v] = 2
        return False

    for v in sorted(graph):
        if v not in state and visit(v, []):
            break
    assert not cycle, " -> ".join(cycle)


def test_a_key_from_a_shared_template_is_the_key_of_its_whole_fields():
    """``keyed`` splices one member into a template's cached canonical JSON: it must be
    ``make_key`` of the same fields, wherever the name sorts and whatever the template
    holds, and a template changed under the same id must not reuse the old text."""
    from accy.distributed.graph import content_key, derived_key
    from accy.preparation.keys import keyed, make_key
    t = {"stage": "kernel", "version": "v", "options": {"block_size": 128, "s": [1, 2],
                                                        "name": 'q"\\ü', "none": None}}
    for name in ("after", "input", "opts", "stage2", "zzz", "a"):
        for value in ("ab" * 16, "", 'x"y'):
            assert keyed(t, name, value) == make_key(dict(t, **{name: value}))
    assert keyed(t, "stage", "tensor") == make_key(dict(t, stage="tensor"))  # replaced
    other = {"stage": "kernel", "version": "w", "options": {}}
    assert keyed(other, "after", "00").hex != keyed(t, "after", "00").hex
    opts = RunOptions.parse("cuda", {"kernel.block_size": 256})
    shapes = {0: (8, 4096)}
    for s in pipeline.preparation():
        assert derived_key(s.name, "cd" * 16, opts, shapes) == s.derived_key("cd" * 16, opts,
                                                                             shapes)
        assert content_key(s.name, "ef" * 16, opts, shapes) == s.key("ef" * 16, opts, shapes)


def test_options_hash_once_and_never_carry_the_hash_to_another_process():
    import pickle

    a = RunOptions.parse("cuda", {"kernel.block_size": 128})
    b = RunOptions.parse("cuda", {"kernel.block_size": 256})
    assert hash(a) == hash(RunOptions.parse("cuda", {"kernel.block_size": 128})) and a != b
    assert "_hash" in a.__dict__
    c = pickle.loads(pickle.dumps(a))
    assert c == a and "_hash" not in c.__dict__ and hash(c) == hash(a)
