"""Sweep files: expansion, stable ids, deduplication, and an error for each malformation."""

from __future__ import annotations

import textwrap

import pytest

from accy.errors import SweepError
from accy.preparation.options import RunOptions
from accy.sweep import Variant, load_sweep, load_sweeps

INTERFACE_EXAMPLE = """\
# graphs/sweeps/softmax.yaml — paths are relative to this file
programs: [../softmax.mlir]
targets: [host, cuda:sm_90]   # optional, default [host]
shapes:                       # optional; one entry per variant value
  - {arg0: 1024x1024}
  - {arg0: 8192x4096}
options:                      # optional; each list is one axis
  kernel.block_size: [128, 256]
"""


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "graphs" / "sweeps").mkdir(parents=True)
    for name in ("softmax", "layernorm"):
        (tmp_path / "graphs" / f"{name}.mlir").write_text("// program\n")
    return tmp_path


def write(tree, text: str, name: str = "s.yaml") -> str:
    path = tree / "graphs" / "sweeps" / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_the_interface_example_expands_to_eight_variants_in_nesting_order(tree):
    variants = load_sweep(write(tree, INTERFACE_EXAMPLE, "softmax.yaml"))
    assert [v.id for v in variants] == [
        "softmax[target=host,arg0=1024x1024,kernel.block_size=128]",
        "softmax[target=host,arg0=1024x1024,kernel.block_size=256]",
        "softmax[target=host,arg0=8192x4096,kernel.block_size=128]",
        "softmax[target=host,arg0=8192x4096,kernel.block_size=256]",
        "softmax[target=cuda:sm_90,arg0=1024x1024,kernel.block_size=128]",
        "softmax[target=cuda:sm_90,arg0=1024x1024,kernel.block_size=256]",
        "softmax[target=cuda:sm_90,arg0=8192x4096,kernel.block_size=128]",
        "softmax[target=cuda:sm_90,arg0=8192x4096,kernel.block_size=256]",
    ]
    v = variants[0]
    assert v.program == str(tree / "graphs" / "softmax.mlir")
    assert (v.target, v.shapes, v.options) == ("host", {0: (1024, 1024)},
                                               {"kernel.block_size": 128})
    assert v.shape_assignments() == ["arg0=1024x1024"]
    assert v.run_options() == RunOptions.parse("host", ["kernel.block_size=128"])
    assert variants[4].run_options().target.arch == "sm_90"


def test_defaults_give_one_host_variant_per_program(tree):
    variants = load_sweep(write(tree, "programs: [../softmax.mlir, ../layernorm.mlir]\n"))
    assert [v.id for v in variants] == ["softmax[target=host]", "layernorm[target=host]"]
    assert variants[0].shapes == {} and variants[0].options == {}


def test_option_axes_keep_file_order_and_multiply(tree):
    variants = load_sweep(write(tree, """\
        programs: [../softmax.mlir]
        shapes:
          - {arg1: 8, arg0: 4x4}
        options:
          memory.alignment: [256, 512, 1024]
          kernel.block_size: [64, 128]
          target.fast_math: [false, true]
    """))
    assert len(variants) == 12
    assert variants[0].id == ("softmax[target=host,arg0=4x4,arg1=8,memory.alignment=256,"
                              "kernel.block_size=64,target.fast_math=false]")
    assert variants[1].id.endswith("kernel.block_size=64,target.fast_math=true]")
    assert variants[-1].id.endswith("memory.alignment=1024,kernel.block_size=128,"
                                    "target.fast_math=true]")
    assert list(variants[0].options) == ["memory.alignment", "kernel.block_size",
                                         "target.fast_math"]
    assert len({v.id for v in variants}) == 12


def test_ids_are_stable_across_loads(tree):
    path = write(tree, INTERFACE_EXAMPLE)
    assert [v.id for v in load_sweep(path)] == [v.id for v in load_sweep(path)]


def test_duplicates_are_removed_within_and_across_files(tree):
    a = write(tree, """\
        programs: [../softmax.mlir, ../softmax.mlir]
        options: {kernel.block_size: [128, 128, 256]}
    """, "a.yaml")
    b = write(tree, """\
        programs: [../softmax.mlir, ../layernorm.mlir]
        options: {kernel.block_size: [256, 512]}
    """, "b.yaml")
    assert [v.id for v in load_sweep(a)] == ["softmax[target=host,kernel.block_size=128]",
                                             "softmax[target=host,kernel.block_size=256]"]
    assert [v.id for v in load_sweeps([a, b])] == [
        "softmax[target=host,kernel.block_size=128]",
        "softmax[target=host,kernel.block_size=256]",
        "softmax[target=host,kernel.block_size=512]",
        "layernorm[target=host,kernel.block_size=256]",
        "layernorm[target=host,kernel.block_size=512]",
    ]


def test_one_id_for_two_different_programs_is_an_error(tree):
    (tree / "other").mkdir()
    (tree / "other" / "softmax.mlir").write_text("// another softmax\n")
    path = write(tree, "programs: [../softmax.mlir, ../../other/softmax.mlir]\n")
    with pytest.raises(SweepError, match="names two programs"):
        load_sweep(path)


def test_variants_are_hashable_values():
    a = Variant("/x/softmax.mlir", "host", {0: (4,)}, {"kernel.block_size": 128})
    b = Variant("/x/softmax.mlir", "host", {0: (4,)}, {"kernel.block_size": 128})
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert str(a) == "softmax[target=host,arg0=4,kernel.block_size=128]"
    assert Variant("/x/f.mlir", shapes={0: ()}).id == "f[target=host,arg0=scalar]"


@pytest.mark.parametrize(("text", "message", "line"), [
    ("programs: [../softmax.mlir]\nvariants: []\n", "unknown key 'variants'", 2),
    ("targets: [host]\n", "missing 'programs'", 1),
    ("programs: ../softmax.mlir\n", "'programs' must be a list", 1),
    ("programs: []\n", "'programs' must not be empty", 1),
    ("programs:\n  - ../softmax.mlir\n  - ../nope.mlir\n", "program '../nope.mlir' not found", 3),
    ("programs: [[a, b]]\n", "expected a single value", 1),
    ("programs: [../softmax.mlir]\ntargets: [tpu]\n", "unknown target 'tpu'", 2),
    ("programs: [../softmax.mlir]\ntargets: [cuda:90]\n", "bad CUDA arch", 2),
    ("programs: [../softmax.mlir]\ntargets: host\n", "'targets' must be a list", 2),
    ("programs: [../softmax.mlir]\nshapes: {arg0: 4x4}\n", "'shapes' must be a list", 2),
    ("programs: [../softmax.mlir]\nshapes:\n  - {arg0: 4by4}\n", "must look like 8192x4096", 3),
    ("programs: [../softmax.mlir]\nshapes:\n  - {x0: 4x4}\n", "must be argN", 3),
    ("programs: [../softmax.mlir]\nshapes:\n  - arg0=4x4\n", "a shape binding must be a mapping",
     3),
    ("programs: [../softmax.mlir]\nshapes:\n  - {arg0: [4, 4]}\n", "expected a single value", 3),
    ("programs: [../softmax.mlir]\noptions: [kernel.block_size]\n",
     "'options' must be a mapping", 2),
    ("programs: [../softmax.mlir]\noptions:\n  kernel.block_size: 128\n",
     "option axis 'kernel.block_size' must be a list", 3),
    ("programs: [../softmax.mlir]\noptions:\n  kernel.block_size: []\n", "must not be empty", 3),
    ("programs: [../softmax.mlir]\noptions:\n  kernel.blok_size: [128]\n",
     "unknown option 'kernel.blok_size'", 3),
    ("programs: [../softmax.mlir]\noptions:\n  warp.size: [32]\n", "unknown option 'warp.size'", 3),
    ("programs: [../softmax.mlir]\noptions:\n  kernel.block_size: [128, 100]\n",
     "must be a power of two", 3),
    ("programs: [../softmax.mlir]\noptions:\n  kernel.block_size: [big]\n",
     "takes an integer", 3),
    ("programs: [../softmax.mlir]\noptions:\n  target.fast_math: [maybe]\n", "takes true or false",
     3),
    ("programs: [../softmax.mlir]\noptions:\n  kernel.block_size: [~]\n", "empty value", 3),
    ("programs: [../softmax.mlir]\nprograms: [../layernorm.mlir]\n", "duplicate key 'programs'", 2),
    ("programs: [../softmax.mlir\n", "invalid YAML", 2),
    ("- programs\n", "a sweep file must be a mapping", 1),
])
def test_each_malformation_is_a_sweep_error_with_path_and_line(tree, text, message, line):
    path = write(tree, text)
    with pytest.raises(SweepError) as info:
        load_sweep(path)
    text_of_error = str(info.value)
    assert message in text_of_error
    assert text_of_error.startswith(f"{path}:{line}:"), text_of_error


def test_files_that_say_nothing_are_errors_naming_the_path(tree):
    empty = write(tree, "# nothing here\n")
    with pytest.raises(SweepError, match=r"s\.yaml: the sweep file is empty"):
        load_sweep(empty)
    missing = str(tree / "graphs" / "sweeps" / "missing.yaml")
    with pytest.raises(SweepError, match=r"missing\.yaml: cannot read"):
        load_sweep(missing)
