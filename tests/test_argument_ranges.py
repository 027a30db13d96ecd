"""Every numeric argument is checked for range: a forged feed position, a huge timeout, a
version or limit beyond 64 bits is an ``InvalidEvent`` naming the argument (never an
``OverflowError`` or the driver's "bigint out of range"), and one line from the CLI."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from cli_helpers import one_error_line, run_cli
from eventstore import EventStore, InvalidEvent

pytestmark = pytest.mark.twins

BIG = 2**70
FORGED = [
    "ffffffffffffffff.ffffffff.ffffffff",  # every field beyond its column
    "7fffffffffffffff.00000001.00000001",  # a transaction id at the very top of bigint
    "0000000000000001.ffffffff.00000001",  # a session key beyond 32 bits signed
    "0000000000000001.00000001.ffffffff",  # a version beyond 32 bits signed
]


def _first(store: Any, name: str, *args: Any, **kwargs: Any) -> list[Any]:
    """The first event of a follower (``feed``, ``follow``) of either twin."""
    if hasattr(store, "take"):  # the async twin's adapter
        return list(store.take(name, 1, *args, **kwargs))
    return list(itertools.islice(getattr(store, name)(*args, **kwargs), 1))


CALLS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "feed idle_timeout": ("idle_timeout", lambda s: _first(s, "feed", idle_timeout=1e300)),
    "follow idle_timeout": ("idle_timeout", lambda s: _first(s, "follow", "s", idle_timeout=1e12)),
    "recover stale_after": ("stale_after", lambda s: s.recover("s", stale_after=1e300)),
    "turn max_delay": ("max_delay", lambda s: s.turn("s", {"type": "send", "id": "u", "text": "x"}, max_delay=1e300).__enter__()),
    "history after": ("after", lambda s: list(s.history("s", after=BIG))),
    "history limit": ("limit", lambda s: list(s.history("s", limit=BIG))),
    "follow after": ("after", lambda s: _first(s, "follow", "s", after=BIG, idle_timeout=0)),
    "load version": ("version", lambda s: s.load("s", version=-BIG)),
    "append expected_version": ("expected_version", lambda s: s.append("s", [{"type": "stop"}], expected_version=BIG)),
    "branch at": ("at", lambda s: s.branch("s", at=BIG)),
    "compact upto": ("upto", lambda s: s.compact("s", upto=BIG)),
}


@pytest.mark.parametrize("position", FORGED)
def test_a_forged_feed_position_is_invalid(store: EventStore, position: str) -> None:
    store.append("s", [{"type": "stop"}])
    with pytest.raises(InvalidEvent) as info:
        _first(store, "feed", after=position, idle_timeout=0)
    assert info.value.field == "after"


@pytest.mark.parametrize("name", sorted(CALLS))
def test_out_of_range_numbers_are_invalid(store: EventStore, name: str) -> None:
    store.append("s", [{"type": "send", "id": "u0", "text": "hi"}, {"type": "part", "part": {"type": "finish"}}])
    field, call = CALLS[name]
    with pytest.raises(InvalidEvent) as info:
        call(store)
    assert info.value.field == field
    assert store.head("s") == 2


def test_the_largest_accepted_values_still_work(store: EventStore) -> None:
    store.append("s", [{"type": "stop"}])
    assert _first(store, "feed", after=None, idle_timeout=1e9)
    assert store.recover("s", stale_after=1e9) is None
    assert list(store.history("s", limit=2**63 - 1))


def test_the_cli_says_one_line(db_url: str) -> None:
    run_cli("migrate", db=db_url)
    run_cli("append", "s", "-", db=db_url, input='{"type": "stop"}')
    for args in (
        ("feed", "--after", FORGED[0]),
        ("feed", "--after", FORGED[1]),
        ("recover", "s", "--stale-after", "1e300"),
    ):
        line = one_error_line(run_cli(*args, db=db_url, code=1))
        assert "out of range" in line or "seconds" in line, line
