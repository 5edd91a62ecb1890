"""The shared rate limits' pure core (``actors/core/ratelimit.py``, decision 0046) and the run
machine's turns for a step with a limit: slots evenly spaced and in order, never more than the
rate in any window, never before a block's end, tokens charged from usage; a grant overtaken by
a block or missed asks again; a slot far off is recorded and parks the run."""

from __future__ import annotations

import itertools
import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sojourn.actors.core.actions import Attempt, AwaitSlot, Reserve, RunCancelledInterrupt
from sojourn.actors.core.limits import Limits
from sojourn.actors.core.machine import Machine
from sojourn.actors.core.ratelimit import (
    LIMIT_GRACE,
    LIMIT_SLEEP_MAX,
    Grant,
    block,
    charge,
    declare,
    reserve,
    unblock,
    usable,
)
from sojourn.actors.core.state import fold
from sojourn.schemas.events import CancelRequested, RunStarted, StepStarted, StepThrottled
from sojourn.schemas.limits import NS, Limit, LimitRecord, parse_rate

T0 = 1_800_000_000.0

rates = st.builds(
    lambda n, unit: f"{n}/{unit}",
    st.integers(1, 5000),
    st.sampled_from(["s", "min", "h", "10s"]),
)
batches = st.lists(
    st.tuples(st.floats(0, 5, allow_nan=False), st.integers(1, 40)), min_size=1, max_size=12
)


def record(limit: Limit) -> LimitRecord:
    return LimitRecord(name="api", limit=limit)


def take(rec: LimitRecord, plan: list[tuple[float, int]]) -> tuple[LimitRecord, list[float]]:
    """Reserve each batch of ``plan`` (seconds after the last, how many), in order."""
    now, slots = T0, []
    for gap, count in plan:
        now += gap
        rec, grants = reserve(rec, now, count)
        assert all(g.slot >= now - 1e-6 for g in grants)  # never in the past
        slots += [g.slot for g in grants]
    return rec, slots


def most_within(slots: list[float], window: float) -> int:
    ts, best, j = sorted(slots), 0, 0
    for i, t in enumerate(ts):
        while ts[j] <= t - window + 1e-6:
            j += 1
        best = max(best, i - j + 1)
    return best


@given(rates, batches)
def test_slots_are_in_order_evenly_spaced_and_never_exceed_the_rate_in_any_window(
    rate: str, plan: list[tuple[float, int]]
) -> None:
    limit = Limit(requests=rate)
    r = parse_rate(rate)
    rec, slots = take(record(limit), plan)
    assert slots == sorted(slots)  # first asked, first served
    step = r.interval_ns / NS
    assert all(b - a >= step - 1e-6 for a, b in itertools.pairwise(slots))
    period = r.period_ns / NS
    assert most_within(slots, period) <= r.amount
    assert rec.granted == sum(n for _, n in plan)


@given(st.integers(2, 20), batches)
def test_a_burst_lets_that_many_start_at_once_and_no_more(
    burst: int, plan: list[tuple[float, int]]
) -> None:
    limit = Limit(requests="10/s", burst=burst)
    _, slots = take(record(limit), plan)
    for window in (0.05, 1.0, 3.0):
        assert most_within(slots, window) <= math.ceil(window / 0.1) + burst - 1


@given(batches, st.floats(0.5, 60, allow_nan=False))
def test_a_block_moves_every_new_slot_past_it_and_stales_the_grants_it_covers(
    plan: list[tuple[float, int]], seconds: float
) -> None:
    rec, _ = take(record(Limit(requests="100/s")), plan)
    before = reserve(rec, T0, 50)[1]
    blocked = block(rec, T0 + seconds)
    assert blocked.epoch == rec.epoch + 1 and blocked.blocks == rec.blocks + 1
    _, after = reserve(blocked, T0, 20)
    assert all(g.slot >= T0 + seconds - 1e-6 for g in after)
    for g in before:  # granted before the block: those in it ask again, the others hold
        assert usable(g, blocked, g.slot) is (g.slot * NS >= blocked.blocked_until)
    assert all(usable(g, blocked, g.slot) for g in after)
    lifted = unblock(blocked)
    assert lifted.blocked_until == 0 and lifted.epoch == blocked.epoch


def test_a_grant_missed_by_more_than_the_grace_asks_again() -> None:
    g = Grant("api", T0, 0)
    assert usable(g, None, T0 - 10)  # ahead: wait for it
    assert usable(g, None, T0 + LIMIT_GRACE)
    assert not usable(g, None, T0 + LIMIT_GRACE + 0.01)


@given(st.integers(1, 10_000_000))
def test_tokens_charged_from_usage_hold_back_requests_until_paid_off(tokens: int) -> None:
    limit = Limit(tokens="60k/min")  # 1,000 tokens a second, a bucket of 60,000
    rec = charge(record(limit), T0, tokens)
    (g,) = reserve(rec, T0, 1)[1]
    over = max(0, tokens - 59_999)  # a bucket of a period's tokens, less the one being paid
    assert g.slot == pytest.approx(T0 + over / 1000, abs=1e-3)


def test_a_declaration_creates_a_limit_and_never_overrules_an_operator() -> None:
    declared = declare(None, "api", Limit(requests="10/s"), by="w1", declared=True, now=T0)
    assert declared is not None and declared.declared and declared.set_by == "w1"
    # another worker declaring another rate changes nothing
    assert declare(declared, "api", Limit(requests="1/s"), by="w2", declared=True, now=T0) is None
    ops = declare(declared, "api", Limit(requests="5/s"), by="ops", declared=False, now=T0)
    assert ops is not None and not ops.declared and ops.limit == Limit(requests="5/s")
    assert ops.requests_tat == declared.requests_tat  # the slots granted keep their times
    assert declare(ops, "api", Limit(requests="9/s"), by="w1", declared=True, now=T0) is None


@given(st.text(max_size=30))
def test_parsing_a_rate_is_total(text: str) -> None:
    try:
        r = parse_rate(text)
    except ValueError:
        return
    assert 1 <= r.amount and r.period_ns > 0


@pytest.mark.parametrize(
    ("text", "amount", "seconds"),
    [
        ("500/min", 500, 60),
        ("200k/min", 200_000, 60),
        ("10/s", 10, 1),
        ("30/10s", 30, 10),
        ("1.5M/day", 1_500_000, 86400),
        ("7 / hour", 7, 3600),
    ],
)
def test_rates(text: str, amount: int, seconds: int) -> None:
    assert parse_rate(text) == parse_rate(text)
    r = parse_rate(text)
    assert (r.amount, r.period_ns) == (amount, seconds * NS)


@pytest.mark.parametrize("text", ["", "0/min", "-1/s", "5/fortnight", "1e9/s", "2.5/s", "x"])
def test_bad_rates(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(text)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"requests": text}, Limit)


# --- the run machine's turns for a step with a limit ------------------------------------------


def _machine(*events: object, rec: LimitRecord | None = None) -> Machine:
    started = RunStarted(run_id="r", agent="a", input=msgspec.Raw(b"null"), at=T0)
    state = fold([started, *events])  # type: ignore[list-item]
    return Machine(state, limit_records=lambda name: rec)


def test_a_new_step_asks_for_a_slot_then_records_a_far_one_and_parks() -> None:
    m = _machine()
    turn = m.step("call", "retry", None, limit="api")
    assert not isinstance(turn, type(None))
    action = turn.next(T0)  # type: ignore[union-attr]
    assert action == Reserve(0, "api")
    turn.granted(Grant("api", T0 + 30, 2), T0)  # type: ignore[union-attr]
    (throttled,) = m.pending
    assert isinstance(throttled, StepThrottled)
    assert (throttled.slot, throttled.epoch, throttled.limit) == (T0 + 30, 2, "api")
    assert turn.next(T0) == AwaitSlot(0, T0 + 30, park=True)  # type: ignore[union-attr]


def test_a_near_slot_is_waited_out_unrecorded_then_the_attempt_names_it() -> None:
    m = _machine()
    turn = m.step("call", "retry", None, limit="api")
    turn.next(T0)  # type: ignore[union-attr]
    slot = T0 + LIMIT_SLEEP_MAX / 2
    turn.granted(Grant("api", slot, 0), T0)  # type: ignore[union-attr]
    assert m.pending == []
    assert turn.next(T0) == AwaitSlot(0, slot, park=False)  # type: ignore[union-attr]
    action = turn.next(slot)  # type: ignore[union-attr]
    assert isinstance(action, Attempt)
    assert (action.started.limit, action.started.slot) == ("api", slot)


def test_a_recorded_slot_is_used_on_replay_unless_a_block_or_lateness_overtook_it() -> None:
    throttled = StepThrottled(position=0, name="call", limit="api", slot=T0 + 30, epoch=1, at=T0)
    # due, nothing changed: the attempt starts on the recorded slot
    turn = _machine(throttled).step("call", "retry", None, limit="api")
    action = turn.next(T0 + 30.1)  # type: ignore[union-attr]
    assert isinstance(action, Attempt) and action.started.slot == T0 + 30
    # woken early: park again on it
    turn = _machine(throttled).step("call", "retry", None, limit="api")
    assert turn.next(T0 + 1) == AwaitSlot(0, T0 + 30, park=True)  # type: ignore[union-attr]
    # a 429's block after the grant covers its slot: ask again
    rec = block(record(Limit(requests="1/s")), T0 + 60)
    rec = msgspec.structs.replace(rec, epoch=2)
    turn = _machine(throttled, rec=rec).step("call", "retry", None, limit="api")
    assert turn.next(T0 + 30.1) == Reserve(0, "api")  # type: ignore[union-attr]
    # missed by more than the grace (its worker died, nobody woke it): ask again
    turn = _machine(throttled).step("call", "retry", None, limit="api")
    late = T0 + 30 + LIMIT_GRACE + 1
    assert turn.next(late) == Reserve(0, "api")  # type: ignore[union-attr]


def test_a_step_cut_off_mid_attempt_still_counts_toward_the_crash_loop_across_a_slot() -> None:
    started = StepStarted(position=0, name="call", attempt=1, limit="api", slot=T0, at=T0)
    throttled = StepThrottled(
        position=0, name="call", attempt=2, limit="api", slot=T0 + 5, epoch=0, at=T0 + 1
    )
    again = StepStarted(position=0, name="call", attempt=2, limit="api", slot=T0 + 5, at=T0 + 5)
    state = fold(
        [RunStarted(run_id="r", agent="a", input=msgspec.Raw(b"null"), at=T0), started, throttled]
    )
    assert state.ops[0].status == "throttled" and state.ops[0].interrupted == 1
    assert state.waiting_on == ("limit:api",) and state.deadline == T0 + 5
    state = fold([again], state)
    assert state.ops[0].status == "started" and state.ops[0].interrupted == 1
    assert state.waiting_on == () and state.status == "running"


def test_a_cancel_stops_the_code_of_a_compensating_agent_at_the_step_waiting_for_its_slot() -> None:
    """The code stops at the step (it never ran, it is not run for the cancel); the
    compensation's operations start after its position, which history holds."""
    throttled = StepThrottled(position=0, name="call", limit="api", slot=T0 + 30, epoch=0, at=T0)
    started = RunStarted(run_id="r", agent="a", input=msgspec.Raw(b"null"), at=T0)
    state = fold([started, throttled, CancelRequested(reason="stop", at=T0 + 1)])
    m = Machine(state, limits=Limits(compensates=True))
    with pytest.raises(RunCancelledInterrupt):
        m.step("call", "retry", None, limit="api")
    assert m.stopped == (0, 1)
