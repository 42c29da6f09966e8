"""``builtin.module``, ``func.func``, ``func.return`` and ``func.call``: the frame of every
program.

Example
-------
>>> from accy.choir.attributes import TensorType, F32
>>> t = TensorType((4,), F32)
>>> m = ModuleOp.build()
>>> f = FuncOp.build("main", [t], [t])
>>> _ = m.body.append(f)
>>> _ = f.body.append(ReturnOp([f.body.args[0]]))
>>> m.entry() is f
True
"""

from __future__ import annotations

from collections.abc import Sequence

from accy.choir.attributes import FunctionType, StringAttr, Type, TypeAttr
from accy.choir.ir import Block, Operation, Region, Value
from accy.choir.location import UNKNOWN, Location
from accy.errors import VerifyError


class ModuleOp(Operation):
    """``builtin.module``: one region, one block of functions."""

    name = "builtin.module"
    num_operands = 0
    num_results = 0

    @staticmethod
    def build(loc: Location = UNKNOWN) -> ModuleOp:
        op = ModuleOp(regions=[Region([Block()])], loc=loc)
        return op

    @property
    def functions(self) -> list[FuncOp]:
        return [op for op in self.body.ops if isinstance(op, FuncOp)]

    def entry(self) -> FuncOp:
        """The entry function: ``main``, or the only function."""
        funcs = self.functions
        if not funcs:
            raise VerifyError("module has no function", self.loc)
        for f in funcs:
            if f.sym_name == "main":
                return f
        if len(funcs) == 1:
            return funcs[0]
        raise VerifyError("module has several functions and none is named 'main'", self.loc)

    def verify_(self) -> None:
        if len(self.regions) != 1 or len(self.regions[0].blocks) != 1:
            raise VerifyError("'builtin.module' needs one region with one block", self.loc)
        if self.body.args:
            raise VerifyError("'builtin.module' block takes no arguments", self.loc)


class FuncOp(Operation):
    """``func.func`` with ``sym_name`` and ``function_type`` properties."""

    name = "func.func"
    num_operands = 0
    num_results = 0

    @staticmethod
    def build(name: str, inputs: Sequence[Type], results: Sequence[Type],
              loc: Location = UNKNOWN) -> FuncOp:
        ftype = FunctionType(tuple(inputs), tuple(results))
        return FuncOp(
            properties={"function_type": TypeAttr(ftype), "sym_name": StringAttr(name)},
            regions=[Region([Block(list(inputs))])],
            loc=loc,
        )

    @property
    def sym_name(self) -> str:
        a = self.attr("sym_name")
        return a.value if isinstance(a, StringAttr) else ""

    @property
    def function_type(self) -> FunctionType:
        a = self.attr("function_type")
        if not isinstance(a, TypeAttr) or not isinstance(a.type, FunctionType):
            raise VerifyError("'func.func' needs a 'function_type' of function type", self.loc)
        return a.type

    def set_function_type(self, ftype: FunctionType) -> None:
        where = self.attributes if "function_type" in self.attributes else self.properties
        where["function_type"] = TypeAttr(ftype)

    @property
    def return_op(self) -> ReturnOp:
        term = self.body.terminator
        assert isinstance(term, ReturnOp)
        return term

    def verify_(self) -> None:
        if not isinstance(self.attr("sym_name"), StringAttr):
            raise VerifyError("'func.func' needs a 'sym_name' string", self.loc)
        ftype = self.function_type
        if len(self.regions) != 1 or not self.regions[0].blocks:
            raise VerifyError(f"function '{self.sym_name}' has no body", self.loc)
        if len(self.regions[0].blocks) != 1:
            raise VerifyError(f"function '{self.sym_name}' must have one block", self.loc)
        block = self.body
        if [a.type for a in block.args] != list(ftype.inputs):
            raise VerifyError(
                f"function '{self.sym_name}': entry block arguments do not match its "
                f"function_type inputs", self.loc)
        term = block.terminator
        if not isinstance(term, ReturnOp):
            raise VerifyError(f"function '{self.sym_name}' must end with 'func.return'",
                              term.loc if term is not None else self.loc)
        got = [v.type for v in term.operands]
        if len(got) != len(ftype.results):
            raise VerifyError(
                f"'func.return' has {len(got)} operands but function '{self.sym_name}' "
                f"returns {len(ftype.results)}", term.loc)
        for i, (g, want) in enumerate(zip(got, ftype.results)):
            if not types_compatible(g, want):
                raise VerifyError(
                    f"'func.return' operand {i} has type {g} but function "
                    f"'{self.sym_name}' returns {want}", term.loc)


class ReturnOp(Operation):
    """``func.return``: the terminator of a function."""

    name = "func.return"
    num_results = 0
    traits = frozenset({"terminator"})

    def __init__(self, values: Sequence[Value] = (), loc: Location = UNKNOWN, **kw: object) -> None:
        super().__init__(values, (), loc=loc, **kw)  # type: ignore[arg-type]


class CallOp(Operation):
    """``func.call``: call another function of the module (``callee = @name``).

    The contract stage inlines every call (``inline-calls``); the verifier
    checks that the callee exists and that operands and results match its type.
    """

    name = "func.call"

    def verify_(self) -> None:
        from accy.choir.attributes import SymbolRefAttr

        ref = self.attr("callee")
        if not isinstance(ref, SymbolRefAttr):
            raise VerifyError("'func.call' needs a 'callee' symbol (callee = @name)", self.loc)
        module = self.parent_op
        while module is not None and not isinstance(module, ModuleOp):
            module = module.parent_op
        if module is None:
            return  # a detached call: checked again once it sits in a module
        callee = next((op for op in module.body.ops
                       if isinstance(op, FuncOp) and op.sym_name == ref.name), None)
        if callee is None:
            raise VerifyError(f"'func.call' calls '@{ref.name}', which the module does not "
                              f"define", self.loc)
        ftype = callee.function_type
        if len(self.operands) != len(ftype.inputs) or len(self.results) != len(ftype.results):
            raise VerifyError(f"'func.call' to '@{ref.name}' passes {len(self.operands)} "
                              f"operands and takes {len(self.results)} results, but "
                              f"'@{ref.name}' is {ftype}", self.loc)
        for i, (v, want) in enumerate(zip(self.operands, ftype.inputs)):
            if not types_compatible(v.type, want):
                raise VerifyError(f"'func.call' operand {i} has type {v.type} but "
                                  f"'@{ref.name}' takes {want}", self.loc)


def types_compatible(actual: Type, declared: Type) -> bool:
    """Equal, or equal but for ``?`` dims on either side (used at function boundaries)."""
    from accy.choir.attributes import TensorType

    if actual == declared:
        return True
    if isinstance(actual, TensorType) and isinstance(declared, TensorType):
        return (actual.element == declared.element and actual.rank == declared.rank and all(
            a is None or d is None or a == d for a, d in zip(actual.shape, declared.shape)))
    return False
