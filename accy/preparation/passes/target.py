"""Target stage: check what the target supports, then emit source and a launch table.

The product (a ``TargetJob``) keeps the kernel IR and adds, on the module:
``target.target``, ``target.language`` (``cuda`` or ``c``), ``target.source``
(one translation unit), ``target.launches`` (kernel, grid, block, static and
dynamic shared bytes, buffer ids and the TMA tensor maps the loader makes, in
order), ``target.buffers`` and ``target.arena_bytes`` (the memory plan of the
entry function). The compile step reads nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from accy.choir.attributes import (
    ArrayAttr,
    BoolAttr,
    DenseArrayAttr,
    DictAttr,
    IntegerAttr,
    StringAttr,
)
from accy.choir.builtin import FuncOp, ModuleOp
from accy.choir.ir import Operation
from accy.choir.passes import Pass, PassContext
from accy.dialects.kernel import KernelFuncOp, LaunchOp
from accy.dialects.memory import buffer_plan
from accy.errors import VerifyError
from accy.target import cuda, host
from accy.target.backend import backend_of

RENDERERS: dict[str, Callable[[list[KernelFuncOp], bool], str]] = {
    "c": lambda kernels, fast_math: host.emit_kernels(kernels),
    "cuda": cuda.emit_kernels,
}
"""The renderer of each backend language (it spells what the kernel stage decided)."""

SCALARS: dict[str, Callable[[KernelFuncOp], tuple[int, ...]]] = {
    "c": lambda k: (),
    "cuda": cuda.launch_scalars,
}
"""The values each language's kernels take at launch after their buffers (the launch
table's ``scalars``)."""


@dataclass(frozen=True)
class CheckTargetSupport(Pass):
    """Every kernel's element types and launch shapes fit the target."""

    name = "check-target-support"
    preserves = frozenset({"*"})
    target: str = "host"

    def apply(self, ctx: PassContext, module: Operation) -> None:
        backend = backend_of(self.target)
        for op in module.walk():
            for v in list(op.results) + [a for r in op.regions for b in r.blocks
                                         for a in b.args]:
                el = getattr(v.type, "element", None)
                if el is not None and el.name not in backend.dtypes:
                    raise VerifyError(f"element type {el} is not supported on {self.target}",
                                      op.loc)
            if isinstance(op, KernelFuncOp):
                plan = op.plan
                threads = plan.block[0] * plan.block[1] * plan.block[2]
                if threads > backend.max_threads_per_block:
                    raise VerifyError(f"kernel '{op.sym_name}' needs more than "
                                      f"{backend.max_threads_per_block} threads", op.loc)
                for axis, n, limit in zip("xyz", plan.grid, backend.max_grid):
                    if n > limit:
                        raise VerifyError(f"kernel '{op.sym_name}' needs {n} blocks along "
                                          f"{axis}, more than {backend.name} allows ({limit})",
                                          op.loc)
                if plan.shared_bytes > backend.max_shared_bytes:
                    raise VerifyError(f"kernel '{op.sym_name}' needs {plan.shared_bytes} bytes "
                                      f"of shared memory (at most {backend.max_shared_bytes} "
                                      f"on {backend.name})", op.loc)
                if plan.dynamic_shared > backend.max_dynamic_shared_bytes:
                    raise VerifyError(f"kernel '{op.sym_name}' needs {plan.dynamic_shared} "
                                      f"bytes of dynamic shared memory (at most "
                                      f"{backend.max_dynamic_shared_bytes} on {backend.name})",
                                      op.loc)
                if plan.arch_specific and not backend.wgmma:
                    raise VerifyError(f"kernel '{op.sym_name}' ({plan.mapping}) needs "
                                      f"sm_90a; the target is {backend.name}", op.loc)
                ctx.stat("kernels")
        if isinstance(module, ModuleOp):
            for b in buffer_plan(module.entry()):
                if b.bytes > backend.max_buffer_bytes:
                    raise VerifyError(f"buffer {b.id} ({b.kind}, shape "
                                      f"{'x'.join(map(str, b.shape))} {b.dtype}) needs "
                                      f"{b.bytes} bytes, more than accy plans for on "
                                      f"{backend.name} ({backend.max_buffer_bytes})",
                                      module.entry().loc)


@dataclass(frozen=True)
class EmitSource(Pass):
    """Emit the translation unit and the launch table for the target."""

    name = "emit-source"
    target: str = "host"
    fast_math: bool = False

    def apply(self, ctx: PassContext, module: Operation) -> None:
        assert isinstance(module, ModuleOp)
        kernels = [op for op in module.body.ops if isinstance(op, KernelFuncOp)]
        language = backend_of(self.target).language
        source = RENDERERS[language](kernels, self.fast_math)
        kmap = {k.sym_name: k for k in kernels}
        entry = module.entry()
        launches = []
        for op in entry.body.ops:
            if not isinstance(op, LaunchOp):
                continue
            k = kmap[op.kernel]
            ins = op.attr("memory.inputs")
            outs = op.attr("memory.outputs")
            assert isinstance(ins, DenseArrayAttr) and isinstance(outs, DenseArrayAttr)
            launches.append(DictAttr((
                ("kernel", StringAttr(k.sym_name)),
                ("grid", DenseArrayAttr(k.plan.grid)),
                ("block", DenseArrayAttr(k.plan.block)),
                ("shared_bytes", IntegerAttr(k.plan.shared_bytes)),
                ("dynamic_shared", IntegerAttr(k.plan.dynamic_shared)),
                ("tensor_maps", ArrayAttr(tuple(
                    DenseArrayAttr(k.plan.tensor_maps[i:i + 5])
                    for i in range(0, len(k.plan.tensor_maps), 5)))),
                ("buffers", DenseArrayAttr(ins.values + outs.values)),
                ("scalars", DenseArrayAttr(SCALARS[language](k))),
            )))
        module.attributes["target.target"] = StringAttr(self.target)
        module.attributes["target.language"] = StringAttr(language)
        module.attributes["target.fast_math"] = BoolAttr(self.fast_math)
        module.attributes["target.source"] = StringAttr(source)
        module.attributes["target.launches"] = ArrayAttr(tuple(launches))
        module.attributes["target.buffers"] = entry.attr("memory.buffers") or ArrayAttr(())
        module.attributes["target.arena_bytes"] = entry.attr("memory.arena_bytes") or \
            IntegerAttr(0)
        module.attributes["target.entry"] = StringAttr(entry.sym_name)
        ctx.stat("source-bytes", len(source))
        ctx.stat("launches", len(launches))


def launch_table_comment(module: ModuleOp) -> str:
    """The launch table as C comments (for ``accy emit``)."""
    from accy.choir.printer import print_attribute

    lines = ["// launch table (in order; buffers are ids in the buffer plan):"]
    launches = module.attributes.get("target.launches")
    if isinstance(launches, ArrayAttr):
        for entry in launches.values:
            lines.append("//   " + print_attribute(entry))
    lines.append("// buffer plan (arena bytes: "
                 f"{print_attribute(module.attributes.get('target.arena_bytes', IntegerAttr(0)))}"
                 "):")
    buffers = module.attributes.get("target.buffers")
    if isinstance(buffers, ArrayAttr):
        for b in buffers.values:
            lines.append("//   " + print_attribute(b))
    return "\n".join(lines) + "\n"


__all__ = ["CheckTargetSupport", "EmitSource", "launch_table_comment", "FuncOp"]
