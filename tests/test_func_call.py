"""``func.call`` through every stage: the verifier checks calls, the contract stage
inlines them, the compiled host result equals the reference and NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from accy.api import run_program
from accy.errors import AccyError
from accy.preparation.products import SemanticModule

PROGRAM = '''"builtin.module"() ({
  "func.func"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, sym_name = "twice"}> ({
  ^bb0(%x: tensor<4xf32>):
    %0 = "semantic.add"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%0) : (tensor<4xf32>) -> ()
  }) : () -> ()
  "func.func"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, sym_name = "main"}> ({
  ^bb0(%a: tensor<4xf32>):
    %1 = "func.call"(%a) {callee = @CALLEE} : (tensor<4xf32>) -> tensor<4xf32>
    %2 = "semantic.exp"(%1) : (tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%2) : (tensor<4xf32>) -> ()
  }) : () -> ()
}) : () -> ()
'''


@pytest.mark.parametrize("reference", [False, True])
def test_a_call_compiles_and_runs(tmp_path, reference):
    path = tmp_path / "call.mlir"
    path.write_text(PROGRAM.replace("CALLEE", "twice"))
    x = np.arange(4, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    (out,) = run_program(str(path), [str(tmp_path / "x.npy")], str(tmp_path / "out"),
                         reference=reference)
    np.testing.assert_allclose(np.load(out), np.exp(2 * x), rtol=1e-6)


def test_a_call_to_an_unknown_function_is_a_located_error(tmp_path):
    path = tmp_path / "call.mlir"
    path.write_text(PROGRAM.replace("CALLEE", "thrice"))
    with pytest.raises(AccyError, match="calls '@thrice', which the module does not define") \
            as info:
        SemanticModule.from_file(str(path))
    assert info.value.loc is not None and info.value.loc.line == 9
