"""Work built one item ahead in a thread: order kept, the next built while the caller holds this
one (unless told to hold it back), errors raised at their item, the source closed when the
caller stops early."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from workbench.analysis.stragglers.ahead import built_ahead


def test_items_come_in_order_each_built_once() -> None:
    built: list[int] = []

    def build(x: int) -> int:
        built.append(x)
        return x * 10

    assert list(built_ahead(range(6), build)) == [0, 10, 20, 30, 40, 50]
    assert built == [0, 1, 2, 3, 4, 5]
    assert list(built_ahead([], build)) == []


def test_the_next_is_built_while_the_caller_works_unless_held_back() -> None:
    started = {i: threading.Event() for i in range(3)}

    def build(x: int) -> int:
        started[x].set()
        return x

    items = built_ahead(range(3), build, hold=lambda x: x == 1)
    assert next(items) == 0
    # the caller holds item 0: item 1 is built meanwhile (a deadline, not a fixed sleep)
    assert started[1].wait(timeout=30), "the next item was not built ahead"
    assert next(items) == 1
    # item 1 is held back: nothing is built until the caller asks for the next
    assert not started[2].is_set()
    assert next(items) == 2
    assert list(items) == []


def test_an_error_in_a_build_is_raised_at_its_item() -> None:
    def build(x: int) -> int:
        if x == 2:
            raise ValueError("item 2 does not build")
        return x

    got = []
    with pytest.raises(ValueError, match="item 2 does not build"):
        for x in built_ahead(range(5), build):
            got.append(x)
    assert got == [0, 1]


def test_stopping_early_closes_the_source() -> None:
    closed = threading.Event()

    def source() -> Iterator[int]:
        try:
            yield from range(100)
        finally:
            closed.set()

    items = built_ahead(source(), lambda x: x)
    assert next(items) == 0
    items.close()
    assert closed.is_set(), "the source's clean-up did not run"
