"""The rolling spend window behind ``sojourn_spend_window`` (issue 13): what an agent spent in
the last hour, in one-minute buckets, summed exactly and forgotten once out of the window."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.actors.ops.metrics import SpendWindow

T0 = 1_800_000_000.0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 7200, allow_nan=False), st.integers(1, 1000)),
        max_size=60,
    ),
    st.floats(0, 7200, allow_nan=False),
)
def test_the_window_sums_what_was_spent_in_the_buckets_of_the_last_hour(
    spends: list[tuple[float, int]], later: float
) -> None:
    w = SpendWindow(window=3600.0)
    for offset, cents in sorted(spends):
        w.add("a", "usd", cents / 100, T0 + offset)
    now = T0 + max([later, *(o for o, _ in spends)])
    newest = int(now // 60)
    expected = sum(c for o, c in spends if int((T0 + o) // 60) > newest - 60) / 100
    got = w.totals(now).get(("a", "usd"), 0.0)
    assert abs(got - expected) < 1e-9


def test_agents_and_units_are_kept_apart_and_nothing_is_negative() -> None:
    w = SpendWindow()
    w.add("a", "usd", 1.5, T0)
    w.add("a", "tokens", 100, T0)
    w.add("b", "usd", 0.25, T0 + 30)
    w.add("b", "usd", -5, T0 + 30)  # ignored: spending never goes down
    assert w.totals(T0 + 60) == {("a", "usd"): 1.5, ("a", "tokens"): 100, ("b", "usd"): 0.25}
    assert w.totals(T0 + 3 * 3600) == {("a", "usd"): 0, ("a", "tokens"): 0, ("b", "usd"): 0}
