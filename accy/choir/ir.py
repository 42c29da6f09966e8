"""The choir IR core: values, operations, blocks and regions.

Operations, values, blocks and regions compare by identity; types and
attributes (``accy.choir.attributes``) by value. An op kind is declared as a
subclass of :class:`Operation` with a ``name`` and a ``verify_`` hook; the
registry maps names to classes so the parser builds the right class, and
unknown names stay generic ``Operation`` instances (the verifier rejects them
where a dialect is closed).

Example
-------
>>> from accy.choir.attributes import TensorType, F32
>>> t = TensorType((4,), F32)
>>> block = Block([t])
>>> op = Operation.create("test.neg", [block.args[0]], [t])
>>> _ = block.append(op)
>>> op.operands[0] is block.args[0], len(block.args[0].uses)
(True, 1)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import ClassVar

from accy.choir.attributes import Attribute, Type
from accy.choir.location import UNKNOWN, Location

OP_REGISTRY: dict[str, type[Operation]] = {}


def declared_ops(dialect: str, base: type | None = None, trait: str | None = None) \
        -> tuple[str, ...]:
    """The short names of the declared ops of ``dialect`` (declaration order), optionally
    only the subclasses of ``base`` or the ops with ``trait``: lists of ops by kind come
    from the declarations, never from hand-kept tuples.

    >>> "add" in declared_ops("builtin")
    False
    """
    prefix = f"{dialect}."
    return tuple(name[len(prefix):] for name, cls in OP_REGISTRY.items()
                 if name.startswith(prefix)
                 and (base is None or issubclass(cls, base))
                 and (trait is None or trait in cls.traits))
"""Declared op classes by name, filled by ``Operation.__init_subclass__``."""


class Value:
    """An SSA value: an op result or a block argument."""

    __slots__ = ("type", "uses", "loc", "__weakref__")

    def __init__(self, type: Type, loc: Location = UNKNOWN) -> None:
        self.type = type
        self.uses: list[tuple[Operation, int]] = []
        """(user op, operand index) for every use of this value."""
        self.loc = loc

    @property
    def owner(self) -> Operation | Block:
        raise NotImplementedError

    def replace_all_uses_with(self, new: Value) -> None:
        """Make every user of this value use ``new`` instead."""
        for op, index in list(self.uses):
            op.set_operand(index, new)

    @property
    def has_uses(self) -> bool:
        return bool(self.uses)


class OpResult(Value):
    """Result ``index`` of ``op``."""

    __slots__ = ("op", "index")

    def __init__(self, type: Type, op: Operation, index: int) -> None:
        super().__init__(type)
        self.op = op
        self.index = index

    @property
    def owner(self) -> Operation:
        return self.op


class BlockArgument(Value):
    """Argument ``index`` of ``block``."""

    __slots__ = ("block", "index")

    def __init__(self, type: Type, block: Block, index: int, loc: Location = UNKNOWN) -> None:
        super().__init__(type, loc)
        self.block = block
        self.index = index

    @property
    def owner(self) -> Block:
        return self.block


class Operation:
    """An operation: a name, operands, results, attributes, properties, regions.

    Subclasses declare one op kind each: ``name`` and optionally
    ``num_operands`` / ``num_results`` (``None`` = variadic) and ``verify_``.
    """

    name: ClassVar[str] = ""
    num_operands: ClassVar[int | None] = None
    num_results: ClassVar[int | None] = None
    traits: ClassVar[frozenset[str]] = frozenset()
    """Markers shared by kinds: ``pure``, ``elementwise``, ``terminator``, ``commutative``."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            OP_REGISTRY[cls.name] = cls

    def __init__(
        self,
        operands: Sequence[Value] = (),
        result_types: Sequence[Type] = (),
        attributes: dict[str, Attribute] | None = None,
        properties: dict[str, Attribute] | None = None,
        regions: Sequence[Region] = (),
        loc: Location = UNKNOWN,
        *,
        name: str | None = None,
    ) -> None:
        self.op_name: str = name or type(self).name
        assert self.op_name, "an operation needs a name"
        self._operands: list[Value] = []
        for v in operands:
            self._add_operand(v)
        self.results: list[OpResult] = [OpResult(t, self, i) for i, t in enumerate(result_types)]
        self.attributes: dict[str, Attribute] = dict(attributes or {})
        self.properties: dict[str, Attribute] = dict(properties or {})
        self.regions: list[Region] = []
        for r in regions:
            self.add_region(r)
        self.loc = loc
        self.parent: Block | None = None

    @staticmethod
    def create(
        name: str,
        operands: Sequence[Value] = (),
        result_types: Sequence[Type] = (),
        attributes: dict[str, Attribute] | None = None,
        properties: dict[str, Attribute] | None = None,
        regions: Sequence[Region] = (),
        loc: Location = UNKNOWN,
    ) -> Operation:
        """Build an op of the class registered for ``name`` (generic if none)."""
        cls = OP_REGISTRY.get(name, Operation)
        op = cls.__new__(cls)
        Operation.__init__(op, operands, result_types, attributes, properties, regions, loc,
                           name=name)
        return op

    # -- operands
    def _add_operand(self, v: Value) -> None:
        assert isinstance(v, Value), f"operand must be a Value, got {type(v).__name__}"
        v.uses.append((self, len(self._operands)))
        self._operands.append(v)

    @property
    def operands(self) -> tuple[Value, ...]:
        return tuple(self._operands)

    def set_operand(self, index: int, value: Value) -> None:
        old = self._operands[index]
        old.uses.remove((self, index))
        self._operands[index] = value
        value.uses.append((self, index))

    def set_operands(self, values: Sequence[Value]) -> None:
        self._drop_operands()
        for v in values:
            self._add_operand(v)

    def _drop_operands(self) -> None:
        for i, v in enumerate(self._operands):
            v.uses.remove((self, i))
        self._operands = []

    # -- results
    @property
    def result(self) -> OpResult:
        assert len(self.results) == 1, f"{self.op_name} has {len(self.results)} results"
        return self.results[0]

    @property
    def result_types(self) -> tuple[Type, ...]:
        return tuple(r.type for r in self.results)

    # -- regions
    def add_region(self, region: Region) -> Region:
        assert region.parent is None, "region already attached"
        region.parent = self
        self.regions.append(region)
        return region

    @property
    def body(self) -> Block:
        """The single block of the first region (module, func, region ops)."""
        return self.regions[0].blocks[0]

    # -- attributes
    def attr(self, key: str) -> Attribute | None:
        """An attribute or property by name (attributes first)."""
        if key in self.attributes:
            return self.attributes[key]
        return self.properties.get(key)

    # -- structure
    def walk(self) -> Iterator[Operation]:
        """This op and every op nested in it, pre-order."""
        yield self
        for region in self.regions:
            for block in region.blocks:
                for op in list(block.ops):
                    yield from op.walk()

    @property
    def parent_op(self) -> Operation | None:
        if self.parent is None or self.parent.parent is None:
            return None
        return self.parent.parent.parent

    def erase(self) -> None:
        """Detach from the parent block and drop operand uses (results must be unused)."""
        for r in self.results:
            assert not r.uses, f"erasing {self.op_name} whose result is still used"
        for op in list(self.walk())[::-1]:
            op._drop_operands()
        if self.parent is not None:
            self.parent.ops.remove(self)
            self.parent = None

    def clone(self, mapping: dict[Value, Value] | None = None) -> Operation:
        """A deep copy; operands are remapped through ``mapping`` (which is extended)."""
        mapping = {} if mapping is None else mapping
        operands = [mapping.get(v, v) for v in self._operands]
        new = Operation.create(self.op_name, operands, self.result_types, self.attributes,
                               self.properties, (), self.loc)
        for old_r, new_r in zip(self.results, new.results):
            mapping[old_r] = new_r
        for region in self.regions:
            new.add_region(region.clone(mapping))
        return new

    def verify_(self) -> None:
        """Per-kind checks; raise ``VerifyError`` (override in subclasses)."""

    def __repr__(self) -> str:
        return f"<{self.op_name} at {self.loc}>"


class Block:
    """A list of ops with typed arguments."""

    __slots__ = ("args", "ops", "parent", "__weakref__")

    def __init__(self, arg_types: Sequence[Type] = (), arg_locs: Sequence[Location] = ()) -> None:
        locs = list(arg_locs) + [UNKNOWN] * (len(arg_types) - len(arg_locs))
        self.args: list[BlockArgument] = [
            BlockArgument(t, self, i, loc) for i, (t, loc) in enumerate(zip(arg_types, locs))
        ]
        self.ops: list[Operation] = []
        self.parent: Region | None = None

    def append(self, op: Operation) -> Operation:
        assert op.parent is None, "op already in a block"
        op.parent = self
        self.ops.append(op)
        return op

    def insert_before(self, anchor: Operation, op: Operation) -> Operation:
        assert op.parent is None, "op already in a block"
        op.parent = self
        self.ops.insert(self.ops.index(anchor), op)
        return op

    def add_arg(self, type: Type, loc: Location = UNKNOWN) -> BlockArgument:
        arg = BlockArgument(type, self, len(self.args), loc)
        self.args.append(arg)
        return arg

    @property
    def terminator(self) -> Operation | None:
        return self.ops[-1] if self.ops else None


class Region:
    """A list of blocks owned by an op."""

    __slots__ = ("blocks", "parent", "__weakref__")

    def __init__(self, blocks: Sequence[Block] = ()) -> None:
        self.blocks: list[Block] = []
        self.parent: Operation | None = None
        for b in blocks:
            self.add_block(b)

    def add_block(self, block: Block) -> Block:
        block.parent = self
        self.blocks.append(block)
        return block

    def clone(self, mapping: dict[Value, Value]) -> Region:
        new = Region()
        for block in self.blocks:
            nb = Block([a.type for a in block.args], [a.loc for a in block.args])
            for a, na in zip(block.args, nb.args):
                mapping[a] = na
            new.add_block(nb)
        for block, nb in zip(self.blocks, new.blocks):
            for op in block.ops:
                nb.append(op.clone(mapping))
        return new
