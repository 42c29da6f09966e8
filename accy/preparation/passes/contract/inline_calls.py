"""``inline-calls``: every ``func.call`` becomes a copy of its callee's body.

SEMANTIC.md lets a module hold several functions; the stages after contract
compile one function, the entry. This pass, first in the contract pipeline,
replaces each call by the callee's ops (the callee's arguments bound to the
call's operands, the call's results to the callee's ``func.return`` operands),
innermost callees first, then drops the functions the entry no longer reaches.
A recursive call, an unknown callee, or an operand or result count that
disagrees with the callee's type is a ``VerifyError`` at the call.

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.passes import PassManager
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, sym_name = "twice"}> ({
...   ^bb0(%x: tensor<4xf32>):
...     %0 = "semantic.add"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
...     "func.return"(%0) : (tensor<4xf32>) -> ()
...   }) : () -> ()
...   "func.func"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<4xf32>):
...     %0 = "func.call"(%x) {callee = @twice} : (tensor<4xf32>) -> tensor<4xf32>
...     "func.return"(%0) : (tensor<4xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> PassManager("contract", (InlineCalls(),)).run(m).stats["inline-calls"]
{'inlined': 1, 'functions-dropped': 1}
>>> [op.op_name for op in m.entry().body.ops]
['semantic.add', 'func.return']
"""

from __future__ import annotations

from dataclasses import dataclass

from accy.choir.attributes import StringAttr, SymbolRefAttr
from accy.choir.builtin import FuncOp, ModuleOp
from accy.choir.ir import Operation, Value
from accy.choir.passes import Pass, PassContext
from accy.errors import VerifyError


def _callee(op: Operation, functions: dict[str, FuncOp]) -> FuncOp:
    ref = op.attr("callee")
    name = ref.name if isinstance(ref, SymbolRefAttr) else \
        ref.value if isinstance(ref, StringAttr) else None
    if name is None:
        raise VerifyError("'func.call' needs a 'callee' symbol (callee = @name)", op.loc)
    if name not in functions:
        raise VerifyError(f"'func.call' calls '@{name}', which the module does not define",
                          op.loc)
    func = functions[name]
    ftype = func.function_type
    if len(op.operands) != len(ftype.inputs) or len(op.results) != len(ftype.results):
        raise VerifyError(f"'func.call' to '@{name}' passes {len(op.operands)} operands and "
                          f"takes {len(op.results)} results, but '@{name}' is {ftype}", op.loc)
    return func


def _inline(call: Operation, func: FuncOp) -> None:
    block = call.parent
    assert block is not None
    mapping: dict[Value, Value] = dict(zip(func.body.args, call.operands))
    for op in func.body.ops:
        if op is func.body.terminator:
            for r, v in zip(call.results, op.operands):
                r.replace_all_uses_with(mapping.get(v, v))
            break
        block.insert_before(call, op.clone(mapping))
    call.erase()


@dataclass(frozen=True)
class InlineCalls(Pass):
    """Inline every ``func.call``; keep only the entry function."""

    name = "inline-calls"

    def apply(self, ctx: PassContext, module: Operation) -> None:
        assert isinstance(module, ModuleOp)
        functions = {f.sym_name: f for f in module.functions}
        if len(functions) < 2 and not any(op.op_name == "func.call" for op in module.walk()):
            return
        entry = module.entry()
        done: set[str] = set()

        def inline_into(func: FuncOp, stack: tuple[str, ...]) -> None:
            if func.sym_name in done:
                return
            for op in list(func.body.ops):
                if op.op_name != "func.call":
                    continue
                callee = _callee(op, functions)
                if callee.sym_name in stack or callee is func:
                    raise VerifyError(f"'func.call' to '@{callee.sym_name}' is recursive "
                                      f"({' -> '.join((*stack, callee.sym_name))})", op.loc)
                inline_into(callee, (*stack, callee.sym_name))
                _inline(op, callee)
                ctx.stat("inlined")
            done.add(func.sym_name)

        inline_into(entry, (entry.sym_name,))
        for f in module.functions:
            if f is not entry:
                f.erase()
                ctx.stat("functions-dropped")
