"""The one error hierarchy of accy.

Every error a user can cause is an :class:`AccyError`. Each carries what a
person needs to act on it: a source location (``file:line:col``), a compiler
log, or the reproducer of a failing pass. ``assert`` is kept for internal
invariants only.

Example
-------
>>> from accy.choir.location import Location
>>> str(ParseError("expected ')'", Location("a.mlir", 3, 7)))
"a.mlir:3:7: error: expected ')'"
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accy.choir.location import Location


class AccyError(Exception):
    """Base class of every accy error a user can cause."""

    def __init__(self, message: str, loc: Location | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc

    def __str__(self) -> str:
        if self.loc is not None and self.loc.known:
            return f"{self.loc}: error: {self.message}"
        return self.message


class ParseError(AccyError):
    """The program text is not well-formed MLIR generic syntax."""


class VerifyError(AccyError):
    """The program is well-formed but not valid (types, shapes, structure)."""


class OptionError(AccyError):
    """An unknown stage option, or a value it does not accept."""


class WireFormatError(AccyError):
    """Bytes that do not decode to a choir module (truncated, corrupt, too large)."""


class PassFailedError(AccyError):
    """A pass failed; carries the reproducer (pipeline, pass, IR before it)."""

    def __init__(self, message: str, reproducer: Any = None, loc: Location | None = None) -> None:
        super().__init__(message, loc)
        self.reproducer = reproducer


class WorkLimitError(PassFailedError):
    """A stage ran past a work limit (op count or deadline) of its request."""


class FragmentCompileError(AccyError):
    """NVRTC or the host C compiler rejected a fragment; carries log and source path."""

    def __init__(
        self,
        message: str,
        *,
        log: str = "",
        options: tuple[str, ...] = (),
        source_path: str | None = None,
    ) -> None:
        super().__init__(message)
        self.log = log
        self.options = options
        self.source_path = source_path

    def __str__(self) -> str:
        where = f" (source: {self.source_path})" if self.source_path else ""
        first = self.log.strip().splitlines()[0] if self.log.strip() else ""
        return f"{self.message}{where}" + (f": {first}" if first else "")


class FragmentLoadError(AccyError):
    """A compiled fragment could not be loaded or launched."""


class StoreError(AccyError):
    """The artifact store could not be read or written."""


class SweepError(AccyError):
    """A sweep file is malformed."""


class FrontendError(AccyError):
    """A model from another front end (ONNX) that does not import: an unsupported op,
    dtype or opset, or a malformed graph; names the node."""
