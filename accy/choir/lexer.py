"""The character-level scanner under the choir parser: positions, errors, tokens.

Example
-------
>>> lx = Lexer("  %x : f32", "a.mlir")
>>> lx.accept("%"), lx.ident(), str(lx.location())
(True, 'x', 'a.mlir:1:5')
"""

from __future__ import annotations

import re
from bisect import bisect_right

from accy.choir.location import Location
from accy.errors import ParseError

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_$.\-]*")
SUFFIX_ID = re.compile(r"[A-Za-z0-9_$.\-]+")
NUMBER = re.compile(r"[-+]?(0x[0-9A-Fa-f]+|[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?)")
_BLANK = re.compile(r"(?:[ \t\r\n]+|//[^\n]*(?:\n|$))*")
HEX_BYTE = re.compile(r"[0-9A-Fa-f]{2}")
MAX_DEPTH = 200
"""Deepest nesting of ops, regions, types, attributes and dense literals."""
MAX_INT_DIGITS = 40
"""Significant digits past which an integer literal cannot fit any choir type (2^64 has 20)."""


def int_literal(text: str) -> int | None:
    """An integer literal: decimal (leading zeros allowed, as in MLIR) or ``0x`` hex.

    ``None`` when it has more than :data:`MAX_INT_DIGITS` significant digits
    (too large for every type, and kept away from Python's int-string limit).
    """
    body = text.lstrip("-+")
    is_hex = body[:2].lower() == "0x"
    digits = (body[2:] if is_hex else body).lstrip("0")
    if len(digits) > MAX_INT_DIGITS:
        return None
    return int(text, 16) if is_hex else int(text, 10)


def shorten(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters for an error message."""
    return text if len(text) <= limit else text[:limit] + "…"


class Lexer:
    """Scans one source text; every error carries ``file:line:col``."""

    def __init__(self, text: str, file: str = "<string>") -> None:
        self.text = text
        self.file = file
        self.pos = 0
        self.depth = 0
        self._line_starts: list[int] | None = None

    # ------------------------------------------------------------------ lexing
    def location(self, pos: int | None = None) -> Location:
        """``file:line:col`` of ``pos`` (default: here), by bisection of a line-start table."""
        pos = self.pos if pos is None else pos
        starts = self._line_starts
        if starts is None:
            starts = [0] + [m.end() for m in re.finditer("\n", self.text)]
            self._line_starts = starts
        line = bisect_right(starts, pos)
        return Location(self.file, line, pos - starts[line - 1] + 1)

    def error(self, message: str, pos: int | None = None) -> ParseError:
        return ParseError(message, self.location(pos))

    def skip(self) -> None:
        """Move past whitespace and ``//`` comments."""
        self.pos = _BLANK.match(self.text, self.pos).end()  # type: ignore[union-attr]

    def peek(self, s: str) -> bool:
        self.skip()
        return self.text.startswith(s, self.pos)

    def accept(self, s: str) -> bool:
        if self.peek(s):
            self.pos += len(s)
            return True
        return False

    def expect(self, s: str, what: str | None = None) -> None:
        if not self.accept(s):
            found = self._found()
            raise self.error(f"expected {what or repr(s)}, found {found}")

    def _found(self) -> str:
        self.skip()
        if self.pos >= len(self.text):
            return "end of file"
        m = IDENT.match(self.text, self.pos) or NUMBER.match(self.text, self.pos)
        return repr(shorten(m.group(0))) if m else repr(self.text[self.pos])

    def ident(self, what: str = "identifier") -> str:
        self.skip()
        m = IDENT.match(self.text, self.pos)
        if not m:
            raise self.error(f"expected {what}, found {self._found()}")
        self.pos = m.end()
        return m.group(0)

    def peek_ident(self) -> str | None:
        self.skip()
        m = IDENT.match(self.text, self.pos)
        return m.group(0) if m else None

    def string(self) -> str:
        """A string literal; escapes are bytes (``\\C3\\A9``), the whole must be UTF-8."""
        self.skip()
        start = self.pos
        text = self.text
        if not text.startswith('"', self.pos):
            raise self.error(f"expected string literal, found {self._found()}")
        self.pos += 1
        out = bytearray()
        while True:
            if self.pos >= len(text) or text[self.pos] == "\n":
                raise self.error("unterminated string literal", start)
            c = text[self.pos]
            if c == '"':
                self.pos += 1
                try:
                    return out.decode("utf-8")
                except UnicodeDecodeError:
                    raise self.error("string literal is not valid UTF-8", start) from None
            if c == "\\":
                nxt = text[self.pos + 1:self.pos + 2]
                if nxt in ('"', "\\"):
                    out += nxt.encode()
                    self.pos += 2
                elif nxt == "n":
                    out += b"\n"
                    self.pos += 2
                elif nxt == "t":
                    out += b"\t"
                    self.pos += 2
                elif HEX_BYTE.fullmatch(text, self.pos + 1, self.pos + 3):
                    out.append(int(text[self.pos + 1:self.pos + 3], 16))
                    self.pos += 3
                else:
                    raise self.error("unknown escape in string literal")
            else:
                j = self.pos + 1
                while j < len(text) and text[j] not in '"\\\n':
                    j += 1
                out += text[self.pos:j].encode("utf-8", "surrogatepass")
                self.pos = j

    def number(self) -> str:
        self.skip()
        m = NUMBER.match(self.text, self.pos)
        if not m:
            raise self.error(f"expected a number, found {self._found()}")
        self.pos = m.end()
        return m.group(0)

    def integer(self, what: str = "integer") -> int:
        self.skip()
        start = self.pos
        text = self.number()
        if "." in text or ("e" in text.lower() and not text.lower().startswith(("0x", "-0x"))):
            raise self.error(f"expected {what}, found {shorten(text)!r}", start)
        return self.int_value(text, start)

    def int_value(self, text: str, pos: int) -> int:
        """The value of the integer literal ``text`` (at ``pos``); too many digits is an error."""
        value = int_literal(text)
        if value is None:
            raise self.error(f"integer literal too large ({len(text)} characters)", pos)
        return value

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error("nesting too deep")

    def _balanced_end(self, pos: int, open_: str, close: str) -> int:
        depth = 0
        i = pos
        while i < len(self.text):
            c = self.text[i]
            if c == '"':
                j = i + 1
                while j < len(self.text) and self.text[j] != '"':
                    j += 2 if self.text[j] == "\\" else 1
                i = j
            elif c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        raise self.error(f"unbalanced '{open_}'", pos)

