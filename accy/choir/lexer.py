"""The character-level scanner under the choir parser: positions, errors, tokens.

Example
-------
>>> lx = Lexer("  %x : f32", "a.mlir")
>>> lx.accept("%"), lx.ident(), str(lx.location())
(True, 'x', 'a.mlir:1:5')
"""

from __future__ import annotations

import re

from accy.choir.location import Location
from accy.errors import ParseError

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_$.\-]*")
SUFFIX_ID = re.compile(r"[A-Za-z0-9_$.\-]+")
NUMBER = re.compile(r"[-+]?(0x[0-9A-Fa-f]+|[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?)")
MAX_DEPTH = 200


def int_literal(text: str) -> int:
    """An integer literal: decimal (leading zeros allowed, as in MLIR) or ``0x`` hex."""
    return int(text, 16) if text.lower().lstrip("-+").startswith("0x") else int(text, 10)


class Lexer:
    """Scans one source text; every error carries ``file:line:col``."""

    def __init__(self, text: str, file: str = "<string>") -> None:
        self.text = text
        self.file = file
        self.pos = 0
        self.depth = 0

    # ------------------------------------------------------------------ lexing
    def location(self, pos: int | None = None) -> Location:
        pos = self.pos if pos is None else pos
        line = self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return Location(self.file, line, col)

    def error(self, message: str, pos: int | None = None) -> ParseError:
        return ParseError(message, self.location(pos))

    def skip(self) -> None:
        text, n = self.text, len(self.text)
        while self.pos < n:
            c = text[self.pos]
            if c in " \t\r\n":
                self.pos += 1
            elif text.startswith("//", self.pos):
                nl = text.find("\n", self.pos)
                self.pos = n if nl < 0 else nl + 1
            else:
                break

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
        return repr(m.group(0)) if m else repr(self.text[self.pos])

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
        self.skip()
        start = self.pos
        if not self.text.startswith('"', self.pos):
            raise self.error(f"expected string literal, found {self._found()}")
        self.pos += 1
        out = []
        while True:
            if self.pos >= len(self.text) or self.text[self.pos] == "\n":
                raise self.error("unterminated string literal", start)
            c = self.text[self.pos]
            if c == '"':
                self.pos += 1
                return "".join(out)
            if c == "\\":
                nxt = self.text[self.pos + 1:self.pos + 2]
                if nxt in ('"', "\\"):
                    out.append(nxt)
                    self.pos += 2
                elif nxt == "n":
                    out.append("\n")
                    self.pos += 2
                elif nxt == "t":
                    out.append("\t")
                    self.pos += 2
                elif re.fullmatch(r"[0-9A-Fa-f]{2}", self.text[self.pos + 1:self.pos + 3]):
                    out.append(chr(int(self.text[self.pos + 1:self.pos + 3], 16)))
                    self.pos += 3
                else:
                    raise self.error("unknown escape in string literal")
            else:
                out.append(c)
                self.pos += 1

    def number(self) -> str:
        self.skip()
        m = NUMBER.match(self.text, self.pos)
        if not m:
            raise self.error(f"expected a number, found {self._found()}")
        self.pos = m.end()
        return m.group(0)

    def integer(self, what: str = "integer") -> int:
        start = self.pos
        text = self.number()
        if "." in text or ("e" in text.lower() and not text.lower().startswith(("0x", "-0x"))):
            raise self.error(f"expected {what}, found {text!r}", start)
        return int_literal(text)

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

