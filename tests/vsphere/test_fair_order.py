"""The lane's pure serving rule (``gateway.vsphere.fair_order``): deficit round-robin by call over
per-caller FIFO queues, in table tests with plain values."""

from __future__ import annotations

import pytest

from gateway.vsphere.fair_order import FairOrder


def served(pushes: list[tuple[str, str] | tuple[str, str, float]], pops: int | None = None) -> list[str]:
    """Push every ``(caller, item[, weight])`` in order, then pop ``pops`` items (all when None)."""
    order: FairOrder[str] = FairOrder()
    for push in pushes:
        caller, item, *weight = push
        order.push(caller, item, *weight)
    out: list[str] = []
    while (pops is None or len(out) < pops) and (item := order.pop()) is not None:
        out.append(item)
    return out


@pytest.mark.parametrize(("pushes", "expected"), [
    ([], []),
    ([("a", "a1"), ("a", "a2"), ("a", "a3")], ["a1", "a2", "a3"]),  # one caller: FIFO
    # B's one call behind A's burst is served second, not fourth
    ([("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1")], ["a1", "b1", "a2", "a3"]),
    # three callers alternate call by call, each in its own order
    ([("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2"), ("c", "c1")], ["a1", "b1", "c1", "a2", "b2"]),
    # weight 3 is served three calls a turn
    ([*((("p", f"p{i}", 3.0)) for i in range(1, 5)), ("b", "b1"), ("b", "b2")],
     ["p1", "p2", "p3", "b1", "p4", "b2"]),
    # weight 0.5: one call every second turn
    ([("s", "s1", 0.5), ("s", "s2", 0.5), ("b", "b1"), ("b", "b2"), ("b", "b3")],
     ["b1", "s1", "b2", "b3", "s2"]),
], ids=["empty", "fifo-within-caller", "b-behind-burst", "round-robin", "weight-3", "weight-half"])
def test_serving_order(pushes: list[tuple[str, str] | tuple[str, str, float]], expected: list[str]) -> None:
    assert served(pushes) == expected


def test_a_caller_that_empties_rejoins_at_the_back_without_saved_credit() -> None:
    order: FairOrder[str] = FairOrder()
    order.push("a", "a1", 4.0)
    assert order.pop() == "a1"  # a leaves with 3 credits unspent
    for item in ("b1", "b2"):
        order.push("b", item)
    order.push("a", "a2", 4.0)
    order.push("a", "a3", 4.0)
    assert [order.pop() for _ in range(4)] == ["b1", "a2", "a3", "b2"]


def test_remove_takes_a_waiter_out_and_an_emptied_caller_leaves_the_ring() -> None:
    order: FairOrder[str] = FairOrder()
    for caller, item in [("a", "a1"), ("b", "b1"), ("a", "a2"), ("c", "c1")]:
        order.push(caller, item)
    assert order.remove("b", "b1") and not order.remove("b", "b1") and not order.remove("z", "x")
    assert (len(order), order.callers(), order.depth("a"), order.depth("b")) == (3, 2, 2, 0)
    assert [order.pop(), order.pop(), order.pop(), order.pop()] == ["a1", "c1", "a2", None]


def test_removing_the_head_caller_passes_the_turn() -> None:
    order: FairOrder[str] = FairOrder()
    for caller, item, weight in [("a", "a1", 2.0), ("a", "a2", 2.0), ("a", "a3", 2.0), ("b", "b1", 1.0)]:
        order.push(caller, item, weight)
    assert order.pop() == "a1"  # a's turn: one credit left
    assert order.remove("a", "a2") and order.remove("a", "a3")
    order.push("a", "a4", 2.0)  # a rejoins behind b with a fresh turn
    assert [order.pop(), order.pop()] == ["b1", "a4"]


def test_equal_callers_get_equal_shares_of_any_prefix() -> None:
    pushes = [(f"agent{n}", f"agent{n}-{i}") for i in range(50) for n in range(8)]
    first = served(list(pushes), pops=200)
    counts = {f"agent{n}": sum(1 for item in first if item.startswith(f"agent{n}-")) for n in range(8)}
    assert set(counts.values()) == {25}


def test_weights_give_proportional_shares() -> None:
    pushes: list[tuple[str, str] | tuple[str, str, float]] = [
        *((("person", f"p{i}", 3.0)) for i in range(100)), *((("batch", f"b{i}", 1.0)) for i in range(100))]
    first = served(pushes, pops=80)
    assert (sum(i.startswith("p") for i in first), sum(i.startswith("b") for i in first)) == (60, 20)


def test_drain_returns_everything_and_leaves_nothing() -> None:
    order: FairOrder[str] = FairOrder()
    for caller, item in [("a", "a1"), ("b", "b1"), ("a", "a2")]:
        order.push(caller, item)
    assert order.drain() == ["a1", "a2", "b1"]
    assert (len(order), order.pop()) == (0, None)


def test_a_weight_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        FairOrder[str]().push("a", "a1", 0.0)
