"""The ``kernel`` dialect: kernels with their loop nest, thread mapping and launch.

- ``kernel.func`` (a module-level symbol) holds one dispatch's body (``prim``
  ops over its inputs, ending in ``kernel.yield``) and the plan the kernel
  stage made for it: ``mapping`` (``grid-stride``, ``block-per-row``,
  ``warp-per-row``, ``tiled``, or ``loop`` on the host), the block and grid
  shapes, the vector width, items per thread, which inputs are cached in
  registers, tile sizes and shared-memory bytes;
- ``kernel.launch`` replaces the dispatch in the host function: it names the
  kernel (``@symbol``) and carries the buffers it reads and writes.
"""

from __future__ import annotations

from accy.choir.attributes import DenseArrayAttr, IntegerAttr, StringAttr, SymbolRefAttr
from accy.choir.ir import Operation
from accy.errors import VerifyError

MAPPINGS = ("grid-stride", "block-per-row", "warp-per-row", "tiled", "loop")


class KernelFuncOp(Operation):
    """``kernel.func``: one kernel's body and its plan."""

    name = "kernel.func"
    num_operands = 0
    num_results = 0

    @property
    def sym_name(self) -> str:
        a = self.attr("sym_name")
        return a.value if isinstance(a, StringAttr) else ""

    def int_attr(self, key: str, default: int = 0) -> int:
        a = self.attr(key)
        return a.value if isinstance(a, IntegerAttr) else default

    def ints_attr(self, key: str) -> tuple[int, ...]:
        a = self.attr(key)
        return a.values if isinstance(a, DenseArrayAttr) else ()

    def str_attr(self, key: str, default: str = "") -> str:
        a = self.attr(key)
        return a.value if isinstance(a, StringAttr) else default

    def verify_(self) -> None:
        if not self.sym_name:
            raise VerifyError("'kernel.func' needs a 'sym_name'", self.loc)
        if self.str_attr("mapping") not in MAPPINGS:
            raise VerifyError(f"'kernel.func' mapping must be one of {', '.join(MAPPINGS)}",
                              self.loc)
        if len(self.regions) != 1 or len(self.regions[0].blocks) != 1:
            raise VerifyError("'kernel.func' needs one region with one block", self.loc)
        if not isinstance(self.body.terminator, KernelYieldOp):
            raise VerifyError("'kernel.func' must end with 'kernel.yield'", self.loc)
        for key in ("block", "grid"):
            if len(self.ints_attr(key)) != 3 or min(self.ints_attr(key)) < 1:
                raise VerifyError(f"'kernel.func' needs '{key} = array<i64: x, y, z>'", self.loc)


class KernelYieldOp(Operation):
    """``kernel.yield``: the values a kernel writes."""

    name = "kernel.yield"
    num_results = 0
    traits = frozenset({"terminator"})


class LaunchOp(Operation):
    """``kernel.launch``: run ``kernel`` on buffers (``memory.inputs`` / ``memory.outputs``)."""

    name = "kernel.launch"

    @property
    def kernel(self) -> str:
        a = self.attr("kernel")
        return a.name if isinstance(a, SymbolRefAttr) else ""

    def verify_(self) -> None:
        if not self.kernel:
            raise VerifyError("'kernel.launch' needs 'kernel = @name'", self.loc)
