"""Parse MLIR's generic operation syntax into choir.

Reads what accy's printer writes and what ``mlir-opt -mlir-print-op-generic``
writes for accy's programs: properties ``<{…}>``, ``loc(…)`` (inline and
``#loc`` aliases), ``%argN`` names, ``%0:2`` / ``%0#1`` multi-results, MLIR's
float spellings (``9.99999974E-6``, hex bit patterns) and dense elements in
nested-list, splat and hex-blob forms. Every error is a ``ParseError`` with
``file:line:col``.

Limits, each a ``ParseError`` at the offending text: nesting of ops, types,
attributes and dense literals deeper than ``lexer.MAX_DEPTH`` (200); integers
that do not fit their type (an untyped integer is an i64); tensor dims (and
element counts) past int64, or written with other than ASCII digits; dense
constants past ``attributes.MAX_DENSE_ELEMENTS`` values (splats: their shape
past ``MAX_SPLAT_ELEMENTS``). Parsing is linear in the text (locations come
from a line-start table).

Example
-------
>>> m = parse_module('"builtin.module"() ({\\n}) : () -> ()', "x.mlir")
>>> m.op_name
'builtin.module'
"""

from __future__ import annotations

import gc

from accy.choir.attr_parser import AttrParser
from accy.choir.attributes import Attribute, FunctionType
from accy.choir.builtin import ModuleOp
from accy.choir.ir import Block, Operation, Region, Value
from accy.choir.lexer import SUFFIX_ID as _SUFFIX_ID
from accy.choir.location import Location
from accy.errors import ParseError


class Parser(AttrParser):
    """A character-level recursive-descent parser over one source text."""

    def __init__(self, text: str, file: str = "<string>") -> None:
        import accy.dialects  # noqa: F401  (registers the declared op classes)

        super().__init__(text, file)
        self.scopes: list[dict[str, list[Value]]] = [{}]

    # ---------------------------------------------------------------- toplevel
    def parse_toplevel(self) -> ModuleOp:
        ops: list[Operation] = []
        while True:
            self.skip()
            if self.pos >= len(self.text):
                break
            end = self.alias_ends.get(self.pos)
            if end is not None:
                self.pos = end
                continue
            if self.peek("#"):
                raise self.error("unsupported attribute alias definition")
            ops.append(self.parse_op())
        if not ops:
            raise ParseError("empty file: expected a 'builtin.module'", Location(self.file, 1, 1))
        if len(ops) == 1 and isinstance(ops[0], ModuleOp):
            return ops[0]
        if any(isinstance(op, ModuleOp) for op in ops):
            raise ParseError("expected exactly one top-level 'builtin.module'", ops[1].loc)
        module = ModuleOp.build(Location(self.file, 1, 1))
        for op in ops:
            module.body.append(op)
        return module

    # --------------------------------------------------------------- operations
    def parse_op(self) -> Operation:
        """One generic-form operation; its results are bound in the current scope."""
        self._enter()
        self.skip()
        start = self.pos
        results = self._result_header()
        op_name = self._op_name()
        operands, operand_pos = self._operands()
        if self.peek("["):
            raise self.error("block successors are not supported")
        properties = self._properties()
        regions = self._regions()
        attributes = self.attr_dict() if self.peek("{") else {}
        ftype, type_pos = self._op_type()
        loc = self._trailing_loc(start)
        self._check_signature(op_name, operands, operand_pos, ftype, type_pos,
                              sum(c for _, c, _ in results), start)
        op = Operation.create(op_name, operands, ftype.results, attributes, properties, regions,
                              loc)
        if isinstance(op, ModuleOp) and len(regions) == 1 and not regions[0].blocks:
            regions[0].add_block(Block())  # a module always has its (implicit) block, as in MLIR
        self._bind_results(op, results)
        self.depth -= 1
        return op

    def _result_header(self) -> list[tuple[str, int, int]]:
        """The ``%a, %b:2 =`` before an op: (name, count, position) of each result group."""
        results: list[tuple[str, int, int]] = []
        if not self.peek("%"):
            return results
        while True:
            self.skip()
            rpos = self.pos
            name = self.value_name()
            count = 1
            if self.accept(":"):
                self.skip()
                cpos = self.pos
                count = self.integer("result count")
                if count < 1:
                    raise self.error("a result group needs at least one result", cpos)
            results.append((name, count, rpos))
            if not self.accept(","):
                break
        self.expect("=")
        return results

    def _op_name(self) -> str:
        """The quoted ``"dialect.op"`` name; a dialect prefix is required."""
        self.skip()
        if not self.peek('"'):
            raise self.error(f"expected an operation in generic form (\"dialect.op\"), "
                             f"found {self._found()}")
        name_pos = self.pos
        op_name = self.string()
        if "." not in op_name:
            raise self.error(f"operation name '{op_name}' needs a dialect prefix", name_pos)
        return op_name

    def _operands(self) -> tuple[list[Value], list[int]]:
        """The ``(%a, %b#1)`` operand list: the values used and where each is written."""
        self.expect("(")
        operands: list[Value] = []
        operand_pos: list[int] = []
        if not self.accept(")"):
            while True:
                self.skip()
                operand_pos.append(self.pos)
                operands.append(self.value_use())
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')'")
        return operands, operand_pos

    def _properties(self) -> dict[str, Attribute]:
        """The optional ``<{…}>`` properties dictionary."""
        if not self.accept("<"):
            return {}
        self.skip()
        if not self.peek("{"):
            raise self.error("expected '{' to start properties")
        properties = self.attr_dict()
        self.expect(">", "'>' to end properties")
        return properties

    def _regions(self) -> list[Region]:
        """The optional ``({…}, {…})`` region list, each region in a scope of its own."""
        regions: list[Region] = []
        if self.accept("("):
            while True:
                self.scopes.append({})
                regions.append(self.parse_region())
                self.scopes.pop()
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' after region")
        return regions

    def _op_type(self) -> tuple[FunctionType, int]:
        """The ``: (…) -> …`` function type of an op, and where it starts."""
        self.expect(":", "':' and the operation's function type")
        self.skip()
        type_pos = self.pos
        ftype = self.parse_type()
        if not isinstance(ftype, FunctionType):
            raise self.error("expected a function type '(…) -> …' for the operation", type_pos)
        return ftype, type_pos

    def _trailing_loc(self, start: int) -> Location:
        """A trailing ``loc(…)`` if there is one, else the location of ``start``."""
        loc = self.location(start)
        if self.peek("loc("):
            loc = self.parse_loc() or loc
        return loc

    def _check_signature(self, op_name: str, operands: list[Value], operand_pos: list[int],
                         ftype: FunctionType, type_pos: int, n_results: int,
                         start: int) -> None:
        """The op's function type must match its operands (count, types) and result count."""
        if len(ftype.inputs) != len(operands):
            raise self.error(f"'{op_name}' has {len(operands)} operands but its type lists "
                             f"{len(ftype.inputs)}", type_pos)
        for i, (v, t) in enumerate(zip(operands, ftype.inputs)):
            if v.type != t:
                raise self.error(f"operand {i} of '{op_name}' has type {v.type} but the "
                                 f"operation's type says {t}", operand_pos[i])
        if n_results != len(ftype.results):
            raise self.error(f"'{op_name}' defines {n_results} results but its type lists "
                             f"{len(ftype.results)}", start)

    def _bind_results(self, op: Operation, results: list[tuple[str, int, int]]) -> None:
        """Name the op's results in the current scope; a name may be defined once."""
        k = 0
        for name, count, rpos in results:
            if name in self.scopes[-1]:
                raise self.error(f"redefinition of SSA value '%{name}'", rpos)
            self.scopes[-1][name] = list(op.results[k:k + count])
            k += count

    def value_name(self) -> str:
        self.skip()
        if not self.accept("%"):
            raise self.error(f"expected an SSA value, found {self._found()}")
        m = _SUFFIX_ID.match(self.text, self.pos)
        if not m:
            raise self.error("expected an SSA value name after '%'")
        self.pos = m.end()
        return m.group(0)

    def value_use(self) -> Value:
        pos = self.pos
        name = self.value_name()
        index = 0
        if self.text.startswith("#", self.pos):
            self.pos += 1
            index = self.integer("result number")
        for scope in reversed(self.scopes):
            if name in scope:
                group = scope[name]
                if index >= len(group):
                    raise self.error(f"'%{name}' has only {len(group)} results", pos)
                return group[index]
        raise self.error(f"use of undefined value '%{name}'", pos)

    def parse_region(self) -> Region:
        self.expect("{", "'{' to start a region")
        region = Region()
        first = True
        while not self.accept("}"):
            self.skip()
            if self.pos >= len(self.text):
                raise self.error("unexpected end of file: expected '}' to close a region")
            block = Block()
            if self.peek("^"):
                self.pos += 1
                m = _SUFFIX_ID.match(self.text, self.pos)
                if not m:
                    raise self.error("expected a block label after '^'")
                self.pos = m.end()
                if self.accept("("):
                    if not self.accept(")"):
                        while True:
                            self.skip()
                            apos = self.pos
                            name = self.value_name()
                            self.expect(":", "':' and the argument's type")
                            t = self.parse_type()
                            loc = self._trailing_loc(apos)
                            if name in self.scopes[-1]:
                                raise self.error(f"redefinition of SSA value '%{name}'", apos)
                            self.scopes[-1][name] = [block.add_arg(t, loc)]
                            if self.accept(")"):
                                break
                            self.expect(",", "',' or ')'")
                self.expect(":", "':' after the block label")
            elif not first:
                raise self.error("expected a block label '^bbN' or '}'")
            region.add_block(block)
            first = False
            while not (self.peek("}") or self.peek("^")):
                self.skip()
                if self.pos >= len(self.text):
                    raise self.error("unexpected end of file: expected '}' to close a region")
                block.append(self.parse_op())
        return region

def parse_module(text: str, file: str = "<string>") -> ModuleOp:
    """Parse one program (a ``builtin.module``, or top-level ops wrapped in one).

    Time is linear in the text: the cyclic garbage collector is paused while
    the (acyclic-until-linked) IR is built, as its passes over a growing heap
    would make a large program quadratic.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return Parser(text, file).parse_toplevel()
    finally:
        if was_enabled:
            gc.enable()


def parse_file(path: str) -> ModuleOp:
    """Read and parse ``path``; unreadable files are a ``ParseError`` too."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ParseError(f"cannot read file: {e}", Location(path, 1, 1)) from None
    return parse_module(text, path)
