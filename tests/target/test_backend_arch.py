"""``cuda`` names the local GPU's arch without loading CuPy in the asking process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_naming_the_cuda_target_loads_no_cupy_in_this_process():
    code = ("import sys; from accy.preparation.options import Target; "
            "t = Target.parse('cuda'); print(t.kind, t.arch.startswith('sm_'), "
            "'cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(ROOT), check=True)
    assert out.stdout.split() == ["cuda", "True", "False"], out.stdout + out.stderr
