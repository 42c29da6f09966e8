"""The store writes a chain group task holds until its compile (``WriteBehind``)."""

from __future__ import annotations

import threading

from accy.preparation.admission import WriteBehind


class Store:
    """A store that records its puts and which thread made them."""

    def __init__(self, fail: str = "") -> None:
        self.puts: list[tuple[str, bytes, str, str]] = []
        self.fail = fail

    def put(self, key: str, data: bytes, kind: str = "") -> bool:
        if key == self.fail:
            raise OSError("disk full")
        self.puts.append((key, data, kind, threading.current_thread().name))
        return True


def test_puts_are_held_until_start_and_then_made_in_order_off_the_calling_thread() -> None:
    s = Store()
    w = WriteBehind(s)
    w.write("aa" * 16, b"one", "contract")
    w.write("bb" * 16, b"two", "tensor")
    assert s.puts == []  # held: nothing contends with the stages that follow
    w.start()
    assert w.flush() == []
    assert [(k, d, kind) for k, d, kind, _ in s.puts] == [
        ("aa" * 16, b"one", "contract"), ("bb" * 16, b"two", "tensor")]
    assert all(t.startswith("accy-store-write") for *_, t in s.puts)


def test_flush_makes_the_puts_not_yet_started_and_returns_their_warnings() -> None:
    s = Store(fail="cc" * 16)
    w = WriteBehind(s)
    w.write("aa" * 16, b"one", "kernel")
    w.start()
    w.write("cc" * 16, b"two", "target")
    w.write("dd" * 16, b"three", "target")
    warnings = w.flush()
    assert len(warnings) == 1 and "disk full" in warnings[0]
    assert [k for k, *_ in s.puts] == ["aa" * 16, "dd" * 16]
    assert w.flush() == []  # nothing left over


def test_without_a_store_nothing_is_encoded_or_put() -> None:
    class Loud:
        def to_wire(self) -> bytes:
            raise AssertionError("encoded for no store")

    w = WriteBehind(None)
    w.write("aa" * 16, Loud(), "kernel")  # type: ignore[arg-type]
    w.start()
    assert w.flush() == []
