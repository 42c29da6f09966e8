"""Source locations: ``file:line:col``, carried by ops, values and errors."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Location:
    """A position in a source file (1-based line and column)."""

    file: str = ""
    """The file name as given on the command line (or ``<string>``)."""
    line: int = 0
    """1-based line; 0 when unknown."""
    col: int = 0
    """1-based column; 0 when unknown."""

    @property
    def known(self) -> bool:
        return self.line > 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


UNKNOWN = Location()
