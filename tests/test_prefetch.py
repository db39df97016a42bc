"""``data/prefetch.py``: items made one ahead by a background thread, in order, their errors raised in place, the
thread stopped when the iterator is closed."""

from __future__ import annotations

import threading

import pytest

from deepmetric.data.prefetch import prefetched


def test_the_items_come_in_order_and_each_is_made_once():
    made = []

    def items():
        for i in range(20):
            made.append(i)
            yield i

    assert list(prefetched(items(), depth=2)) == list(range(20)) and made == list(range(20))


def test_an_error_of_the_items_is_raised_after_the_items_made_before_it():
    def items():
        yield 1
        yield 2
        raise ValueError("image 7 cannot be read")

    seen = []
    with pytest.raises(ValueError, match="image 7 cannot be read"):
        for item in prefetched(items()):
            seen.append(item)
    assert seen == [1, 2]


def test_closing_the_iterator_stops_the_thread_and_makes_at_most_depth_more():
    made = []

    def endless():
        i = 0
        while True:
            made.append(i)
            yield i
            i += 1

    before = threading.active_count()
    iterator = prefetched(endless(), depth=1)
    assert [next(iterator) for _ in range(3)] == [0, 1, 2]
    iterator.close()
    assert threading.active_count() == before
    assert len(made) <= 3 + 2  # the one queued, and the one the thread held when it was stopped


def test_the_items_are_made_while_the_caller_waits():
    """Item 2 is made while the caller holds item 1 (the thread does not wait to be asked)."""
    caller_has_item_1, item_2_made = threading.Event(), threading.Event()

    def items():
        yield 1
        assert caller_has_item_1.wait(5)
        item_2_made.set()
        yield 2

    iterator = prefetched(items())
    assert next(iterator) == 1
    caller_has_item_1.set()
    assert item_2_made.wait(5)
    assert next(iterator) == 2
    iterator.close()


def test_by_default_one_item_waits_made_and_a_slow_caller_still_gets_every_item():
    """With the caller holding item 0 the thread makes item 1 (queued) and item 2 (held until there is room), and no
    more; it keeps trying to hand item 2 over however long the caller takes (several of its waits here)."""
    import time

    from deepmetric.data import prefetch

    made, third_made = [], threading.Event()

    def items():
        for i in range(6):
            made.append(i)
            if i == 2:
                third_made.set()
            yield i

    iterator = prefetched(items())
    assert next(iterator) == 0
    assert third_made.wait(5)
    time.sleep(4 * prefetch._POLL_SECONDS)
    assert made == [0, 1, 2]
    assert list(iterator) == [1, 2, 3, 4, 5]


def test_closing_while_the_thread_waits_for_room_stops_it():
    from deepmetric.data import prefetch

    held = threading.Event()

    def endless():
        i = 0
        while True:
            if i == 2:
                held.set()  # item 1 queued, the thread about to wait for room for item 2
            yield i
            i += 1

    before = threading.active_count()
    iterator = prefetched(endless())
    assert next(iterator) == 0 and held.wait(5)
    threading.Event().wait(2 * prefetch._POLL_SECONDS)
    iterator.close()
    assert threading.active_count() == before
