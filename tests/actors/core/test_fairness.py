"""The weighted fair queue between fairness keys (``actors/core/fairness.py``, decision 0049):
FIFO within a key, nothing lost or duplicated, shares by weight over every prefix while keys
are backlogged, a late key served within as many pops as there are keys, idle keys forgotten."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.actors.core.fairness import FairQueue

KEYS = [f"k{i}" for i in range(8)]

weights = st.integers(1, 12)
key_weights = st.dictionaries(st.sampled_from(KEYS), weights, min_size=1, max_size=6)
# a mix of pushes (key, weight) and pops (None)
ops = st.lists(st.one_of(st.tuples(st.sampled_from(KEYS[:5]), weights), st.none()), max_size=300)


def test_empty_queue_raises_index_error() -> None:
    q: FairQueue[int] = FairQueue()
    assert len(q) == 0 and q.keys() == 0
    with pytest.raises(IndexError):
        q.pop()
    with pytest.raises(IndexError):
        q.peek_key()


@pytest.mark.parametrize("weight", [0, -1, True, 1.5, "2"])
def test_a_weight_is_an_int_of_at_least_one(weight: object) -> None:
    q: FairQueue[int] = FairQueue()
    with pytest.raises(ValueError):
        q.push(1, "a", weight)  # type: ignore[arg-type]
    assert len(q) == 0


@settings(derandomize=True, max_examples=300, deadline=None)
@given(ops)
def test_fifo_per_key_nothing_lost_or_duplicated(plan: list[tuple[str, int] | None]) -> None:
    q: FairQueue[tuple[str, int]] = FairQueue()
    pushed: dict[str, list[tuple[str, int]]] = {}
    popped: list[tuple[str, int]] = []
    n = 0
    for op in plan:
        if op is None:
            if len(q):
                key = q.peek_key()
                item = q.pop()
                assert item[0] == key  # peek_key names the key pop serves
                popped.append(item)
        else:
            key, weight = op
            item = (key, n)
            n += 1
            q.push(item, key, weight)
            pushed.setdefault(key, []).append(item)
        assert q.keys() == len(
            {k for k, items in pushed.items() if len(items) > _served(popped, k)}
        )
    while len(q):
        popped.append(q.pop())
    assert q.keys() == 0
    assert sorted(popped) == sorted(i for items in pushed.values() for i in items)
    for key, items in pushed.items():
        assert [i for i in popped if i[0] == key] == items  # FIFO within a key


def _served(popped: list[tuple[str, int]], key: str) -> int:
    return sum(1 for k, _ in popped if k == key)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(key_weights, st.integers(1, 60))
def test_backlogged_keys_share_by_weight_over_every_prefix(ws: dict[str, int], depth: int) -> None:
    """Every key holds ``depth * weight`` items, all pushed first (key by key, so arrival
    order favours nobody in particular); over every prefix of pops while all are backlogged,
    each pair's service per unit of weight differs by at most one item of each (the start-time
    fair queueing bound), and a key's count is within its weight granularity of its share."""
    q: FairQueue[str] = FairQueue()
    for key, w in ws.items():
        for _ in range(depth * w):
            q.push(key, key, w)
    total_w = sum(ws.values())
    count: Counter[str] = Counter()
    for p in range(1, depth * total_w + 1):
        count[q.pop()] += 1
        if any(count[k] == depth * w for k, w in ws.items()):
            break  # a key ran dry: no longer all backlogged
        for a, wa in ws.items():
            share = p * wa / total_w
            assert -len(ws) * wa / total_w - 1e-9 <= count[a] - share <= 1 + 1e-9
            for b, wb in ws.items():
                assert abs(count[a] / wa - count[b] / wb) <= 1 / wa + 1 / wb + 1e-9
        if len(set(ws.values())) == 1:  # equal weights: within one item of an equal share
            assert max(count[k] for k in ws) - min(count[k] for k in ws) <= 1


def test_weight_three_gets_three_times_the_share() -> None:
    q: FairQueue[str] = FairQueue()
    for _ in range(300):
        q.push("a", "a", 3)
        q.push("b", "b", 1)
    first = Counter(q.pop() for _ in range(200))
    assert first == {"a": 150, "b": 50}


@settings(derandomize=True, max_examples=300, deadline=None)
@given(key_weights, st.integers(0, 40), weights, st.integers(1, 5))
def test_a_late_key_is_served_within_as_many_pops_as_keys(
    ws: dict[str, int], before: int, late_weight: int, depth: int
) -> None:
    """Whatever the weights (the late key's too), and however far the others have got."""
    q: FairQueue[str] = FairQueue()
    for _ in range(depth * 50):
        for key, w in ws.items():
            q.push(key, key, w)
    for _ in range(min(before, len(q) - 1)):
        q.pop()
    keys_now = q.keys() + 1
    q.push("late", "late", late_weight)
    for _ in range(keys_now):
        if q.pop() == "late":
            break
    else:
        raise AssertionError(f"the late key waited more than {keys_now} pops")


def test_an_idle_key_gets_no_credit_and_is_forgotten() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("b", "b")
    assert q.pop() == "b"
    assert q.keys() == 0  # b forgotten
    for _ in range(100):
        q.push("a", "a")
    for _ in range(50):
        q.pop()
    for _ in range(20):
        q.push("b", "b")
    # b, idle while a was served, comes back at the current virtual time: alternates with a,
    # not 50 b's in a row for the time it was idle
    assert [q.pop() for _ in range(6)] in (["a", "b"] * 3, ["b", "a"] * 3)


def test_memory_is_items_plus_backlogged_keys() -> None:
    q: FairQueue[int] = FairQueue()
    for i in range(10_000):
        q.push(i, f"key{i}")
        assert q.pop() == i
    assert len(q) == 0 and q.keys() == 0
    assert not q._keys and not q._heap
