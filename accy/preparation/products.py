"""Stage products: the semantic module, revisions, and ContractJob … TargetJob.

A product owns a choir module after one stage. Products are immutable once
made (a stage clones its input before changing it), fingerprint their
canonical content, and travel as msgpack (``to_wire`` / ``from_wire``); they
refuse to be pickled, so any pickle path on the IR is a loud bug.

Example
-------
>>> sm = SemanticModule.from_text('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<4xf32>):
...     "func.return"(%x) : (tensor<4xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> Product.from_wire(sm.to_wire()).fingerprint() == sm.fingerprint()
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import msgpack

from accy.choir.attributes import StringAttr
from accy.choir.builtin import FuncOp, ModuleOp
from accy.choir.printer import print_op
from accy.choir.verifier import verify
from accy.choir.wire import decode, encode, encode_and_fingerprint, fingerprint
from accy.errors import AccyError, VerifyError, WireFormatError

PRODUCT_MAGIC = b"accy-product"
PRODUCTS: dict[str, type[Product]] = {}


class Product:
    """A choir module after one stage, plus small JSON-able metadata."""

    stage: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("stage"):
            PRODUCTS[cls.stage] = cls

    def __init__(self, module: ModuleOp, meta: dict[str, Any] | None = None) -> None:
        if not isinstance(module, ModuleOp):
            raise VerifyError(f"a {type(self).__name__} needs a 'builtin.module'")
        self._module: ModuleOp | None = module
        self._encoded: bytes | None = None
        self._broken: Callable[[], None] | None = None
        self.meta: dict[str, Any] = dict(meta or {})
        self._fingerprint: str | None = None

    @property
    def module(self) -> ModuleOp:
        """The choir module (a deferred product decodes and verifies it here, once)."""
        if self._module is None:
            self._materialize()
        assert self._module is not None
        return self._module

    @property
    def deferred(self) -> bool:
        """Read back without decoding its module yet (see :meth:`from_wire`)."""
        return self._module is None

    def _materialize(self) -> None:
        assert self._encoded is not None
        try:
            module = decode(self._encoded)
            if not isinstance(module, ModuleOp):
                raise WireFormatError("a product must hold a 'builtin.module'")
            self._module = module
            self.verify()
        except AccyError as e:
            self._module = None
            if self._broken is not None:
                self._broken()  # e.g. drop the store entry it came from
            raise StoredProductBroken(f"the stored {self.stage} product "
                                      f"{(self._fingerprint or '')[:12]} does not decode and "
                                      f"verify: {e}") from None
        self._encoded = None

    def fingerprint(self) -> str:
        """128-bit hex hash of the module's canonical content (names and locations left out)."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.module)
        return self._fingerprint

    def verify(self) -> None:
        verify(self.module)

    def entry(self) -> FuncOp:
        return self.module.entry()

    def text(self, debuginfo: bool = False) -> str:
        return print_op(self.module, debuginfo)

    def clone_module(self) -> ModuleOp:
        m = self.module.clone()
        assert isinstance(m, ModuleOp)
        return m

    # -- wire
    def to_wire(self) -> bytes:
        if self._module is None:
            body = self._encoded
        elif self._fingerprint is None:  # both from one walk of the module
            body, self._fingerprint = encode_and_fingerprint(self._module)
        else:
            body = encode(self._module)
        return msgpack.packb([PRODUCT_MAGIC, self.stage, self.meta, body], use_bin_type=True)

    @staticmethod
    def from_wire(data: bytes, deferred: tuple[str, Callable[[], None] | None] | None = None) \
            -> Product:
        """The product ``to_wire`` wrote. With ``deferred=(fingerprint, on_broken)`` the
        module is not decoded now: the product answers ``fingerprint()`` and
        ``to_wire()`` from what it was given and decodes and verifies its module when
        first used — a stage result read back only to key the next stage is never
        decoded. If that fails it calls ``on_broken`` and raises
        :class:`StoredProductBroken`. Only for entries whose key and integrity were
        checked (the artifact store's)."""
        try:
            obj = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True)
        except Exception as e:
            raise WireFormatError(f"malformed product: {type(e).__name__}") from None
        if not (isinstance(obj, list) and len(obj) == 4 and obj[0] == PRODUCT_MAGIC
                and isinstance(obj[1], str) and isinstance(obj[2], dict)
                and isinstance(obj[3], bytes)):
            raise WireFormatError("malformed product header")
        cls = PRODUCTS.get(obj[1])
        if cls is None:
            raise WireFormatError(f"unknown product stage '{obj[1]}'")
        if deferred is not None:
            p = cls.__new__(cls)
            p._module, p._encoded, p.meta = None, obj[3], dict(obj[2])
            p._fingerprint, p._broken = deferred
            return p
        module = decode(obj[3])
        if not isinstance(module, ModuleOp):
            raise WireFormatError("a product must hold a 'builtin.module'")
        return cls(module, obj[2])

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"{type(self).__name__} never pickles: products travel as msgpack "
                        f"(accy.distributed registers the serializer)")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.fingerprint()[:12]}>"


class StoredProductBroken(AccyError):
    """A deferred product (read back from the store) did not decode or verify when used."""


class SemanticModule(Product):
    """The verified input program."""

    stage = "semantic"

    @staticmethod
    def from_text(text: str, file: str = "<string>") -> SemanticModule:
        from accy.choir.parser import parse_module

        sm = SemanticModule(parse_module(text, file))
        sm.verify()
        return sm

    @staticmethod
    def from_file(path: str) -> SemanticModule:
        """Parse and verify a choir text file (:func:`accy.frontends.load_program` also
        reads models of the front ends)."""
        from accy.choir.parser import parse_file

        sm = SemanticModule(parse_file(path), {"source": path})
        sm.verify()
        return sm

    def verify(self) -> None:
        verify(self.module)
        self.module.entry()
        for op in self.module.walk():
            if op.op_name.split(".")[0] not in ("builtin", "func", "semantic"):
                raise VerifyError(f"'{op.op_name}' is not part of the semantic dialect", op.loc)


class Revision:
    """An immutable, retained snapshot of a semantic module: wire bytes + fingerprint."""

    __slots__ = ("wire", "fingerprint", "source")

    def __init__(self, wire: bytes, fingerprint: str, source: str = "") -> None:
        self.wire = wire
        self.fingerprint = fingerprint
        self.source = source

    @staticmethod
    def of(module: SemanticModule) -> Revision:
        return Revision(module.to_wire(), module.fingerprint(), module.meta.get("source", ""))

    def module(self) -> SemanticModule:
        """A fresh, independent copy of the retained module."""
        p = Product.from_wire(self.wire)
        assert isinstance(p, SemanticModule)
        return p


class ContractJob(Product):
    """Verified, shape-specialized, canonicalized semantic IR."""

    stage = "contract"


class TensorJob(Product):
    """Primitive tensor ops (``prim``): composites decomposed, broadcasts explicit."""

    stage = "tensor"


class DispatchJob(Product):
    """Dispatch regions: one kernel launch each, with iteration space and work split."""

    stage = "dispatch"


class MemoryJob(Product):
    """Dispatches with a global buffer plan (arena offsets, sizes, alignment, in-place)."""

    stage = "memory"


class KernelJob(Product):
    """Kernels with loop nests, thread mapping and launch geometry."""

    stage = "kernel"


class TargetJob(Product):
    """Target-ready kernels with their source and launch table."""

    stage = "target"

    @property
    def source(self) -> str:
        """The translation unit the target stage rendered (the module's
        ``target.source``)."""
        attr = self.module.attributes["target.source"]
        assert isinstance(attr, StringAttr)
        return attr.value
